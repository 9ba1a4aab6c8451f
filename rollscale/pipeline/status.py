"""Where the study stands, read from its artifacts: which stages are done, stale,
running or interrupted, and how far each sweep run has come.

A stage's *fingerprint* hashes what decides its outputs, as ``dvc.yaml`` lists
it: the stage's params sections and its dependencies (the content of code
files; for folders under ``artifacts/``, the path, size and modification time
of every file, since those can be large). A stage that finished writes
``artifacts/<stage>/.stage.json`` with its fingerprint, so the study flow can
skip a stage whose recorded fingerprint equals the current one. While a stage
runs it holds ``artifacts/<stage>/.stage.lock`` (pid, host, start time and a
heartbeat refreshed every :data:`HEARTBEAT_S` seconds); a lock whose process is
gone marks an interrupted stage and is taken over by the next run. A stage that
raised leaves ``.stage.failed.json`` with the error.

Sweep runs are read from ``artifacts/sweep/runs/<run_id>/``: ``run.parquet``
(status), the newest committed checkpoint's ``state.json`` (step and C; science
§1), ``done.json`` and ``attempts.jsonl`` (one row per start of the run in a worker).

Plain functions over files: no Prefect. Times are UTC ISO strings.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import hashlib
import json
import logging
import os
import re
import socket
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from rollscale.config import StudyParams

log = logging.getLogger("rollscale.pipeline.status")

REPO = Path(__file__).resolve().parents[2]
DVC_YAML = REPO / "dvc.yaml"
MARKER = ".stage.json"
LOCK = ".stage.lock"
FAILED = ".stage.failed.json"
ATTEMPTS = "attempts.jsonl"
# a lock on another host counts as live while its heartbeat is younger than this many periods
HEARTBEAT_S = 10.0
STALE_HEARTBEATS = 3
STATES: tuple[str, ...] = ("done", "stale", "running", "interrupted", "failed", "not run")
_CKPT_RE = re.compile(r"^ckpt-(\d{6,})$")


class StageBusyError(RuntimeError):
    """The stage is already running in a live process; two writers would mix their outputs."""


class ArtifactsNotWritableError(OSError):
    """The artifacts folder cannot be written (read-only, permissions, full disk)."""

    def __str__(self) -> str:  # the message alone, without OSError's "[Errno n]" prefix
        return str(self.strerror)


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


# ---------------------------------------------------------------------------- stage specs


@dataclass(frozen=True)
class StageSpec:
    """One stage of ``dvc.yaml``: its dependencies (paths) and params keys (dotted)."""

    name: str
    deps: tuple[str, ...] = ()
    params: tuple[str, ...] = ()


def _entry_names(entries: Any, what: str, stage: str) -> tuple[str, ...]:
    """DVC lists deps/params as strings or one-key mappings ({path: options} / {file: [keys]})."""
    if entries is None:
        return ()
    if not isinstance(entries, list):
        raise ValueError(f"dvc.yaml: stages.{stage}.{what} must be a list, got {type(entries).__name__}")
    names: list[str] = []
    for entry in entries:
        if isinstance(entry, str):
            names.append(entry)
        elif isinstance(entry, dict) and what == "params":
            for keys in entry.values():  # {params.yaml: [a, b]}
                names.extend(str(k) for k in (keys or []))
        elif isinstance(entry, dict) and len(entry) == 1:
            names.append(str(next(iter(entry))))
        else:
            raise ValueError(f"dvc.yaml: stages.{stage}.{what}: cannot read entry {entry!r}")
    return tuple(names)


def load_stage_specs(dvc_yaml: str | os.PathLike[str] = DVC_YAML) -> dict[str, StageSpec]:
    """The stages of ``dvc.yaml`` in file order (the study's order), name -> spec."""
    path = Path(dvc_yaml)
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} not found: the study's stages are read from dvc.yaml") from None
    stages = (raw or {}).get("stages")
    if not isinstance(stages, dict) or not stages:
        raise ValueError(f"{path}: expected a non-empty 'stages' mapping")
    return {
        name: StageSpec(name, _entry_names(body.get("deps"), "deps", name),
                        _entry_names(body.get("params"), "params", name))
        for name, body in stages.items()
    }


