import os
import tempfile
from pathlib import Path

# Prefect state (ephemeral server database, cached task results) goes to a
# throw-away folder per test session, never the user's ~/.prefect.
# (pytest-xdist workers inherit the controller's environment: each gets a folder of its own, so
# their Prefect servers never share one SQLite database)
if os.environ.get("PYTEST_XDIST_WORKER") or "PREFECT_HOME" not in os.environ:
    os.environ["PREFECT_HOME"] = tempfile.mkdtemp(prefix="rollscale-prefect-")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
# Under pytest-xdist every worker is a process of its own on the 2 shared cores: torch's default of
# one thread per core in each would put 4 threads on 2 cores (two torch threads per core ran 18x
# slower here). Set before torch is imported; stage subprocesses set their own (study.torch_threads).
if os.environ.get("PYTEST_XDIST_WORKER"):
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(name, "1")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")

import pytest  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session", autouse=True)
def prefect_server():
    """One Prefect API server for the whole session: every flow the tests start (in this process
    or in `python -m flows` subprocesses, which inherit PREFECT_API_URL) reports to it instead of
    starting a temporary server of its own (~15 s each on a 2-core machine). Tests that need a
    server of their own (tests/test_schedule.py) set PREFECT_API_URL themselves."""
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    if os.environ.get("PREFECT_API_URL"):  # the caller's server
        yield os.environ["PREFECT_API_URL"]
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(Path(os.environ["PREFECT_HOME"]) / "server.log", "w")
    server = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                               "--port", str(port)], stdout=log, stderr=subprocess.STDOUT,
                              env={**os.environ, "PREFECT_UI_ENABLED": "false"}, start_new_session=True)
    url = f"http://127.0.0.1:{port}/api"
    deadline = time.monotonic() + 180
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5):
                break
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                raise RuntimeError(f"the tests' Prefect server did not start (log: {log.name})") from None
            time.sleep(0.5)
    os.environ["PREFECT_API_URL"] = url
    try:
        yield url
    finally:
        os.environ.pop("PREFECT_API_URL", None)
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()
SHARED_DATA = REPO.parent / "shared" / "data"


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"reference data not found at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture(scope="session")
def dvc_study(tmp_path_factory):
    """The whole study on a small config through `dvc repro`, built once per test session; each worker
    gets its own copy (tests edit its params.yaml and rerun stages in it)."""
    import shutil

    from tests.shared_builds import built_once
    from tests.test_dvc import build_study, study_env

    built = built_once(tmp_path_factory, "dvc-study", build_study)
    root = tmp_path_factory.mktemp("study")
    shutil.copytree(built, root, symlinks=True, dirs_exist_ok=True, copy_function=shutil.copy2)
    return root, study_env()
