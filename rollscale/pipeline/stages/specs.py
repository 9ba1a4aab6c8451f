"""The study's stages as ``dvc.yaml`` declares them, what DVC says is stale, and
the lock a running stage holds.

DVC is the one judge of what reruns: a stage is stale when ``dvc status``
says so (its params, code deps or upstream outputs changed since ``dvc.lock``
recorded it), so ``dvc repro``, ``rollscale study`` and the served deployment
can never disagree. A running stage holds an OS file lock
(``artifacts/<stage>/.stage.lock``, via :mod:`filelock`), released by the
kernel when its process dies, and ``.stage.run.json`` says who holds it.

Plain functions over files; no Prefect. Times are UTC ISO strings.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import json
import logging
import os
import signal
import socket
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from filelock import FileLock, Timeout

from rollscale.files import write_json_atomic

log = logging.getLogger("rollscale.pipeline.stages.specs")

LOCK = ".stage.lock"
RUN_INFO = ".stage.run.json"
# in the artifacts folder: held by the `rollscale study` or `rollscale run` that works in it (one at a time)
STUDY_LOCK = ".study.lock"
FAILED = ".stage.failed.json"
# how the stage's last command ended when it failed or refused: its one line and exit status, which
# `rollscale study` passes on (DVC reports every failed stage as exit 255)
STAGE_EXIT = ".stage.exit.json"
# set to "1" by `rollscale run sweep --archive-stale` / `rollscale study --archive-stale`: a DVC stage
# command takes no flags, so the consent to archive ended sweep runs reaches the stage this way
ARCHIVE_STALE_ENV = "ROLLSCALE_ARCHIVE_STALE"
# a lock held this long is a running stage's: a look by stage_running (`status`, another study) holds it for
# microseconds, and a stage starting then must not refuse because of it (two studies started together)
PROBE_S = 0.5
# tried this often within PROBE_S: filelock's default 50 ms gives 10 tries, and a look in each of them (a status
# polled in a loop on a loaded machine) refused a stage starting then (CI-like run)
PROBE_POLL_S = 0.005
# a stage writes who it is right after taking its lock: a refusal waits this long to name it
HOLDER_WAIT_S = 3.0


class StageBusyError(RuntimeError):
    """The stage is already running in a live process; two writers would mix their outputs."""


class StageFailedError(RuntimeError):
    """A stage that ``dvc repro`` ran failed or refused; ``code``: its own exit status."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


class ArtifactsNotWritableError(OSError):
    """The artifacts folder cannot be written (read-only, permissions, full disk)."""

    def __str__(self) -> str:  # the message alone, without OSError's "[Errno n]" prefix
        return str(self.strerror)


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def project_root(start: str | os.PathLike[str] | None = None) -> Path:
    """The project folder (holding ``dvc.yaml``: a clone of rollscale, or a study folder that
    ``rollscale init`` wrote): ``start`` (default the working directory) or the nearest folder above it."""
    here = Path(start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "dvc.yaml").is_file():
            return folder
    raise FileNotFoundError(f"no study in {here} or above (no dvc.yaml): run `rollscale init --model M --data D` "
                            "in an empty folder to start one there, or run rollscale from a study's folder")


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


def load_stage_specs(root: str | os.PathLike[str] | None = None) -> dict[str, StageSpec]:
    """The stages of the project's ``dvc.yaml`` in file order (the study's order), name -> spec."""
    path = project_root(root) / "dvc.yaml"
    with path.open(encoding="utf-8") as stream:  # the file's name goes with a parse error (rollscale.pipeline.errors)
        raw = yaml.safe_load(stream)
    stages = (raw or {}).get("stages")
    if not isinstance(stages, dict) or not stages:
        raise ValueError(f"{path}: expected a non-empty 'stages' mapping")
    return {
        name: StageSpec(name, _entry_names(body.get("deps"), "deps", name),
                        _entry_names(body.get("params"), "params", name))
        for name, body in stages.items()
    }


def select_stages(specs: Mapping[str, StageSpec], stages: list[str] | None) -> list[str]:
    """The chosen stages in study order; None or empty = all of them."""
    if not stages:
        return list(specs)
    unknown = [s for s in stages if s not in specs]
    if unknown:
        raise ValueError(f"stages: unknown stage(s) {unknown} (dvc.yaml has: {', '.join(specs)})")
    return [s for s in specs if s in stages]


def upstream(spec: StageSpec, specs: Mapping[str, StageSpec]) -> list[str]:
    """Stages whose output folder ``artifacts/<stage>`` this stage depends on."""
    names = []
    for dep in spec.deps:
        parts = Path(dep).parts
        if len(parts) >= 2 and parts[0] == "artifacts" and parts[1] in specs and parts[1] != spec.name:
            names.append(parts[1])
    return names