# ---------------------------------------------------------------------------- fingerprints


def params_values(study: StudyParams, keys: Sequence[str]) -> dict[str, Any]:
    """The resolved values of dotted params keys (``"model.lora"``), JSON-ready."""
    dumped = study.model_dump(mode="json")
    values = {}
    for key in keys:
        node: Any = dumped
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                raise ValueError(f"params key {key!r} (named in dvc.yaml) is not in the params schema")
            node = node[part]
        values[key] = node
    return values


def _visible_files(root: Path) -> list[Path]:
    """Files under ``root`` except hidden ones (markers, locks, temporary files) and caches."""
    if root.is_file():
        return [root]
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d != "__pycache__")
        found.extend(Path(dirpath) / f for f in sorted(filenames) if not f.startswith("."))
    return found


def listing_hash(path: Path) -> str:
    """Hash of (relative path, size, mtime) of every file under ``path``; "missing" if absent.

    For stage outputs, which can be gigabytes of checkpoints: a rewrite changes
    the mtime, which is what marks the stages after it stale."""
    if not path.exists():
        return "missing"
    h = hashlib.sha256()
    for f in _visible_files(path):
        try:
            st = f.stat()
        except FileNotFoundError:  # removed while we list (a sweep pruning a checkpoint)
            continue
        h.update(f"{f.relative_to(path) if f != path else f.name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def content_hash(path: Path) -> str:
    """sha256 over the relative paths and bytes of the files under ``path``; "missing" if absent."""
    if not path.exists():
        return "missing"
    h = hashlib.sha256()
    for f in _visible_files(path):
        h.update(f"{f.relative_to(path) if f != path else f.name}\0".encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def dep_path(dep: str, artifacts: Path, repo: Path = REPO) -> tuple[Path, bool]:
    """Where a ``dvc.yaml`` dependency lives, and whether it is a stage output:
    ``artifacts/...`` maps into the artifacts folder in use, the rest into the repository."""
    parts = Path(dep).parts
    if parts and parts[0] == "artifacts":
        return Path(artifacts).joinpath(*parts[1:]), True
    return repo / dep, False


@dataclass(frozen=True)
class Fingerprint:
    """A stage's fingerprint and the hash of each of its inputs (to say what changed)."""

    value: str
    inputs: dict[str, str]


def stage_fingerprint(spec: StageSpec, study: StudyParams, artifacts: str | os.PathLike[str],
                      repo: Path = REPO) -> Fingerprint:
    """Hash of the stage's params sections and dependencies (see the module docstring)."""
    inputs: dict[str, str] = {}
    for key, value in params_values(study, spec.params).items():
        inputs[f"params {key}"] = hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()
    for dep in spec.deps:
        path, is_output = dep_path(dep, Path(artifacts), repo)
        inputs[dep] = listing_hash(path) if is_output else content_hash(path)
    value = hashlib.sha256(json.dumps([spec.name, inputs], sort_keys=True).encode()).hexdigest()[:32]
    return Fingerprint(value, inputs)


# ---------------------------------------------------------------------------- markers and locks


def _write_json_atomic(data: Mapping[str, Any], path: Path) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=1)
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide the file from other users of a shared folder
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, NotADirectoryError):
        return None
    except ValueError:
        return {}  # half-written by a process on another host, or damaged: present but unreadable
    return data if isinstance(data, dict) else {}


def read_marker(artifacts: str | os.PathLike[str], stage: str) -> dict | None:
    """``artifacts/<stage>/.stage.json`` of the stage's last successful run, or None."""
    return _read_json(Path(artifacts) / stage / MARKER)


