"""The temporary Prefect API server a stage, the study or ``rollscale serve`` starts when
no ``PREFECT_API_URL`` is set.

Prefect would start its own temporary server as a child in the caller's process
group: a terminal's Ctrl-C then stopped the server first, and the flow, left
without its API, retried "Unable to connect to ws://127.0.0.1:…" until killed.
This one is Prefect's same server (uvicorn serving Prefect's app, UI and
services off, as Prefect starts it) run in a session of its own, so a signal
to the command's group leaves it up while the flow reports its end; the
command stops it last. It also stops by itself when the process that started
it ends (even by SIGKILL), so none is ever left behind.

    python -m rollscale.pipeline.runtime.server <parent pid> <port>     (started by :func:`prefect_api`)
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

PARENT_POLL_S = 0.5
STOP_WAIT_S = 3.0
STARTUP_TRIES = 2  # a busy machine can miss the start-up time once


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def start_server(timeout_s: float) -> tuple[subprocess.Popen, str]:
    """Start the server on a free loopback port and wait until it answers; (process, API URL)."""
    root = Path(__file__).resolve().parents[3]  # the folder holding the rollscale package
    port = free_port()
    env = {**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH")) if p)
    proc = subprocess.Popen([sys.executable, "-m", "rollscale.pipeline.runtime.server", str(os.getpid()), str(port)], cwd=root, env=env,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}/api"
    deadline = time.monotonic() + timeout_s
    try:
        while not _healthy(url):
            if proc.poll() is not None or time.monotonic() > deadline:
                why = f"it exited with {proc.returncode}" if proc.returncode is not None else f"{timeout_s:.0f} s"
                raise RuntimeError(f"Timed out while attempting to connect to ephemeral Prefect API server ({why})")
            time.sleep(0.2)
    except BaseException:
        stop_server(proc)
        raise
    return proc, url


def stop_server(proc: subprocess.Popen) -> None:
    """Ask the server to stop (SIGTERM), and kill it if it has not within :data:`STOP_WAIT_S`."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def prefect_api() -> Iterator[str]:
    """``PREFECT_API_URL`` when set, else a server of this command's own (its URL exported, so
    the stages and workers this command starts use it too). The server is stopped when the
    process exits, after Prefect's own exit handlers have sent what they hold, or at once
    when the command is interrupted (it then exits without them: nothing is left to report)."""
    if os.environ.get("PREFECT_API_URL"):
        yield os.environ["PREFECT_API_URL"]
        return
    timeout = float(os.environ.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180"))
    for attempt in range(STARTUP_TRIES):
        try:
            proc, url = start_server(timeout)
            break
        except RuntimeError:
            if attempt == STARTUP_TRIES - 1:
                raise
            print("the Prefect server did not start in time; trying once more", file=sys.stderr)
    from prefect.context import refresh_global_settings_context

    os.environ["PREFECT_API_URL"] = url  # for the processes this command starts
    # and for this one, whose Prefect read its settings at import: in every thread (a context
    # manager's settings would not reach the threads Prefect runs its clients in, which would
    # then start a temporary server of their own)
    refresh_global_settings_context()
    atexit.register(stop_server, proc)  # registered before Prefect's: runs after them
    try:
        yield url
    except KeyboardInterrupt:
        stop_server(proc)
        raise


def serve_until_parent_exits(parent: int, port: int) -> None:
    """Serve Prefect's API on ``port`` until SIGTERM, or until process ``parent`` has ended."""
    import uvicorn

    def watch_parent() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os.kill(os.getpid(), signal.SIGTERM)  # uvicorn's graceful stop
        time.sleep(10)
        os._exit(1)

    threading.Thread(target=watch_parent, name="parent-watch", daemon=True).start()
    uvicorn.run("prefect.server.api.server:create_app", factory=True, host="127.0.0.1", port=port,
                log_level="error", lifespan="on")


if __name__ == "__main__":
    serve_until_parent_exits(int(sys.argv[1]), int(sys.argv[2]))