# ---------------------------------------------------------------------------- DVC


def dvc_changes(root: str | os.PathLike[str] | None = None, stage: str | None = None) -> dict[str, list[str]]:
    """What ``dvc status`` reports changed, stage -> readable reasons; stages not listed are
    up to date with ``dvc.lock``. Only the stage itself is compared (not its upstream)."""
    from dvc.exceptions import NotDvcRepoError
    from dvc.repo import Repo

    folder = project_root(root)
    try:
        repo = Repo(str(folder))
    except NotDvcRepoError:  # a study folder copied without its .dvc/: say so, never "internal error"
        raise FileNotFoundError(f"{folder}: dvc.yaml but no DVC repository (.dvc/): run `dvc init` there "
                                "(`rollscale init` makes one), or work in the study's own folder") from None
    with repo:
        raw = repo.status(targets=[stage] if stage else None)
    changes: dict[str, list[str]] = {}
    for name, entries in raw.items():
        name = name.split(":")[-1]  # "dvc.yaml:stage" when targets are given
        reasons = []
        for entry in entries:
            if isinstance(entry, str):
                reasons.append(entry)
                continue
            for kind, items in entry.items():
                for path, how in (items.items() if isinstance(items, dict) else [(items, "")]):
                    if isinstance(how, dict):  # a params file: key -> modified / new / deleted
                        reasons += [f"param {key} ({path}): {change}" for key, change in how.items()]
                    else:
                        reasons.append(f"{kind.replace('changed ', '')} {path}: {how}".strip())
        changes[name] = reasons
    return changes


# ---------------------------------------------------------------------------- stage lock


def read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, NotADirectoryError):
        return None
    except ValueError:
        return {}  # half-written or damaged: present but unreadable
    return data if isinstance(data, dict) else {}


# the stage locks this process holds (path -> pid; a forked worker inherits the dict, not the lock): probed, each look
# timed out after PROBE_S, 0.5 s per table of its own stage per read (35 s of a 42 s fit that rewrote its tables)
_HELD: dict[Path, int] = {}


def stage_running(artifacts: str | os.PathLike[str], stage: str) -> bool:
    """Whether a live process (this one included) holds the stage's lock now."""
    path = Path(artifacts) / stage / LOCK
    if not path.exists():
        return False
    if _HELD.get(path.resolve()) == os.getpid():
        return True
    lock = FileLock(path)
    try:
        lock.acquire(timeout=PROBE_S, poll_interval=PROBE_POLL_S)
    except Timeout:
        return True
    except OSError:
        return False  # cannot lock (read-only folder): nobody can be writing there
    lock.release()
    return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def _lock_holders(path: Path) -> list[int]:
    """Processes of this machine with ``path`` open (Linux's /proc; none elsewhere)."""
    target, pids = str(path.resolve()), []
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        with contextlib.suppress(OSError):
            if any(os.readlink(fd) == target for fd in fd_dir.iterdir()):
                pids.append(int(fd_dir.parent.name))
    return [p for p in pids if p != os.getpid()]


def _command_of(pid: int) -> str:
    with contextlib.suppress(OSError):
        words = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        return " ".join(w for w in words if w)[:120]
    return ""


def holder(stage: str, artifacts: str | os.PathLike[str], wait_s: float = HOLDER_WAIT_S) -> dict:
    """The run record of the live process that holds ``stage``'s lock: it writes it just after taking the
    lock, so a record still missing (or a dead run's, left by a kill) is waited for up to ``wait_s``; then
    the process holding the lock file open on this machine; {} when neither says."""
    folder, host = Path(artifacts) / stage, socket.gethostname()
    deadline = time.monotonic() + wait_s
    while True:
        held = read_json(folder / RUN_INFO) or {}
        pid = held.get("pid")
        if isinstance(pid, int) and "interrupted_at" not in held and (held.get("host") != host or _alive(pid)):
            return held
        if time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    pids = _lock_holders(folder / LOCK)
    return {"pid": pids[0], "host": host, "command": _command_of(pids[0])} if pids else {}


def busy_error(stage: str, artifacts: str | os.PathLike[str]) -> StageBusyError:
    """The one-line refusal of a stage that a live process runs now, naming that process (:func:`holder`)."""
    held = holder(stage, artifacts)
    if not held:
        return StageBusyError(f"stage {stage!r} is already running in another process (it has not said which: "
                              "`rollscale status` names it); wait for it to end and run again")
    what = (f"pid {held['pid']} on {held.get('host')}" + (f", since {held['started_at']}" if held.get("started_at")
                                                             else "")
            + (f": {held['command']}" if held.get("command") else ""))
    return StageBusyError(f"stage {stage!r} is already running ({what}); wait for it or stop that process first")


