"""The on-disk format of a run directory and its checks (science §1, §5: the run's
compute, data position and step / eval rows are only as trustworthy as this).

Layout of a run directory::

    ckpt-000010/              one checkpoint (the last ``keep`` are kept)
        model.pt              state_dict of the trainable parameters
        optimizer.pt          optimizer state_dict
        state.json            step, C, data position, RNG states, config hash, ...
        shards/               instead of model.pt and optimizer.pt, in a sharded run
                              (sweep.devices_per_run > 1): torch.distributed.checkpoint's
                              .metadata and one __<rank>_0.distcp per rank (each rank's
                              shards of the trainable weights and AdamW state)
        MANIFEST.json         sha256 and size of the files above and of every
                              row part committed so far (this checkpoint's and
                              all earlier ones); written last: it commits the checkpoint
    steps-000010.parquet      step rows since the previous checkpoint
    evals-000010.parquet      eval rows since the previous checkpoint
    done.json                 final status, when the run has ended

A checkpoint is valid when its manifest describes its step and every file it
lists (its own and the row parts committed so far) has the recorded size and
sha256 (:func:`verify_checkpoint`); queries read only the parts the newest
manifest commits (:func:`committed_parts`). :class:`rollscale.train.checkpoint.RunStore`
writes this format.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rollscale.files import sha256_file

MANIFEST = "MANIFEST.json"
# 2: "parts" lists every part committed so far (1: only the checkpoint's own)
MANIFEST_VERSION = 2
CHECKPOINT_RE = re.compile(r"^ckpt-(\d{6,})$")
PART_RE = re.compile(r"^(steps|evals)-(\d{6,})\.parquet$")
CHECKPOINT_FILES = ("model.pt", "optimizer.pt", "state.json")
SHARDS = "shards"  # a sharded checkpoint's torch.distributed.checkpoint folder
# a quick check (`rollscale status`, the stages reading a run) hashes files up to this size and checks larger
# ones by size only (it must stay fast on large checkpoints)
QUICK_HASH_BYTES = 64 << 20


def _expected_files(files: Mapping[str, Any]) -> bool:
    """A one-file checkpoint's three files, or a sharded one's state.json and shards (with DCP's metadata)."""
    if set(files) == set(CHECKPOINT_FILES):
        return True
    shards = set(files) - {"state.json"}
    return "state.json" in files and f"{SHARDS}/.metadata" in shards and all(
        name.startswith(f"{SHARDS}/") for name in shards)


def read_manifest(path: Path) -> dict:
    """The manifest of checkpoint folder ``path``; {} when missing or unreadable."""
    try:
        manifest = json.loads((path / MANIFEST).read_bytes())
    except (OSError, ValueError):
        return {}
    return manifest if isinstance(manifest, dict) else {}


def check_file(file: Path, meta: Mapping[str, Any], hash_it: bool = True) -> str | None:
    try:
        size = file.stat().st_size
    except OSError:
        return f"{file} is missing"
    if size != meta.get("bytes"):
        return f"{file} has {size} bytes, the manifest says {meta.get('bytes')} (truncated?)"
    if hash_it and sha256_file(file) != meta.get("sha256"):
        return f"{file} does not match its sha256 checksum (changed after it was written)"
    return None


def verify_checkpoint(root: Path, step: int, path: Path, quick: bool = False) -> str | None:
    """Why checkpoint ``path`` (step ``step``) of the run in ``root`` is not valid, or None.

    Checks the size and sha256 of its files and of every row part it commits.
    ``quick`` hashes ``state.json``, the parts and the weights up to :data:`QUICK_HASH_BYTES` (larger
    weights: size only), for ``rollscale status``, which must stay fast on large checkpoints."""
    if not (path / MANIFEST).exists():
        return f"no {MANIFEST} (an interrupted write)"
    manifest = read_manifest(path)
    if manifest.get("step") != step:
        return f"{MANIFEST} is unreadable or does not describe step {step}"
    files = manifest.get("files", {})
    if not _expected_files(files):
        return f"{MANIFEST} lists {sorted(files)}, expected {list(CHECKPOINT_FILES)} or state.json and {SHARDS}/"
    entries = [(path / name, meta, not quick or name == "state.json" or (meta.get("bytes") or 0) <= QUICK_HASH_BYTES)
               for name, meta in files.items()]
    entries += [(root / name, meta, True) for name, meta in manifest.get("parts", {}).items()]
    for file, meta, hash_it in entries:
        problem = check_file(file, meta, hash_it)
        if problem:
            return problem
    return None


def committed_parts(run_dir: str | os.PathLike[str]) -> tuple[list[str], str | None]:
    """The row parts (file names) the newest checkpoint of a run commits, and the first
    problem found checking them against its manifest (None when all match).

    Parts written after that checkpoint are not listed: they are not committed.
    A manifest of the first format (parts of its own step only) commits every
    part up to its step, unchecked."""
    run_dir = Path(run_dir)
    try:
        names = [p.name for p in run_dir.iterdir()]
    except OSError:
        return [], None
    ckpts = sorted((int(m.group(1)), n) for n in names if (m := CHECKPOINT_RE.match(n)))
    for step, name in reversed(ckpts):
        manifest = read_manifest(run_dir / name)
        if manifest.get("step") != step:
            continue  # being written or damaged: the one before it is what is committed
        if manifest.get("version") != MANIFEST_VERSION:
            return sorted(n for n in names if (m := PART_RE.match(n)) and int(m.group(2)) <= step), None
        parts = manifest.get("parts", {})
        for part, meta in sorted(parts.items()):
            problem = check_file(run_dir / part, meta)
            if problem:
                return sorted(parts), problem
        return sorted(parts), None
    return [], None
