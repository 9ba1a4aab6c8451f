"""What ran, whichever command ran it: a record each stage writes when it finishes.

``dvc.lock`` records only what ``dvc repro`` (or ``rollscale study``, or the
served deployment, which run it) reproduced; a stage run with ``rollscale run``
or ``python -m flows`` leaves it as it was. So every stage, however started,
writes ``artifacts/<stage>/.stage.record.json`` when it finishes: which command
started it, when it started and ended, and the fingerprint of what it ran on
(a hash of its params sections as its params file had them, and one of the
code and data files ``dvc.yaml`` lists as its deps, taken at start), plus when
each upstream stage it read had last finished. ``rollscale status`` compares
that record with the project now: a stage that DVC does not know as up to date
but whose record matches is done, and dvc.lock is behind it (``dvc commit``
records it there without running it again). ``.stage.*`` files are
``.dvcignore``d: bookkeeping, not part of a stage's output.

Plain functions over files; no Prefect or DVC.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from rollscale.files import sha256_file, write_json_atomic

RECORD = ".stage.record.json"
# how the process that runs a stage was started: set by `rollscale run`, `rollscale study` and the
# served deployment for the stage processes they start (DVC sets DVC_STAGE for the ones it runs)
COMMAND_ENV = "ROLLSCALE_COMMAND"


def started_by(stage: str, env: Mapping[str, str] | None = None) -> str:
    """The command that started this stage's process, as a person would type it."""
    env = os.environ if env is None else env
    if env.get(COMMAND_ENV):
        return env[COMMAND_ENV]
    return f"dvc repro {stage}" if env.get("DVC_STAGE") else f"python -m flows {stage}"


def resume_command(stage: str, env: Mapping[str, str] | None = None) -> str:
    """What to run to go on after an interrupt: the command that started the stage, but
    ``rollscale study`` for a run of the served deployment (serving again only waits for its
    schedule)."""
    command = started_by(stage, env)
    return "rollscale study" if command.startswith("rollscale") and " serve" in command else command


def _param(raw: Any, dotted: str) -> Any:
    for key in dotted.split("."):
        raw = raw.get(key) if isinstance(raw, dict) else None
    return raw


def params_hash(params_file: str | os.PathLike[str], keys: tuple[str, ...]) -> str:
    """Hash of the values of ``keys`` (dotted, as dvc.yaml lists a stage's params) in the YAML file
    (raw values, as DVC compares them); a missing key counts as null."""
    raw = yaml.safe_load(Path(params_file).read_text()) or {}
    values = {key: _param(raw, key) for key in keys}
    return hashlib.sha256(json.dumps(values, sort_keys=True, default=str).encode()).hexdigest()[:16]


def code_files(root: Path, deps: tuple[str, ...]) -> list[Path]:
    """The files of a stage's deps that are not stage outputs (code and data), sorted."""
    files: set[Path] = set()
    for dep in deps:
        if Path(dep).parts[:1] == ("artifacts",):
            continue  # an upstream stage's output: its own record says when it last changed
        path = root / dep
        if path.is_dir():
            files.update(p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
        elif path.exists():
            files.add(path)
    return sorted(files)


def code_hash(root: str | os.PathLike[str], deps: tuple[str, ...]) -> str:
    """Hash of the paths and contents of the stage's code and data deps (:func:`code_files`)."""
    root = Path(root)
    h = hashlib.sha256()
    for path in code_files(root, deps):
        h.update(f"{path.relative_to(root)}\0{sha256_file(path)}\n".encode())
    return h.hexdigest()[:16]


def read_record(folder: str | os.PathLike[str]) -> dict | None:
    """The stage folder's record, or None (missing or unreadable)."""
    try:
        data = json.loads((Path(folder) / RECORD).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def fingerprint(root: str | os.PathLike[str], artifacts: str | os.PathLike[str], params_file: str | os.PathLike[str],
                deps: tuple[str, ...], params: tuple[str, ...], upstream: list[str]) -> dict:
    """What a stage runs on: params and code hashes, and when each upstream stage last finished."""
    ups = {u: (read_record(Path(artifacts) / u) or {}).get("ended_at") for u in upstream}
    return {"params_hash": params_hash(params_file, params), "code_hash": code_hash(root, deps), "upstream": ups}


def write_record(folder: str | os.PathLike[str], stage: str, started: dict, fingerprint_: dict,
                 ended_at: str, command: str) -> dict:
    """Record a finished run of ``stage`` (``started``: the stage lock's run info)."""
    record = {"stage": stage, "status": "finished", "command": command, "started_at": started.get("started_at"),
              "ended_at": ended_at, "pid": started.get("pid"), "host": started.get("host"), **fingerprint_}
    write_json_atomic(record, Path(folder) / RECORD)
    return record


def record_differences(record: dict, now: dict) -> list[str]:
    """How the project now (:func:`fingerprint`) differs from what the recorded run ran on."""
    out = []
    if record.get("params_hash") != now["params_hash"]:
        out.append("params changed")
    if record.get("code_hash") != now["code_hash"]:
        out.append("code or data changed")
    for up, ended in now["upstream"].items():
        if (record.get("upstream") or {}).get(up) != ended:
            out.append(f"{up} ran again")
    return out