def read_lock(artifacts: str | os.PathLike[str], stage: str) -> dict | None:
    """``artifacts/<stage>/.stage.lock`` while (or since) the stage runs, or None."""
    return _read_json(Path(artifacts) / stage / LOCK)


def _process_start(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (tells a live holder from a reused pid); None off Linux."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # field 22, counted after the parenthesised name


def lock_alive(lock: Mapping[str, Any], now: float | None = None, heartbeat_s: float = HEARTBEAT_S) -> bool:
    """Whether the lock's holder still runs: on this host its pid (and start time) is
    alive; on another host its heartbeat is younger than a few periods."""
    pid = lock.get("pid")
    if lock.get("host") == socket.gethostname() and isinstance(pid, int):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass  # exists, owned by another user
        return lock.get("proc_start") in (None, _process_start(pid))
    beat = lock.get("heartbeat_unix")
    now = time.time() if now is None else now
    return isinstance(beat, (int, float)) and now - beat < STALE_HEARTBEATS * heartbeat_s


def _not_writable(folder: Path, stage: str, err: OSError) -> ArtifactsNotWritableError:
    why = err.strerror or str(err)
    return ArtifactsNotWritableError(
        err.errno or errno.EIO,
        f"artifacts folder {folder} is not writable ({why}): stage {stage!r} did not start; "
        "earlier results are unchanged",
    )


class StageLock:
    """Hold ``artifacts/<stage>/.stage.lock`` while a stage runs (context manager).

    The lock is created atomically (a complete temporary file hard-linked into
    place, so no reader sees half of it). A live holder makes entering raise
    :class:`StageBusyError`; a dead one's lock is taken over with a warning. A
    daemon thread refreshes the heartbeat. Entering is the stage's first write,
    so an unwritable or full artifacts folder fails here, before any work, with
    :class:`ArtifactsNotWritableError`.
    """

    def __init__(self, artifacts: str | os.PathLike[str], stage: str, heartbeat_s: float = HEARTBEAT_S) -> None:
        if heartbeat_s <= 0:
            raise ValueError(f"heartbeat_s must be > 0, got {heartbeat_s!r}")
        self.folder = Path(artifacts) / stage
        self.stage = stage
        self.heartbeat_s = heartbeat_s
        self.path = self.folder / LOCK
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        pid = os.getpid()
        self.info = {"stage": stage, "pid": pid, "host": socket.gethostname(), "proc_start": _process_start(pid),
                     "started_at": _now(), "heartbeat_at": _now(), "heartbeat_unix": time.time()}

    def _create(self) -> bool:
        fd, tmp = tempfile.mkstemp(prefix=f".{LOCK}.", suffix=".tmp", dir=self.folder)
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump(self.info, fh, indent=1)
            os.chmod(tmp, 0o644)
            try:
                os.link(tmp, self.path)
            except FileExistsError:
                return False
            except OSError as err:
                if err.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP):
                    raise
                return self._create_exclusive()  # a filesystem without hard links
            return True
        finally:
            Path(tmp).unlink(missing_ok=True)

    def _create_exclusive(self) -> bool:
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as fh:  # readers may see it empty for an instant: they wait and look again
            json.dump(self.info, fh, indent=1)
        return True

    def __enter__(self) -> "StageLock":
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            for attempt in range(5):
                if self._create():
                    break
                held = read_lock(self.folder.parent, self.stage)
                if held is None:
                    continue  # released meanwhile
                if held == {} and attempt < 4:
                    time.sleep(0.2)  # being written: look again; unreadable for good = damaged, taken over
                    continue
                if held and lock_alive(held, heartbeat_s=self.heartbeat_s):
                    raise StageBusyError(
                        f"stage {self.stage!r} is already running (pid {held.get('pid')} on {held.get('host')}, "
                        f"since {held.get('started_at')}); wait for it or stop that process first"
                    )
                log.warning("stage %s: taking over the lock of a run that stopped (pid %s on %s, started %s)",
                            self.stage, held.get("pid"), held.get("host"), held.get("started_at"))
                self.path.unlink(missing_ok=True)
            else:
                raise StageBusyError(f"stage {self.stage!r}: could not take {self.path} (another run keeps taking it)")
        except OSError as err:
            raise _not_writable(self.folder, self.stage, err) from err
        self._thread = threading.Thread(target=self._beat, name=f"heartbeat-{self.stage}", daemon=True)
        self._thread.start()
        return self

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            self.info.update(heartbeat_at=_now(), heartbeat_unix=time.time())
            try:
                _write_json_atomic(self.info, self.path)
            except OSError as err:  # a full disk must not kill the stage; its own writes will say so
                log.debug("stage %s: heartbeat not written: %s", self.stage, err)

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        held = read_lock(self.folder.parent, self.stage)
        if held and held.get("pid") == self.info["pid"] and held.get("host") == self.info["host"]:
            self.path.unlink(missing_ok=True)


