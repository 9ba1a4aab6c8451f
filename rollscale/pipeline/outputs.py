"""Checksums of every stage's outputs: ``artifacts/<stage>/MANIFEST.json``.

A stage that finishes records the size and sha256 of each file it wrote
(:func:`write_outputs_manifest`); a stage that starts removes the record
first (:func:`clear_outputs_manifest`), so a record always describes a
finished stage's files. A file changed, truncated, removed or added after
that is then named by ``rollscale status`` (the stage is "damaged"), by a
query of its table (:mod:`rollscale.pipeline.storage`), and makes
``rollscale study`` run the stage again, even where DVC's own hashes cannot
see it (DVC trusts a file whose size and mtime did not change).

Not recorded here: dot-files (stage locks, temporary files) and what the sweep's
run store already checks itself (checkpoint folders and the row parts their
manifests commit, :mod:`rollscale.train.manifest`); ``archive/`` (runs moved
out of the tables). A stage without a record (interrupted, or run by an older
version) is not checked.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

from rollscale.files import sha256_file, write_json_atomic
from rollscale.train.manifest import CHECKPOINT_RE, PART_RE, check_file

OUTPUTS_MANIFEST = "MANIFEST.json"
VERSION = 1
# `rollscale status` hashes files up to this size and checks larger ones by size only (it must stay fast)
QUICK_HASH_BYTES = 64 << 20

__all__ = ["OUTPUTS_MANIFEST", "clear_outputs_manifest", "outputs_problem", "stage_output_files",
           "write_outputs_manifest"]


def _recorded(rel: Path) -> bool:
    """Whether the file at ``rel`` (relative to its stage folder) belongs in the stage's record."""
    parts = rel.parts
    if any(p.startswith(".") for p in parts) or rel == Path(OUTPUTS_MANIFEST) or parts[0] == "archive":
        return False
    if any(CHECKPOINT_RE.match(p) for p in parts[:-1]) or PART_RE.match(parts[-1]):
        return False  # the run store's own manifests check these
    return True


def stage_output_files(artifacts: str | os.PathLike[str], stage: str) -> list[Path]:
    """The files of ``artifacts/<stage>`` that its record covers, sorted, relative to that folder."""
    folder = Path(artifacts) / stage
    if not folder.is_dir():
        return []
    return sorted(rel for p in folder.rglob("*") if p.is_file() and _recorded(rel := p.relative_to(folder)))


def write_outputs_manifest(artifacts: str | os.PathLike[str], stage: str) -> Path:
    """Record the size and sha256 of the stage's files (no time stamp: equal outputs give an equal
    record, so DVC's hash of the folder does not change when the outputs did not)."""
    folder = Path(artifacts) / stage
    files = {str(rel): {"bytes": (folder / rel).stat().st_size, "sha256": sha256_file(folder / rel)}
             for rel in stage_output_files(artifacts, stage)}
    return write_json_atomic({"version": VERSION, "stage": stage, "files": files}, folder / OUTPUTS_MANIFEST)


def clear_outputs_manifest(artifacts: str | os.PathLike[str], stage: str) -> None:
    """Remove the record: the stage is about to rewrite its files."""
    (Path(artifacts) / stage / OUTPUTS_MANIFEST).unlink(missing_ok=True)


def _read(folder: Path) -> dict | None:
    try:
        manifest = json.loads((folder / OUTPUTS_MANIFEST).read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {"files": None}
    return manifest if isinstance(manifest, dict) else {"files": None}


def outputs_problem(artifacts: str | os.PathLike[str], stage: str, files: Iterable[Path] | None = None,
                    quick: bool = False) -> str | None:
    """What is wrong with the stage's files against its record (the first problem), or None.

    ``files`` (absolute, or relative to the stage folder): check only these, e.g. one table's;
    default: every file of the record and every file the stage folder holds now. ``quick``
    hashes files up to :data:`QUICK_HASH_BYTES` (larger ones: size only). None when the stage
    has no record (see the module docstring)."""
    folder = Path(artifacts) / stage
    manifest = _read(folder)
    if manifest is None:
        return None
    recorded = manifest.get("files")
    if not isinstance(recorded, dict):
        return f"{folder / OUTPUTS_MANIFEST} is unreadable (damaged); run the stage again"
    if files is None:
        wanted = sorted({*map(Path, recorded), *stage_output_files(artifacts, stage)})
    else:
        wanted = [Path(f).resolve().relative_to(folder.resolve()) if Path(f).is_absolute() else Path(f) for f in files]
    for rel in wanted:
        meta = recorded.get(str(rel))
        if meta is None:
            return f"{folder / rel} was not written by the stage's last finished run (not in its {OUTPUTS_MANIFEST})"
        size = meta.get("bytes") or 0
        problem = check_file(folder / rel, meta, hash_it=not quick or size <= QUICK_HASH_BYTES)
        if problem:
            return problem
    return None
