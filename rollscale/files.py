"""Writing and checking files: the one way every layer writes a result, and its checksum.

A leaf module (it imports nothing from rollscale), so the run store, the
report and the pipeline use the same writers without importing one another.
Every write goes to a temporary file in the target's folder and is then
renamed over it, so a reader or a crash sees the old file or the new one,
never half of one.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "cache_dir",
    "sha256_bytes",
    "sha256_file",
    "write_atomic",
    "write_bytes_atomic",
    "write_json_atomic",
    "write_parquet_atomic",
    "write_parquets_atomic",
    "write_text_atomic",
]


def cache_dir(kind: str) -> Path:
    """This machine's cache folder for ``kind`` (``$ROLLSCALE_CACHE``, else ``$XDG_CACHE_HOME/rollscale``, else
    ``~/.cache/rollscale``): what is computed once per machine, never a result (a study's are its artifacts)."""
    base = os.environ.get("ROLLSCALE_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / \
        "rollscale"
    return Path(base) / kind


def _temp_beside(path: Path) -> Path:
    """An empty temporary file in ``path``'s folder (created, with that folder); an ``OSError`` names ``path``."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
    except OSError as err:
        raise OSError(err.errno, f"cannot write {path}: {err.strerror or err}", str(path)) from err
    return Path(tmp)


def write_atomic(path: str | Path, write: Callable[[Path], None], fsync: bool = False) -> Path:
    """Create ``path`` by ``write(tmp)`` on a temporary file in the same folder, then a rename.

    The file is readable by everyone (results are shared); ``fsync`` makes the
    bytes durable before the rename. An ``OSError`` (full disk, unwritable
    folder) is raised again naming ``path``; the old file and no temporary
    file are left.
    """
    path = Path(path)
    tmp = _temp_beside(path)
    try:
        write(tmp)
        if fsync:
            with open(tmp, "rb+") as fh:
                os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; results are for every reader of the folder
        os.replace(tmp, path)
    except BaseException as err:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(err, OSError):
            raise OSError(err.errno, f"cannot write {path}: {err.strerror or err}", str(path)) from err
        raise
    return path


def write_bytes_atomic(data: bytes, path: str | Path, fsync: bool = False) -> Path:
    return write_atomic(path, lambda tmp: tmp.write_bytes(data), fsync)


def write_text_atomic(text: str, path: str | Path) -> Path:
    return write_atomic(path, lambda tmp: tmp.write_text(text))


def write_json_atomic(data: Any, path: str | Path) -> Path:
    return write_text_atomic(json.dumps(data, indent=1), path)


def write_parquet_atomic(df: pd.DataFrame, path: str | Path) -> Path:
    """Write ``df`` to ``path`` as Parquet without its index, atomically."""
    return write_atomic(path, lambda tmp: df.to_parquet(tmp, index=False))


def write_parquets_atomic(tables: Mapping[str | Path, pd.DataFrame]) -> list[Path]:
    """Publish a stage's tables all at once: each ``{path: df}`` is written as Parquet to a temporary file
    beside its old file, and only when every one is written are they renamed over the old ones (a rename
    needs no space). A failure while writing (a full disk) leaves the old set whole and no temporary file;
    an ``OSError`` names the file it was writing."""
    written: list[tuple[Path, Path]] = []
    try:
        for path, df in tables.items():
            path = Path(path)
            written.append((tmp := _temp_beside(path), path))
            try:
                df.to_parquet(tmp, index=False)
            except OSError as err:
                raise OSError(err.errno, f"cannot write {path}: {err.strerror or err}", str(path)) from err
            os.chmod(tmp, 0o644)  # mkstemp makes 0600; results are for every reader of the folder
        for tmp, path in written:
            os.replace(tmp, path)
    except BaseException:
        for tmp, _ in written:
            tmp.unlink(missing_ok=True)
        raise
    return [path for _, path in written]


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of a file's bytes, read in blocks (never the whole file in memory)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def sha256_bytes(data: bytes) -> str:
    """Hex sha256 of ``data``: the checksum of bytes about to be written (equal to
    :func:`sha256_file` of the file they become)."""
    return hashlib.sha256(data).hexdigest()
