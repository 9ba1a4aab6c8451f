"""A GGUF file dequantised once per machine, not once per load.

transformers reads a GGUF by dequantising every tensor (SmolLM2-135M's Q4_1 file: ~30-40 s on a 2-core CPU),
and `init`, `check`'s calibration, the base stage and the tests each loaded the same file again. The first load
saves the dequantised model as a plain folder in a cache (``$ROLLSCALE_CACHE``, else
``$XDG_CACHE_HOME/rollscale``, else ``~/.cache/rollscale``, under ``gguf/``); a later load of the same file
contents at the same dtype, with the same transformers, reads that folder (~1 s). The key is the file's SHA-256,
so a new download of other contents never meets a stale entry; an entry is written to a temporary folder and
renamed into place when complete, so an interrupted or concurrent write never leaves half a model to load;
processes that load the same file at once take turns (a file lock beside the entry), so the file is dequantised
once and the others read the entry. A cache that cannot be written (a read-only home, a full disk) is skipped:
the load is then as before. While a GGUF is read, its parse is shared by the config's, the tokenizer's and the
weights' reads (:func:`one_parse`).
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from rollscale.files import cache_dir

__all__ = ["COMPLETE", "cache_root", "entry", "lookup", "one_load_at_a_time", "one_parse", "store",
           "tokenizer_source"]

COMPLETE = "COMPLETE"  # written last into an entry: a folder without it is not one


def cache_root() -> Path:
    """Where dequantised GGUF files are kept (the module docstring)."""
    return cache_dir("gguf")


def _stem(gguf: Path) -> str:
    """An entry's name but its dtype: the file's name and contents, and transformers' version (a newer one may
    dequantise or name tensors otherwise)."""
    import transformers

    digest = hashlib.sha256()
    with open(gguf, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return f"{gguf.stem}-{digest.hexdigest()[:16]}-transformers{transformers.__version__}"


def entry(gguf: Path, dtype: str) -> Path:
    """The cache folder of ``gguf`` at ``dtype``."""
    return cache_root() / f"{_stem(gguf)}-{dtype}"


def tokenizer_source(name_or_path: str, gguf_file: str | None) -> tuple[str, dict[str, str]]:
    """Where to load a model's tokenizer from, and the keyword that says how: a cached entry of the GGUF at any
    dtype (its tokenizer is the same; ~10 s saved on SmolLM2), else the GGUF itself."""
    if not gguf_file:
        return name_or_path, {}
    try:
        stem = _stem(Path(name_or_path) / gguf_file)
        done = sorted(p.parent for p in cache_root().glob(f"{stem}-*/{COMPLETE}"))
    except OSError:
        done = []
    return (str(done[0]), {}) if done else (name_or_path, {"gguf_file": gguf_file})


def lookup(gguf: Path, dtype: str) -> tuple[Path | None, bool]:
    """(the cache folder of ``gguf`` at ``dtype``, whether it is a complete entry); (None, False) when the file
    cannot be read (its load names it). The file is hashed here once a load: :func:`store` takes the folder."""
    try:
        folder = entry(gguf, dtype)
    except OSError:
        return None, False
    return folder, (folder / COMPLETE).is_file()


@contextlib.contextmanager
def one_load_at_a_time(folder: Path) -> Iterator[bool]:
    """Held while this process dequantises into ``folder``: another process loading the same file waits here
    (two pytest workers, or a stage's two worker processes, each spent ~30 s of CPU on the same file). Yields
    whether the entry is complete once the turn comes (another process stored it meanwhile). Without a writable
    cache folder, no lock: the load goes on as without a cache."""
    from filelock import FileLock

    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(folder.parent / f".{folder.name}.lock"))
        lock.acquire()
    except OSError:
        yield False
        return
    try:
        yield (folder / COMPLETE).is_file()
    finally:
        lock.release()


@contextlib.contextmanager
def one_parse() -> Iterator[None]:
    """Within it, a GGUF file is parsed once: transformers reads the file three times per load (the config, the
    tokenizer and the weights each build a ``gguf.GGUFReader``, which parses every metadata field, the 49k-token
    vocabulary included) and builds gguf's tensor-name map once per module (397 times for SmolLM2); both are
    read-only, so one of each serves the whole load. SmolLM2-135M's cold load: 3.8 s a parse and 5 s of name maps of
    22.6 s under cProfile. Where gguf lacks either name (another version), the load reads as before."""
    import functools

    try:
        import gguf
    except ImportError:
        yield
        return
    names = [n for n in ("GGUFReader", "get_tensor_name_map") if callable(getattr(gguf, n, None))]
    saved = {n: getattr(gguf, n) for n in names}
    readers: dict[tuple[str, str], object] = {}

    def reader(path, mode="r"):
        key = (str(Path(path).resolve()), mode)
        if key not in readers:
            readers[key] = saved["GGUFReader"](path, mode)
        return readers[key]

    for name in names:
        setattr(gguf, name, reader if name == "GGUFReader" else functools.lru_cache(maxsize=None)(saved[name]))
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(gguf, name, value)


def store(model, tokenizer, folder: Path, gguf: Path) -> Path | None:
    """Save a model just dequantised from ``gguf`` as its cache entry ``folder`` (:func:`entry`, computed once by
    the caller: hashing a large GGUF twice per load costs seconds); None where the cache cannot be written (the
    load goes on without it) or another process stored it first."""
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".writing.", dir=folder.parent))
    except OSError:
        return None
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / COMPLETE).write_text(str(gguf))
        tmp.rename(folder)  # fails where another process's entry is already in place: keep that one
        return folder
    except OSError:
        return None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
