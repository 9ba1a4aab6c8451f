"""A directory-backed store of one training run: atomic checkpoints with
checksums, the run's step and eval rows, and a final status marker.

It keeps the cumulative compute ``C`` and the data position with the weights
(science §1), so a resumed run continues the compute accounting exactly, and it
holds the rows of the sweep's ``steps`` and ``evals`` tables (science §1, §5).

The layout of a run directory and its manifest checks: :mod:`rollscale.train.manifest`.

A checkpoint is written into a temporary directory and moved into place with
``os.replace``; the row parts are written (atomically) before it. A checkpoint
whose manifest is missing or whose files (or any part it commits) do not match
it is skipped with a warning, and the one before it is used. Rows count only
when a valid checkpoint commits them: queries read only the parts the newest
manifest lists (:func:`rollscale.train.manifest.committed_parts`), a failed save removes the parts it
wrote, and resuming from checkpoint ``s`` deletes the parts after ``s``
(:meth:`RunStore.rollback_to`), so no row is duplicated or lost. A finished run
whose final checkpoint or parts fail the check is *damaged* (:meth:`RunStore.damage`):
:meth:`RunStore.done` then reports it as not ended, so it is trained again
from its newest good checkpoint.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from rollscale.files import sha256_bytes, sha256_file, write_bytes_atomic
from rollscale.train.manifest import (
    CHECKPOINT_RE,
    MANIFEST,
    SHARDS,
    MANIFEST_VERSION,
    PART_RE,
    read_manifest,
    verify_checkpoint,
)

if TYPE_CHECKING:
    import torch

__all__ = ["Checkpoint", "RunStore"]

DONE = "done.json"
ROW_KINDS: tuple[str, ...] = ("steps", "evals")
# stopped: the search ended the run short of C_max (science §9.4); a grid run later resumes it
STATUSES: tuple[str, ...] = ("finished", "failed", "stopped")
_TMP_PREFIX = ".tmp-"


def _write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically and fsync it: every write of the
    store goes through here (so a full disk can be simulated by replacing it)."""
    write_bytes_atomic(data, path, fsync=True)


def _fsync_dir(path: Path) -> None:
    # Makes a rename durable; not every filesystem lets a directory be opened.
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _torch_bytes(obj: Any) -> bytes:
    import torch  # here, not at the top: queries read manifests without loading torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _json_bytes(obj: Any) -> bytes:
    try:
        return json.dumps(obj, indent=1, sort_keys=True, allow_nan=True).encode()
    except (TypeError, ValueError) as err:
        raise ValueError(f"state must be JSON-serializable: {err}") from None


def _parquet_bytes(rows: Sequence[Mapping[str, Any]]) -> bytes:
    buf = io.BytesIO()
    pd.DataFrame(list(rows)).to_parquet(buf, index=False)
    return buf.getvalue()


