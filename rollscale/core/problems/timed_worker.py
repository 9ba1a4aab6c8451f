"""One worker process that runs a function with a wall-clock bound on each call,
killed and replaced when a call overruns.

Why :func:`rollscale.core.problems.rewards.math_reward` needs it: math-verify bounds its
work with ``signal.alarm``, which works only in a process's main thread.
Prefect runs tasks in worker threads, where that timeout must be off, and a
pathological answer such as ``10^{10^{10}}`` then computes forever while
holding the GIL, freezing every thread (measured). In the worker the check
runs in the main thread with math-verify's own timeouts, and the parent kills
the worker when even those fail.

The worker is a fresh interpreter, ``python -m rollscale.core.problems.timed_worker``
(``subprocess``: fork and exec), not a ``multiprocessing`` child:
``spawn`` re-imports the caller's main script in the child, so a user's plain
script without an ``if __name__ == "__main__":`` guard (most reward scripts)
ran itself again there and the pool never started (it hung 120 s); ``fork``
can deadlock a process with threads. Calls and results travel pickled over
two pipes (:class:`multiprocessing.connection.Connection`), so a function is
sent by its module and name, and must be importable (not defined in
``__main__``). One worker serves all threads, one call at a time (a check
takes milliseconds).
"""

from __future__ import annotations

import logging
import os
import pickle
import subprocess
import sys
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["TimedWorker"]

# the folder holding the rollscale package: the worker imports the same code as its parent
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


class TimedWorker:
    """A worker process started on first use; ``call`` runs a function there with a time bound."""

    def __init__(self, initializer: Callable[[], None] | None = None, start_timeout_s: float = 120.0) -> None:
        self._initializer = initializer
        self._start_timeout_s = start_timeout_s
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._conn: tuple[Connection, Connection] | None = None
        self._owner_pid: int | None = None

    def stop(self) -> None:
        """Kill the worker (a later call starts a fresh one)."""
        if self._proc is not None and self._owner_pid == os.getpid():
            self._proc.kill()
            self._proc.wait()
            for conn in self._conn or ():
                conn.close()
        self._proc, self._conn = None, None

    def _start(self) -> None:
        child_in, parent_out = os.pipe()
        parent_in, child_out = os.pipe()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (_PACKAGE_ROOT, os.environ.get("PYTHONPATH")) if p)}
        try:
            self._proc = subprocess.Popen([sys.executable, "-m", "rollscale.core.problems.timed_worker", str(child_in),
                                           str(child_out)], pass_fds=(child_in, child_out), env=env,
                                          stdin=subprocess.DEVNULL)
        finally:
            os.close(child_in)
            os.close(child_out)
        self._owner_pid = os.getpid()
        self._conn = (Connection(parent_in, writable=False), Connection(parent_out, readable=False))
        receive, send = self._conn
        try:
            send.send(self._initializer)
            ready = receive.poll(self._start_timeout_s) and receive.recv()
        except (EOFError, OSError):
            ready = None
        if not (isinstance(ready, tuple) and ready[0] == "ready"):
            self.stop()
            why = ready[1] if isinstance(ready, tuple) else f"no answer in {self._start_timeout_s:.0f} s"
            raise RuntimeError(f"worker process did not start ({why})")

    def call(self, fn: Callable[..., Any], args: tuple, timeout_s: float, default: Any) -> Any:
        """``fn(*args)`` in the worker; ``default`` if it takes longer than ``timeout_s`` seconds,
        raises, or the worker dies (a fresh worker is started for the next call when it was killed)."""
        with self._lock:
            if self._proc is None or self._owner_pid != os.getpid():  # not started, or inherited through fork
                self._start()
            receive, send = self._conn
            try:
                call = pickle.dumps((fn, args))
            except Exception as err:  # noqa: BLE001 - pickle raises several types; nothing was sent
                raise ValueError(f"{fn!r} cannot be sent to the worker process ({err}): give a function "
                                 "defined at the top level of an importable module") from None
            try:
                send.send_bytes(call)
                if receive.poll(timeout_s):
                    kind, value = receive.recv()
                    if kind == "ok":
                        return value
                    logger.warning("worker call failed (%s)", value)
                    return default
                logger.warning("worker call exceeded %.1f s; restarting the worker", timeout_s)
            except (EOFError, OSError) as err:
                logger.warning("worker failed (%s); restarting it", err)
            self.stop()
            return default


def _serve(fd_in: int, fd_out: int) -> None:
    """The worker's loop: run the initializer, say ready, then answer calls until the parent goes."""
    receive, send = Connection(fd_in, writable=False), Connection(fd_out, readable=False)
    try:
        initializer = pickle.loads(receive.recv_bytes())
        if initializer is not None:
            initializer()
    except Exception as err:  # noqa: BLE001 - told to the parent, which raises it
        send.send(("failed", f"{type(err).__name__}: {err}"))
        return
    send.send(("ready", os.getpid()))
    while True:
        try:
            call = receive.recv_bytes()
        except (EOFError, OSError):
            return  # the parent closed the pipe or exited
        try:
            fn, args = pickle.loads(call)  # a function of __main__ cannot be found here: an error, not a crash
            send.send(("ok", fn(*args)))
        except Exception as err:  # noqa: BLE001 - the caller scores its default
            send.send(("error", f"{type(err).__name__}: {err}"))


if __name__ == "__main__":
    _serve(int(sys.argv[1]), int(sys.argv[2]))
