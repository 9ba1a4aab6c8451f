"""Ctrl-C (SIGINT) and SIGTERM in the processes that drive a stage or the study.

A terminal's Ctrl-C reaches every process of the foreground group; a service
manager's SIGTERM often does too. The driver's first signal raises
:class:`Interrupted` in its main thread (work in other threads stops at its next
:func:`check`), repeated signals are ignored (the same Ctrl-C arrives once from
the terminal and once forwarded by the ``rollscale`` command), and a watchdog
ends the process :data:`GRACE_S` seconds after the first signal whatever it is
waiting on. Nothing partial is committed either way: every result file is
written atomically and a run's checkpoint is whole or absent, so an exit at
any moment keeps what was finished. Exit status 128 + the signal's number
(130 for SIGINT, 143 for SIGTERM), as a shell reports a process the signal ended.

Plain functions over the ``signal`` module; no Prefect.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence

SIGNALS = (signal.SIGINT, signal.SIGTERM)
# the watchdog's limit: a driver ends this long after the first signal, within the 10 s a person
# (or a service manager, before its SIGKILL) waits; the study waits on its stage, so it gets more
GRACE_S = 7.0
STUDY_GRACE_S = 8.5

# Python runs signal handlers in the main thread, one at a time: no lock guards this state
_received: list[int] = []  # the first signal's number, once one arrived
# what the watchdog prints when it has to end the process, and after how long
_watch: dict = {"line": None, "grace_s": GRACE_S, "on_signal": None}
_printed = threading.Event()


class Interrupted(KeyboardInterrupt):
    """The process was asked to stop by ``signum``. A :class:`KeyboardInterrupt`, so no
    ``except Exception`` on the way up records it as a failure."""

    def __init__(self, signum: int = signal.SIGINT) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def exit_code(signum: int) -> int:
    """128 + the signal's number: 130 for SIGINT, 143 for SIGTERM."""
    return 128 + int(signum)


def signal_of(err: BaseException) -> int:
    """The signal behind an interrupt: its own for :class:`Interrupted`, the first one received,
    else SIGINT (a bare ``KeyboardInterrupt``)."""
    return getattr(err, "signum", None) or received() or signal.SIGINT


def interrupted_line(stage: str, signum: int, kept: str, command: str) -> str:
    """The one line an interrupted stage ends with: what it kept and how to go on."""
    return f"{stage}: interrupted ({signal.Signals(signum).name}); {kept}: rerun `{command}` to go on"


def received() -> int | None:
    """The first signal this process received, or None."""
    return _received[0] if _received else None


def check() -> None:
    """Raise :class:`Interrupted` when a signal arrived: the cooperative stop of work running in
    a thread (an in-process worker), called between steps."""
    if _received:
        raise Interrupted(_received[0])


def note(signum: int) -> bool:
    """Record that ``signum`` arrived; True the first time (the watchdog then starts)."""
    first = not _received
    if first:
        _received.append(signum)
    if first and _watch["line"] is not None:
        threading.Thread(target=_watchdog, args=(signum,), name="interrupt-watchdog", daemon=True).start()
    return first


def handle(signum: int, frame=None) -> None:
    """The SIGINT and SIGTERM handler :func:`install` sets (callable by a library's own handler)."""
    if note(signum):
        if _watch["on_signal"] is not None:  # an event loop's owner stops it its own way
            _watch["on_signal"](signum)
            return
        raise Interrupted(signum)
    # else the same request again (terminal and forwarded copies): the first one is being handled


def stop_with(on_signal: Callable[[int], None] | None) -> None:
    """Call ``on_signal(signum)`` on the first signal instead of raising :class:`Interrupted`
    (an asyncio loop must be stopped from within, not broken by an exception); None: raise again."""
    _watch["on_signal"] = on_signal


def _watchdog(signum: int) -> None:
    threading.Event().wait(_watch["grace_s"])
    try:
        line = _watch["line"](signum)
    except Exception as err:  # noqa: BLE001 - the process ends either way
        line = f"rollscale: interrupted ({type(err).__name__} while saying what was kept)"
    say(line)
    if os.environ.get("ROLLSCALE_DEBUG", "").strip().lower() not in ("", "0", "false", "no"):
        import faulthandler

        faulthandler.dump_traceback(all_threads=True)  # where it was still waiting
    exit_now(exit_code(signum))


def install(final_line: Callable[[int], str] | None = None, grace_s: float = GRACE_S) -> None:
    """Handle SIGINT and SIGTERM in this (main) thread as described above. ``final_line(signum)``
    is the line printed when the watchdog has to end the process."""
    _watch.update(line=final_line, grace_s=grace_s)
    reassert()


def reassert() -> None:
    """Put this module's handlers back (libraries such as Prefect's flow engine install their own
    SIGTERM handler for the duration of a flow run). Only the main thread can."""
    if threading.current_thread() is threading.main_thread():
        for signum in SIGNALS:
            signal.signal(signum, handle)


def say(line: str) -> None:
    """Print the one line that ends an interrupted command (once per process)."""
    if not _printed.is_set():
        _printed.set()
        print(line, file=sys.stderr, flush=True)


def said_by_child() -> None:
    """The process this one waited on printed the line: this one prints none."""
    _printed.set()


def exit_now(code: int) -> None:
    """End the process at once with ``code`` (threads still working are not waited for)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def run_forwarding(cmd: Sequence[str], **popen_kwargs) -> int:
    """Run ``cmd`` and return its exit status, forwarding SIGINT and SIGTERM to it.

    The caller does not stop on a signal itself: the child ends its work (and prints what it
    kept) and its exit status, 130 or 143, becomes the caller's. When the signal came to the
    whole process group the child gets it twice, which :func:`install`'s handlers allow."""
    got: list[int] = []
    child: list[subprocess.Popen] = []

    def forward(signum: int, frame) -> None:
        got.append(signum)
        for proc in child:
            try:
                proc.send_signal(signum)
            except OSError:
                pass

    previous = {signum: signal.signal(signum, forward) for signum in SIGNALS}
    try:
        if got:  # before the child started: nothing to stop
            return exit_code(got[0])
        child.append(subprocess.Popen(list(cmd), **popen_kwargs))
        if got:  # while it was being started
            forward(got[0], None)
        return child[0].wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