@dataclass(frozen=True)
class Checkpoint:
    """A verified checkpoint: its step, directory and ``state.json`` contents."""

    step: int
    path: Path
    state: dict

    def model_state(self, map_location: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
        """The saved state_dict of the trainable parameters."""
        import torch

        return torch.load(self.path / "model.pt", map_location=map_location, weights_only=True)

    def load_weights(self, params: Mapping[str, torch.Tensor]) -> None:
        """Copy the saved trainable parameters into ``params`` (name -> the live tensor);
        a ValueError, before any copy, when the names differ (another model)."""
        import torch

        model_state = self.model_state()
        if set(model_state) != set(params):
            missing = sorted(set(params) - set(model_state))[:3]
            extra = sorted(set(model_state) - set(params))[:3]
            raise ValueError(f"checkpoint {self.path} does not fit this model (missing {missing}, unexpected {extra})")
        with torch.no_grad():
            for name, value in model_state.items():
                params[name].copy_(value)

    def optimizer_state(self, map_location: str | torch.device = "cpu") -> dict:
        """The saved optimizer state_dict."""
        import torch

        return torch.load(self.path / "optimizer.pt", map_location=map_location, weights_only=True)

    @property
    def shards(self) -> Path | None:
        """The torch.distributed.checkpoint folder of a sharded run's checkpoint (weights and
        optimizer state, one file per rank), or None for a one-file checkpoint (``model.pt``)."""
        path = self.path / SHARDS
        return path if path.is_dir() else None


class RunStore:
    """The directory of one run: checkpoints, row parts and the done marker.

    Nothing is created until the first write. ``keep`` is how many of the
    newest checkpoints survive each save (at least 1; default 2, so a
    checkpoint that turns out corrupt still has a predecessor).
    """

    def __init__(self, root: str | os.PathLike[str], keep: int = 2) -> None:
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise ValueError(f"keep must be an int >= 1, got {keep!r}")
        self.root = Path(root)
        self.keep = keep

    def __repr__(self) -> str:
        return f"RunStore({str(self.root)!r})"

    # ------------------------------------------------------------------ listing

    def checkpoint_dirs(self) -> list[tuple[int, Path]]:
        """(step, folder) of every checkpoint folder present, valid or not, oldest first."""
        if not self.root.is_dir():
            return []
        found = []
        for p in self.root.iterdir():
            m = CHECKPOINT_RE.match(p.name)
            if m and p.is_dir():
                found.append((int(m.group(1)), p))
        return sorted(found)

    def _parts(self, kind: str | None = None) -> list[tuple[int, Path]]:
        if not self.root.is_dir():
            return []
        found = []
        for p in self.root.iterdir():
            m = PART_RE.match(p.name)
            if m and (kind is None or m.group(1) == kind):
                found.append((int(m.group(2)), p))
        return sorted(found)

    def _verify(self, step: int, path: Path, quick: bool = False) -> str | None:
        """Why the checkpoint at ``path`` is not valid, or None if it is (see :func:`verify_checkpoint`)."""
        return verify_checkpoint(self.root, step, path, quick)

    def check_same_run(self, saved: Mapping[str, Any], run_id: str, config_hash: str, data_hash: str) -> None:
        """Refuse to resume a different run here: ``saved`` (a checkpoint's state or ``done.json``)
        must carry the same config hash and, when it records one, the same training-data hash."""
        if saved.get("config_hash") != config_hash:
            raise ValueError(f"run directory {self.root} holds a run with a different config (config hash "
                             f"{saved.get('config_hash')} != {config_hash} of run {run_id}); "
                             "use a new directory or the same config")
        if "data_hash" in saved and saved["data_hash"] != data_hash:
            raise ValueError(f"run directory {self.root} holds a run on different training problems "
                             f"(data hash {saved['data_hash']} != {data_hash})")

    def damage(self) -> str | None:
        """Why the run's newest checkpoint (the one ``done.json`` stands on) is not intact, or None.

        None also when there is no checkpoint at all (nothing stored to damage)."""
        dirs = self.checkpoint_dirs()
        if not dirs:
            return None
        step, path = dirs[-1]
        problem = self._verify(step, path)
        return f"checkpoint {path}: {problem}" if problem else None

    def latest(self) -> Checkpoint | None:
        """The newest checkpoint whose files match its manifest, or None.

        Each newer checkpoint that fails the check is skipped with a
        ``warnings.warn`` naming it, why, and the checkpoint used instead.
        """
        skipped: list[str] = []
        found: Checkpoint | None = None
        for step, path in reversed(self.checkpoint_dirs()):
            problem = self._verify(step, path)
            if problem is None:
                found = Checkpoint(step, path, json.loads((path / "state.json").read_bytes()))
                break
            skipped.append(f"{path} ({problem})")
        for what in skipped:
            instead = f"using {found.path}" if found else "no valid checkpoint remains"
            warnings.warn(f"RunStore: skipping corrupt checkpoint {what}; {instead}", RuntimeWarning, stacklevel=2)
        return found

    # ------------------------------------------------------------------ writing

    def save(
        self,
        step: int,
        model_state: Mapping[str, torch.Tensor],
        optimizer_state: Mapping[str, Any],
        state: Mapping[str, Any],
        step_rows: Sequence[Mapping[str, Any]] = (),
        eval_rows: Sequence[Mapping[str, Any]] = (),
        shards: Path | None = None,
    ) -> Checkpoint:
        """Write checkpoint ``step`` with the rows produced since the previous one.

        ``shards``: a sharded run's folder of torch.distributed.checkpoint files (every rank
        wrote its own, see :meth:`shard_folder`), moved into the checkpoint as ``shards/`` and
        listed in its manifest in place of ``model.pt`` and ``optimizer.pt`` (both then None).

        Order: row parts (each atomically), then the checkpoint files in a
        temporary directory, its manifest last, then ``os.replace`` into
        ``ckpt-<step>``; then checkpoints beyond the newest ``keep`` are deleted.
        An ``OSError`` (unwritable directory, full disk) is raised again naming
        the path; earlier checkpoints are left as they were.
        """
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"step must be an int >= 0, got {step!r}")
        if not isinstance(state, Mapping):
            raise ValueError(f"state must be a mapping, got {type(state).__name__}")
        # Serialise before touching the disk, so bad input never leaves half a checkpoint.
        blobs = {} if shards is not None else {
            "model.pt": _torch_bytes(dict(model_state)),
            "optimizer.pt": _torch_bytes(dict(optimizer_state)),
        }
        blobs["state.json"] = _json_bytes(dict(state, step=step))
        parts = {
            f"{kind}-{step:06d}.parquet": _parquet_bytes(rows)
            for kind, rows in (("steps", step_rows), ("evals", eval_rows))
            if len(rows)
        }
        target = self.root / f"ckpt-{step:06d}"
        tmp = self.root / f"{_TMP_PREFIX}ckpt-{step:06d}"
        earlier = [(s, p) for s, p in self.checkpoint_dirs() if s < step]
        earlier_parts = read_manifest(earlier[-1][1]).get("parts", {}) if earlier else {}
        written: list[Path] = []
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            for name, data in parts.items():
                written.append(self.root / name)
                _write_bytes(self.root / name, data)
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
            for name, data in blobs.items():
                _write_bytes(tmp / name, data)
            files = {name: {"sha256": sha256_bytes(d), "bytes": len(d)} for name, d in blobs.items()}
            if shards is not None:
                os.replace(shards, tmp / SHARDS)
                files |= {f"{SHARDS}/{f.name}": {"sha256": sha256_file(f), "bytes": f.stat().st_size}
                          for f in sorted((tmp / SHARDS).iterdir())}
            manifest = {
                "step": step,
                "version": MANIFEST_VERSION,
                "files": files,
                # every part committed so far: one manifest verifies all the run's rows
                "parts": {**earlier_parts,
                          **{name: {"sha256": sha256_bytes(d), "bytes": len(d)} for name, d in parts.items()}},
            }
            _write_bytes(tmp / MANIFEST, _json_bytes(manifest))
            if target.exists():
                # Only a stale checkpoint of this step can be here (rollback_to removes later ones).
                shutil.rmtree(target)
            os.replace(tmp, target)
            _fsync_dir(self.root)
        except OSError as err:
            shutil.rmtree(tmp, ignore_errors=True)
            for path in written:  # rows that no checkpoint commits must not stay behind
                path.unlink(missing_ok=True)
            raise OSError(
                err.errno,
                f"RunStore: could not write checkpoint {step} under {self.root} "
                f"({err.strerror or err}); earlier checkpoints are unchanged",
                str(err.filename or self.root),
            ) from err
        self._prune()
        return Checkpoint(step, target, dict(state, step=step))

    def shard_folder(self, step: int) -> Path:
        """An empty folder for checkpoint ``step``'s shards (``save(..., shards=)``); a crash
        leaves it as a temporary file that :meth:`rollback_to` removes."""
        return self.root / f"{_TMP_PREFIX}{SHARDS}-{step:06d}"

    def _prune(self) -> None:
        for _, path in self.checkpoint_dirs()[: -self.keep]:
            shutil.rmtree(path, ignore_errors=True)

    def rollback_to(self, checkpoint: Checkpoint | None) -> None:
        """Make the directory that of a run resumed from ``checkpoint`` (None: from scratch).

        Deletes checkpoints and row parts of later steps (all of them for None),
        leftover temporary files and the done marker, so the resumed run
        appends its rows without duplicates.
        """
        after = -1 if checkpoint is None else checkpoint.step
        for step, path in self.checkpoint_dirs():
            if step > after:
                shutil.rmtree(path)
        for step, path in self._parts():
            if step > after:
                path.unlink()
        if self.root.is_dir():
            for p in self.root.iterdir():
                if p.name.startswith(_TMP_PREFIX):
                    shutil.rmtree(p) if p.is_dir() else p.unlink()
        (self.root / DONE).unlink(missing_ok=True)

    # ------------------------------------------------------------------ reading

    def rows(self, kind: str) -> pd.DataFrame:
        """All persisted rows of ``kind`` ("steps" or "evals") in step order:
        the parts committed by the newest valid checkpoint and those before it."""
        if kind not in ROW_KINDS:
            raise ValueError(f"kind must be one of {ROW_KINDS}, got {kind!r}")
        latest = self.latest()
        if latest is None:
            return pd.DataFrame()
        frames = [pd.read_parquet(path) for step, path in self._parts(kind) if step <= latest.step]
        if not frames:
            return pd.DataFrame()
        return pd.concat(frames, ignore_index=True)

    # ------------------------------------------------------------------ done marker

    def mark_done(self, status: str, error: str | None = None, **info: Any) -> None:
        """Write ``done.json`` with the run's final ``status`` ("finished" or
        "failed"), the ``error`` message and any JSON-serializable ``info``."""
        if status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {status!r}")
        data = _json_bytes({"status": status, "error": error, **info})
        path = self.root / DONE
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            _write_bytes(path, data)
        except OSError as err:
            raise OSError(err.errno, f"RunStore: could not write {path} ({err.strerror or err})", str(path)) from err

    def done(self) -> dict | None:
        """The contents of ``done.json``, or None while the run has not ended.

        A run marked finished whose newest checkpoint is damaged (:meth:`damage`)
        has not really ended: None, with a warning, so it is trained again from
        its newest good checkpoint and its final weights and rows are restored."""
        path = self.root / DONE
        try:
            done = json.loads(path.read_bytes())
        except FileNotFoundError:
            return None
        except ValueError as err:
            raise ValueError(f"RunStore: {path} is not valid JSON ({err})") from None
        problem = self.damage() if isinstance(done, dict) and done.get("status") == "finished" else None
        if problem:
            warnings.warn(f"RunStore: run {self.root} is marked finished but is damaged ({problem}); "
                          "it is trained again from its newest good checkpoint", RuntimeWarning, stacklevel=2)
            return None
        return done
