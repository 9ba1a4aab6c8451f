"""A study folder of the user's own: what ``rollscale init`` writes there besides params.yaml.

A clone of rollscale is a study folder with the code in it (flows/, tasks/, rollscale/ listed
file by file as each stage's deps). A folder of the user's own holds only params.yaml, the
data, ``dvc.yaml`` (the packaged template, :data:`rollscale.pipeline.stages.deps.PROJECT_TEMPLATE`),
DVC's ``.dvc/`` and ``.dvcignore``; its stages run the installed code (``python -m flows <stage>``)
and each watches a stamp of that code, ``.rollscale/code/<stage>``: the hash of the files the
stage runs (:func:`rollscale.pipeline.stages.deps.code_deps` over the installed packages). The
stamps are refreshed before DVC is asked what is stale, so upgrading rollscale reruns exactly the
stages whose code changed, as in a clone.

Plain functions over files.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from pathlib import Path

from rollscale.files import write_text_atomic
from rollscale.pipeline.stages.deps import PROJECT_TEMPLATE, STAMP_FOLDER, code_deps
from rollscale.pipeline.stages.record import code_hash
from rollscale.pipeline.stages.specs import load_stage_specs

__all__ = ["DVCIGNORE", "code_root", "init_project", "is_user_project", "refresh_code_stamps", "write_code_stamps"]

# what DVC must not hash in a stage's outputs: the stage lock and run records, atomic writes'
# temporary files (the same patterns as the repository's .dvcignore; tests/test_project.py)
DVCIGNORE = """\
# the stage lock and run records: bookkeeping of a run, not part of a stage's output
.stage.*
# temporary files of atomic writes
.*.tmp
"""


def code_root() -> Path:
    """The folder holding the installed ``flows``, ``tasks`` and ``rollscale`` packages."""
    spec = importlib.util.find_spec("flows")  # found, not imported: the library never imports flows/
    if spec is None or not spec.origin:
        raise FileNotFoundError("rollscale's stages (the flows package) are not installed: "
                                "reinstall rollscale (pip install rollscale)")
    return Path(spec.origin).resolve().parent.parent


def is_user_project(root: str | os.PathLike[str]) -> bool:
    """Whether ``root`` is a study folder without code of its own (written by ``rollscale init``)."""
    return not (Path(root) / "flows").is_dir()


def write_code_stamps(root: str | os.PathLike[str]) -> list[str]:
    """Write each stage's stamp of the installed code it runs where it changed; the stages changed."""
    root, code = Path(root), code_root()
    changed = []
    for stage, spec in load_stage_specs(root).items():
        stamp = f"{STAMP_FOLDER}/{stage}"
        if stamp not in spec.deps:
            continue
        text = (f"# the installed code stage {stage} runs, hashed (rollscale.pipeline.init.project)\n"
                f"{code_hash(code, tuple(code_deps(code, stage)))}\n")
        path = root / stamp
        if not path.is_file() or path.read_text() != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(text, path)
            changed.append(stage)
    return changed


def refresh_code_stamps(root: str | os.PathLike[str]) -> None:
    """Before DVC is asked what is stale: a user's study folder's stamps of the installed code."""
    if is_user_project(root):
        write_code_stamps(root)


def _data_dep(data: str, folder: Path) -> str | None:
    """The data file as a dep of ``folder``'s stages: a path inside it, else None (DVC watches the
    study folder only; a hub dataset is not a file)."""
    path = Path(data)
    if not path.exists():
        return None
    try:
        return path.resolve().relative_to(folder.resolve()).as_posix()
    except ValueError:
        return None


def _with_data_dep(template: str, dep: str | None, model_only_base: bool = False) -> str:
    """The template's ``data`` deps (the repository's data folder) as the study's data file, or
    dropped; its ``data`` params section is kept. ``model_only_base``: the ``base`` stage of a real
    model reads no data (it loads, or dequantises, the model), so it watches only the settings that
    change the model: neither the data file nor the ``data`` section (base reran when a
    data setting changed)."""
    out, in_deps, in_params, stage = [], False, False, ""
    for line in template.splitlines(keepends=True):
        if line.startswith("  ") and not line.startswith("   ") and line.rstrip().endswith(":"):
            stage = line.strip()[:-1]
        if line.startswith("    ") and not line.startswith("     "):
            in_deps, in_params = line.strip() == "deps:", line.strip() == "params:"
        if (in_deps or in_params) and line == "      - data\n" and model_only_base and stage == "base":
            continue
        if in_deps and line == "      - data\n":
            line = f"      - {dep}\n" if dep else ""
        out.append(line)
    return "".join(out)


def init_project(folder: str | os.PathLike[str], data: str, force: bool = False, model_kind: str = "hf") -> list[str]:
    """Make ``folder`` a study folder (dvc.yaml, .dvcignore, DVC's .dvc/, the code stamps) unless it
    has a dvc.yaml already (a clone; or a study folder, rewritten with ``force``); what was done,
    as lines to print. A real model's (``model_kind`` not tiny) base stage watches the model only."""
    folder = Path(folder)
    if (folder / "dvc.yaml").exists() and not (force and is_user_project(folder)):
        return []
    dep = _data_dep(data, folder)
    write_text_atomic(_with_data_dep(PROJECT_TEMPLATE.read_text(), dep, model_kind != "tiny"), folder / "dvc.yaml")
    if not (folder / ".dvcignore").exists():
        write_text_atomic(DVCIGNORE, folder / ".dvcignore")
    if not (folder / ".dvc").is_dir():
        from dvc.repo import Repo

        dvc_log = logging.getLogger("dvc")
        level = dvc_log.level
        dvc_log.setLevel(logging.WARNING)  # DVC's own greeting: init prints its own lines
        try:
            Repo.init(str(folder), no_scm=True).close()  # a git repository is not needed (nor used)
        finally:
            dvc_log.setLevel(level)
    write_code_stamps(folder)
    lines = [f"init: wrote {folder / 'dvc.yaml'}: this folder is the study's (`rollscale study` runs it here, "
             "`rollscale status` says where it stands)"]
    if dep is None and Path(data).exists():
        lines.append(f"init: {data} is outside this folder, so a change to it does not rerun the study: "
                     "copy it here and run `rollscale init --force` with the copy to have DVC watch it")
    return lines