@contextlib.contextmanager
def stage_run(stage: str, study: StudyParams, artifacts: str | os.PathLike[str],
              specs: Mapping[str, StageSpec] | None = None, repo: Path = REPO,
              heartbeat_s: float = HEARTBEAT_S) -> Iterator[Fingerprint | None]:
    """Run a stage under its lock; on success record its fingerprint in ``.stage.json``.

    The fingerprint is taken before the stage runs (the inputs it ran on). On an
    exception ``.stage.failed.json`` records it and the marker is left as it was.
    A stage that ``dvc.yaml`` does not list is locked but not fingerprinted
    (it yields None and writes no marker).
    """
    specs = load_stage_specs(repo / "dvc.yaml") if specs is None else specs
    spec = specs.get(stage)
    fingerprint = stage_fingerprint(spec, study, artifacts, repo) if spec else None
    if spec is None:
        log.warning("stage %s is not in dvc.yaml: it runs without a fingerprint (never skipped, never stale)", stage)
    folder = Path(artifacts) / stage
    with StageLock(artifacts, stage, heartbeat_s):
        started, t0 = _now(), time.perf_counter()
        try:
            yield fingerprint
        except BaseException as err:
            with contextlib.suppress(OSError):
                _write_json_atomic({"stage": stage, "error": f"{type(err).__name__}: {err}"[:2000],
                                    "started_at": started, "failed_at": _now(), "pid": os.getpid(),
                                    "host": socket.gethostname()}, folder / FAILED)
            raise
        if fingerprint is not None:
            folder.mkdir(parents=True, exist_ok=True)  # a stage may replace its folder wholesale
            _write_json_atomic({"stage": stage, "fingerprint": fingerprint.value, "inputs": fingerprint.inputs,
                                "started_at": started, "finished_at": _now(),
                                "seconds": round(time.perf_counter() - t0, 3), "host": socket.gethostname()},
                               folder / MARKER)
        (folder / FAILED).unlink(missing_ok=True)


def changed_inputs(marker: Mapping[str, Any], fingerprint: Fingerprint) -> list[str]:
    """Inputs whose hash differs from the ones recorded in ``marker`` (added or removed too)."""
    old = marker.get("inputs") or {}
    return sorted(k for k in set(old) | set(fingerprint.inputs) if old.get(k) != fingerprint.inputs.get(k))


# ---------------------------------------------------------------------------- status


@dataclass(frozen=True)
class StageStatus:
    """One stage: ``state`` is one of :data:`STATES`; ``detail`` says why or since when."""

    stage: str
    state: str
    finished_at: str | None
    detail: str


