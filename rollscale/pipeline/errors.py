"""Errors a person can read: what went wrong, where (file, key, row) and what to do,
in one or two lines on stderr, and a non-zero exit status.

The full traceback is shown with ``rollscale --debug`` or ``ROLLSCALE_DEBUG=1``.
Exit status: 2 for bad input (params, data rows, buckets, queries), 1 for the
environment (a stage already running, a full or unwritable disk, missing files),
3 for an error the project did not foresee (a bug: please report it with the
``--debug`` output); 130 after Ctrl-C and 143 after SIGTERM
(:mod:`rollscale.pipeline.interrupts`).
"""

from __future__ import annotations

import errno
import os
import sys
import traceback
from collections.abc import Callable

DEBUG_ENV = "ROLLSCALE_DEBUG"
MAX_CHARS = 400  # a message longer than this is cut: the place comes first in every message


def debug_enabled(flag: bool = False) -> bool:
    return flag or os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no")


def _first_lines(text: str, n: int = 2) -> str:
    lines = [line.strip() for line in str(text).strip().splitlines() if line.strip()]
    short = " ".join(lines[:n])
    return short if len(short) <= MAX_CHARS else short[: MAX_CHARS - 1] + "…"


def _is(err: BaseException, name: str) -> bool:
    """``err`` is an instance of the project's error class ``name``. Matched by name so this module
    imports none of the modules that raise them (each stage would otherwise depend on all of them)."""
    return any(cls.__name__ == name and cls.__module__.startswith("rollscale.") for cls in type(err).__mro__)


def _is_dvc(err: BaseException, name: str) -> bool:
    """``err`` is DVC's error class ``name`` (or derives from it)."""
    return any(cls.__name__ == name and cls.__module__.startswith("dvc") for cls in type(err).__mro__)


def _dvc_yaml_error(err: BaseException) -> tuple[str, int]:
    """A YAML file DVC reads that does not parse (or is not UTF-8 text): which, where, and how to get it back."""
    path = str(getattr(err, "path", "") or "a YAML file")
    mark = getattr(err.__cause__, "problem_mark", None)
    where = f" (line {mark.line + 1})" if mark is not None else ""
    name = os.path.basename(path)
    what = "UTF-8 text" if _is_dvc(err, "EncodingError") else "valid YAML"
    if name == "dvc.lock":  # written by the tool, never by hand: restoring it or starting it over both work
        return (f"{name} is not {what}{where}: it is DVC's record of what produced the results; restore it "
                "(`git checkout dvc.lock` in a clone) or delete it (DVC then runs every stage again)"), 1
    return f"{name} is not {what}{where}: fix it, or restore it (`git checkout {name}`)", 2


def _yaml_error(err: BaseException) -> tuple[str, int]:
    """A YAML file of the study (dvc.yaml, as rollscale reads it) that does not parse: which, where, the fix."""
    mark = getattr(err, "problem_mark", None)
    name = str(getattr(mark, "name", "") or "")
    name = os.path.basename(name) if name and not name.startswith("<") else "a YAML file of the study (dvc.yaml?)"
    where = f" (line {mark.line + 1})" if mark is not None else ""
    return (f"{name} is not valid YAML{where}: {getattr(err, 'problem', None) or _first_lines(err, 1)}; fix it, or "
            f"restore it (`git checkout {name if '(' not in name else 'dvc.yaml'}`)"), 2