def _not_writable(folder: Path, stage: str, err: OSError) -> ArtifactsNotWritableError:
    return ArtifactsNotWritableError(
        err.errno or errno.EIO,
        f"artifacts folder {folder} is not writable ({os.strerror(err.errno) if err.errno else err}): "
        f"stage {stage!r} did not start; "
        "earlier results are unchanged; free space or fix the permissions and run it again",
    )


@contextlib.contextmanager
def study_lock(artifacts: str | os.PathLike[str], command: str) -> Iterator[None]:
    """Hold the study folder for ``command`` (`rollscale study` or `rollscale run`): a second one refuses at once,
    in one line naming the running pid (:class:`StageBusyError`), before DVC or any stage starts; two studies in
    one folder would wait on DVC's lock and put stages back from its cache under each other. The lock is the
    kernel's (``flock``): a killed holder frees it. A folder where the lock cannot be made (read-only) is left to
    the stage's own lock, which says so."""
    import fcntl

    path = Path(artifacts) / STUDY_LOCK
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise _study_busy(path) from None
        try:  # who holds it, for the refusal's line; a full disk leaves it unsaid (the stage's check names the folder)
            os.ftruncate(fd, 0)
            os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "command": command,
                                     "started_at": now()}).encode())
        except OSError:
            pass
        yield
    finally:
        os.close(fd)


def _study_busy(path: Path) -> StageBusyError:
    held = read_json(path) or {}
    pid = held.get("pid") or next(iter(_lock_holders(path)), None)
    what = ", ".join(str(x) for x in (f"pid {pid}" if pid else "", held.get("command"),
                                      held.get("started_at") and f"since {held['started_at']}") if x)
    return StageBusyError(f"another rollscale command works in {path.parent} ({what or 'it has not said which'}); "
                          "one study per folder: wait for it to end (`rollscale status`) or stop it first")


@contextlib.contextmanager
def stage_lock(stage: str, artifacts: str | os.PathLike[str]) -> Iterator[dict]:
    """Run a stage under its lock; on an exception ``.stage.failed.json`` records it.

    Taking the lock is the stage's first write, so a stage already running
    (:class:`StageBusyError`) or an unwritable or full artifacts folder
    (:class:`ArtifactsNotWritableError`) fails here, before any work. A run
    that was killed left ``.stage.run.json`` without a lock holder, and one
    stopped by Ctrl-C or SIGTERM left it with the signal and time: reported
    "interrupted" until the next run takes over.
    """
    folder = Path(artifacts) / stage
    info = {"stage": stage, "pid": os.getpid(), "host": socket.gethostname(), "started_at": now()}
    try:
        folder.mkdir(parents=True, exist_ok=True)
        held = (folder / LOCK).resolve()
        lock = FileLock(folder / LOCK)
        # not 0: another command's look at the lock must not refuse this run
        lock.acquire(timeout=PROBE_S, poll_interval=PROBE_POLL_S)
    except Timeout:
        raise busy_error(stage, artifacts) from None
    except OSError as err:
        raise _not_writable(folder, stage, err) from err
    _HELD[held] = os.getpid()
    try:
        previous = read_json(folder / RUN_INFO)
        if previous:
            log.warning("stage %s: the run of pid %s on %s (started %s) stopped without finishing; starting again",
                        stage, previous.get("pid"), previous.get("host"), previous.get("started_at"))
        try:
            write_json_atomic(info, folder / RUN_INFO)
        except OSError as err:
            raise _not_writable(folder, stage, err) from err
        t0 = time.perf_counter()
        interrupted = False
        try:
            yield info
        except KeyboardInterrupt as err:  # Ctrl-C or SIGTERM: the run record stays, saying so
            interrupted = True
            with contextlib.suppress(OSError):
                write_json_atomic(interrupted_info(info, err), folder / RUN_INFO)
            raise
        except BaseException as err:
            with contextlib.suppress(OSError):
                write_json_atomic({**info, "error": f"{type(err).__name__}: {err}"[:2000], "failed_at": now()},
                                  folder / FAILED)
            raise
        else:
            log.info("stage %s: finished in %.1f s", stage, time.perf_counter() - t0)
            (folder / FAILED).unlink(missing_ok=True)
        finally:
            if not interrupted:
                (folder / RUN_INFO).unlink(missing_ok=True)
    finally:
        _HELD.pop(held, None)
        lock.release()


def interrupted_info(info: dict, err: BaseException) -> dict:
    """The run record of a stage stopped by a signal: when and by which (``rollscale status``
    reports it "interrupted", and the next run takes over)."""
    from rollscale.pipeline.interrupts import signal_of

    return {**info, "interrupted_at": now(), "signal": signal.Signals(signal_of(err)).name}