def stage_status(spec: StageSpec, study: StudyParams, artifacts: str | os.PathLike[str],
                 repo: Path = REPO) -> StageStatus:
    """Running (live lock) > interrupted (lock of a dead process) > failed (error after the
    last success) > done (fingerprint unchanged) > stale (changed) > not run (no marker)."""
    marker = read_marker(artifacts, spec.name)
    finished = marker.get("finished_at") if marker else None
    lock = read_lock(artifacts, spec.name)
    if lock is not None:
        who = f"pid {lock.get('pid')} on {lock.get('host')}, since {lock.get('started_at')}"
        if lock_alive(lock):
            return StageStatus(spec.name, "running", finished, who)
        return StageStatus(spec.name, "interrupted", finished, f"stopped without finishing ({who})")
    failed = _read_json(Path(artifacts) / spec.name / FAILED)
    if failed and (not finished or str(failed.get("failed_at", "")) > finished):
        return StageStatus(spec.name, "failed", finished, f"{failed.get('failed_at')}: {failed.get('error')}")
    if not marker:
        return StageStatus(spec.name, "not run", None, "")
    current = stage_fingerprint(spec, study, artifacts, repo)
    if marker.get("fingerprint") == current.value:
        return StageStatus(spec.name, "done", finished, f"{marker.get('seconds', float('nan')):.0f} s")
    return StageStatus(spec.name, "stale", finished, "changed: " + ", ".join(changed_inputs(marker, current)))


def latest_checkpoint_state(run_dir: str | os.PathLike[str]) -> dict | None:
    """``state.json`` of the newest checkpoint whose manifest was written (committed), or None.

    Cheap: checksums are not verified here (the trainer does that when it resumes)."""
    run_dir = Path(run_dir)
    try:
        names = [p.name for p in run_dir.iterdir()]
    except OSError:
        return None
    for name in sorted((n for n in names if _CKPT_RE.match(n)), reverse=True):
        if (run_dir / name / "MANIFEST.json").exists():
            state = _read_json(run_dir / name / "state.json")
            if state:
                return state
    return None


def read_attempts(run_dir: str | os.PathLike[str]) -> list[dict]:
    """The rows of ``attempts.jsonl`` (one per start of a run on a worker); a torn last line is skipped."""
    rows = []
    try:
        lines = (Path(run_dir) / ATTEMPTS).read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        with contextlib.suppress(ValueError):
            row = json.loads(line)
            if isinstance(row, dict):
                rows.append(row)
    return rows


def record_attempt(run_dir: str | os.PathLike[str], **info: Any) -> dict:
    """Append this process's start of a run to ``attempts.jsonl`` (pid, host, time, where it resumes)."""
    run_dir = Path(run_dir)
    state = latest_checkpoint_state(run_dir)
    row = {"pid": os.getpid(), "host": socket.gethostname(), "started_at": _now(), "started_unix": time.time(),
           "resume_step": state.get("step") if state else None, **info}
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / ATTEMPTS, "a") as fh:  # one short write: appends of a line do not interleave
        fh.write(json.dumps(row) + "\n")
    return row


@dataclass(frozen=True)
class RunProgress:
    """One sweep run (science §1): status, committed step and compute C of C_max."""

    run_id: str
    status: str
    step: int | None
    c: int | None
    c_max: int | None
    attempts: int
    worker: str | None
    error: str | None

    @property
    def fraction(self) -> float | None:
        return self.c / self.c_max if self.c is not None and self.c_max else None


def _run_row(run_dir: Path) -> dict:
    path = run_dir / "run.parquet"
    if not path.exists():
        return {}
    import pyarrow.parquet as pq  # only here: status stays light when there is no sweep

    try:
        rows = pq.read_table(path).to_pylist()
    except (OSError, ValueError):
        return {}
    return rows[0] if rows else {}