def explain(err: BaseException) -> tuple[str, int]:
    """The message to print for ``err`` and the exit status."""
    if _is(err, "ParamsError"):  # one line per bad key, each naming its key path
        return "\n  ".join(line.strip() for line in str(err).strip().splitlines()[:8] if line.strip()), 2
    if _is(err, "DataRowError"):
        return f"bad data row at {err.where}: {_first_lines(err.reason, 1)}; fix or remove that row", 2
    if _is(err, "BucketError"):
        return f"bucket: {_first_lines(err, 1)} (params.yaml, section bucket)", 2
    # a LookupError the project raises says what is missing and the fix; a bare KeyError (a one-word message, the
    # key) is raised by no code of the project: a bug, or a file read unchecked, shown as internal error below
    if _is(err, "QueryError") or (isinstance(err, LookupError) and not isinstance(err, KeyError)):
        return _first_lines(err.args[0] if err.args else err), 2
    if _is(err, "DamagedResultError") or _is(err, "StageBusyError"):
        return _first_lines(err), 1
    if _is(err, "StageFailedError"):  # the stage's own message and exit status, passed on
        return _first_lines(err, 1), err.code
    if type(err).__name__ == "LockError" and type(err).__module__.startswith("dvc"):  # as a stage already running
        what = _first_lines(err, 1).split(", it is being blocked")[0].rstrip(": ")  # DVC lists the holders below
        return (f"another DVC command is using this project ({what}); wait for it to end (`rollscale status` "
                "shows what runs) and run again"), 1
    if _is_dvc(err, "SCMError"):  # a clone's DVC works through git: the folder lost its .git
        return (f"{_first_lines(err, 1)}: this study's DVC uses git and the folder has no .git; restore it (clone "
                "the study again), or `git init` there, or let DVC work without git: `dvc config core.no_scm true`"), 1
    if _is_dvc(err, "YAMLFileCorruptedError") or _is_dvc(err, "EncodingError"):
        return _dvc_yaml_error(err)
    if any(cls.__module__.startswith("yaml") and cls.__name__ == "YAMLError" for cls in type(err).__mro__):
        return _yaml_error(err)
    if isinstance(err, OSError):
        where = f" ({err.filename})" if err.filename and str(err.filename) not in str(err.strerror) else ""
        text = _first_lines(err.strerror or err) + where
        if err.errno in (errno.ENOSPC, errno.EDQUOT) and "free space" not in text:
            text += "; the disk is full: free space and run the stage again (finished work is kept)"
        return text, 1
    if isinstance(err, RuntimeError) and "ephemeral Prefect API server" in str(err):
        return ("the Prefect server did not start in time (machine busy?): run again, or raise "
                "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS, or point PREFECT_API_URL at a running server"), 1
    if type(err).__name__ == "BrokenProcessPool":  # a worker process killed (by hand, or the kernel's OOM killer)
        return ("a worker process ended abruptly (killed, or out of memory): finished work is kept and every "
                "unfinished run keeps its last checkpoint; run the stage again to resume (fewer `workers` if it "
                "was memory)"), 1
    if isinstance(err, ImportError):  # a module the settings need is not installed here (vLLM, a plugin's)
        text = _first_lines(err, 1)
        if text.startswith("No module named"):
            text += ": install it here, or change the setting in params.yaml that needs it (`rollscale check` names it)"
        return text, 1
    if isinstance(err, MemoryError):  # sizes that pass the check but not this machine's memory
        return (f"out of memory ({_first_lines(err, 1) or 'MemoryError'}): lower the sizes in params.yaml (workers, "
                "sampling.max_new_tokens, sweep.b_max) or free memory, and run again (finished work is kept)"), 1
    if isinstance(err, ValueError):
        return _first_lines(err), 2
    return f"internal error {type(err).__name__}: {_first_lines(err, 1)} (run with --debug for the traceback)", 3


def run_guarded(fn: Callable[[], object], debug: bool = False, prog: str = "rollscale",
                on_error: Callable[[str, int], object] | None = None) -> int:
    """Call ``fn``; print any error as :func:`explain` says (plus the traceback when debugging);
    ``on_error(message, exit status)`` is told it too."""
    try:
        fn()
    except KeyboardInterrupt as err:  # Ctrl-C or SIGTERM: 130 / 143, one line (the caller's, if it said one)
        from rollscale.pipeline.interrupts import exit_code, say, signal_of

        say(f"{prog}: interrupted; finished work is kept and the next run resumes it")
        return exit_code(signal_of(err))
    except Exception as err:  # noqa: BLE001 - the one place every error becomes a message
        if debug_enabled(debug):
            traceback.print_exc()
        message, code = explain(err)
        print(f"{prog}: {message}", file=sys.stderr)
        if on_error is not None:
            on_error(message, code)
        return code
    return 0
