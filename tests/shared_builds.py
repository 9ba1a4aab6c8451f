"""Test fixtures built once per session and shared by the pytest-xdist workers."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def built_once(tmp_path_factory, name: str, build) -> Path:
    """``build(folder)`` once per test session, by whichever pytest-xdist worker asks first (the others
    wait on a file lock and reuse it): a study built by every worker cost 46 s more per worker. Treat it
    as read-only: copy it before changing anything."""
    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # the session's folder
    root, done = shared / name, shared / f"{name}.built"
    with FileLock(str(shared / f"{name}.lock")):
        if not done.exists():
            shutil.rmtree(root, ignore_errors=True)
            root.mkdir()
            build(root)
            done.touch()
    return root


def copy_tracked(dest: Path, skip: tuple[str, ...] = ()) -> Path:
    """The repository's tracked files (``git ls-files``, but those under ``skip``) copied to ``dest`` as a clone
    has them, each module with its compiled bytecode where `make test` compiled it: the stages run from the copy,
    and where PYTHONDONTWRITEBYTECODE is set each of their processes compiled rollscale/, tasks/ and flows/ again
    (2.8 s of a stage's 7.9 s start, 2026-11-27). The timestamps are kept, so Python takes the bytecode as
    current."""
    tag = sys.implementation.cache_tag
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    for f in files:
        if not (REPO / f).is_file() or f.startswith(skip):
            continue
        (dest / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / f, dest / f)
        if f.endswith(".py") and (pyc := (REPO / f).parent / "__pycache__" / f"{Path(f).stem}.{tag}.pyc").is_file():
            (dest / f).parent.joinpath("__pycache__").mkdir(exist_ok=True)
            shutil.copy2(pyc, (dest / f).parent / "__pycache__" / pyc.name)
    return dest