def sweep_progress(artifacts: str | os.PathLike[str], sweep_running: bool) -> list[RunProgress]:
    """Progress of every run folder under ``artifacts/sweep/runs``.

    Status: ``done.json``'s when the run ended, else ``run.parquet``'s; a run
    marked running while no sweep runs is reported "interrupted"; a folder
    with neither is "pending". Step and C are those of the newest committed
    checkpoint (what a resumed run starts from)."""
    runs_dir = Path(artifacts) / "sweep" / "runs"
    if not runs_dir.is_dir():
        return []
    progress = []
    for run_dir in sorted(p for p in runs_dir.iterdir() if p.is_dir()):
        row = _run_row(run_dir)
        done = _read_json(run_dir / "done.json")
        state = latest_checkpoint_state(run_dir) or {}
        status = (done or {}).get("status") or row.get("status") or "pending"
        if status == "running" and not sweep_running:
            status = "interrupted"
        c_max = row.get("c_max") or (state.get("config") or {}).get("c_max")
        attempts = read_attempts(run_dir)
        worker = f"{attempts[-1].get('host')}:{attempts[-1].get('pid')}" if attempts else None
        error = (done or {}).get("error") or row.get("error")
        progress.append(RunProgress(run_dir.name, status, state.get("step"), state.get("c"),
                                    int(c_max) if c_max else None, len(attempts), worker, error))
    return progress


@dataclass(frozen=True)
class StudyStatus:
    stages: list[StageStatus]
    runs: list[RunProgress]

    def to_json(self) -> str:
        return json.dumps({"stages": [asdict(s) for s in self.stages],
                           "runs": [dict(asdict(r), fraction=r.fraction) for r in self.runs]}, indent=1)


def _upstream(spec: StageSpec, specs: Mapping[str, StageSpec]) -> list[str]:
    """Stages whose output folder ``artifacts/<stage>`` this stage depends on."""
    names = []
    for dep in spec.deps:
        parts = Path(dep).parts
        if len(parts) >= 2 and parts[0] == "artifacts" and parts[1] in specs and parts[1] != spec.name:
            names.append(parts[1])
    return names


def study_status(study: StudyParams, artifacts: str | os.PathLike[str],
                 specs: Mapping[str, StageSpec] | None = None, repo: Path = REPO) -> StudyStatus:
    """Every stage's status and every sweep run's progress."""
    specs = load_stage_specs(repo / "dvc.yaml") if specs is None else specs
    stages: list[StageStatus] = []
    state: dict[str, str] = {}
    for spec in specs.values():
        status = stage_status(spec, study, artifacts, repo)
        # unchanged inputs, but a stage it reads will run again first: it will too
        upstream = [u for u in _upstream(spec, specs) if state.get(u) != "done"]
        if status.state == "done" and upstream:
            status = StageStatus(spec.name, "stale", status.finished_at,
                                 "after " + ", ".join(f"{u} ({state[u]})" for u in upstream))
        state[spec.name] = status.state
        stages.append(status)
    running = state.get("sweep") == "running"
    return StudyStatus(stages, sweep_progress(artifacts, running))


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    return "\n".join("  ".join(str(x).ljust(w) for x, w in zip(line, widths)).rstrip() for line in [header, *rows])


def format_status(status: StudyStatus) -> str:
    """The human-readable table ``rollscale status`` prints."""
    out = [_table(("stage", "state", "finished", "detail"),
                  [(s.stage, s.state, s.finished_at or "-", s.detail) for s in status.stages])]
    if status.runs:
        rows = []
        for r in status.runs:
            c = f"{r.c:,}" if r.c is not None else "-"
            c_max = f"{r.c_max:,}" if r.c_max else "-"
            pct = f"{r.fraction:.0%}" if r.fraction is not None else "-"
            rows.append((r.run_id, r.status, "-" if r.step is None else str(r.step), f"{c} / {c_max}", pct,
                         str(r.attempts) if r.attempts else "-", r.worker or "-", (r.error or "")[:80]))
        out += ["", f"sweep runs ({len(status.runs)}; step and C of the last checkpoint):",
                _table(("run_id", "status", "step", "C / C_max", "done", "attempts", "worker", "error"), rows)]
    return "\n".join(out)
