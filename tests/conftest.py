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
# The machine's cache (rollscale.files.cache_dir: dequantised GGUF files, the report's vega scripts) is one
# folder per test session, never the user's ~/.cache: made by the controller (or a run without xdist), inherited by
# the workers and their stage processes, which share it; removed when the session ends (SmolLM2's entry ~0.5 GB).
OWN_CACHE = None
if "ROLLSCALE_CACHE" not in os.environ:
    OWN_CACHE = os.environ["ROLLSCALE_CACHE"] = tempfile.mkdtemp(prefix="rollscale-cache-")
# Under pytest-xdist every worker is a process of its own on the 2 shared cores: torch's default of
# one thread per core in each would put 4 threads on 2 cores (two torch threads per core ran 18x
# slower here). Set before torch is imported; stage subprocesses set their own (study.torch_threads).
if os.environ.get("PYTEST_XDIST_WORKER"):
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(name, "1")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")

import pytest  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

# --dist loadfile hands each worker one file at a time, in collection order; xdist's default reorders the
# files by test count, which put the 2-test, 140 s smoke study last while the other worker sat idle, and let two
# workers wait on one shared build (tiny-study) at once. Heaviest first instead (worker-seconds per file, measured
# with --durations=0): the workers end within a small file of each other. test_dvc and test_faults lead so their
# shared builds (dvc-study, tiny-study) run at once, one per worker. A file not named here runs after these.
# test_bad_settings moved down once its 19 check cases ran in-process (19 processes of ~2 CPU-s fewer). Refreshed
# 2026-11-29 from a `make test` (1,373 s): test_long_grid (180 s of pure CPU) had run among the unnamed files near the
# end, and test_fit_report_flows and test_search_forecast unnamed too; test_repairs fell to ~35 s once a stage's look
# at its own lock stopped waiting. test_smoke_study and test_real_model stay apart (they share SmolLM2's dequantised
# cache: the second waits for the first's conversion).
HEAVY_FIRST = ("test_dvc", "test_faults", "test_smoke_study", "test_long_grid", "test_ray_sweep", "test_init",
               "test_report", "test_parallel", "test_track", "test_project", "test_real_model", "test_pipeline",
               "test_errors", "test_search_budget", "test_bad_settings", "test_search_sweep", "test_distributed",
               "test_fit_report_flows", "test_schedule", "test_search_forecast", "test_repairs", "test_engines",
               "test_export", "test_sql_cli", "test_trainer", "test_forecast", "test_stage_deps", "test_step",
               "test_bootstrap", "test_study", "test_rewards")


def pytest_configure(config):
    if hasattr(config.option, "loadscopereorder"):  # pytest-xdist: keep the order set below
        config.option.loadscopereorder = False
    # The xdist controller starts the one Prefect server its workers share (they inherit the environment):
    # a server per worker cost a second start (~15 s of both cores) and its idle load all run long. Not
    # waited for here: it starts while the workers start and collect; their fixture waits for it.
    if (config.getoption("numprocesses", None) and not os.environ.get("PYTEST_XDIST_WORKER")
            and not os.environ.get("PREFECT_API_URL")):
        config.rollscale_prefect_server = start_prefect_server()
        os.environ["PREFECT_API_URL"] = os.environ[SHARED_SERVER] = config.rollscale_prefect_server[1]


def pytest_unconfigure(config):
    if OWN_CACHE is not None:
        import shutil

        shutil.rmtree(OWN_CACHE, ignore_errors=True)
    if started := getattr(config, "rollscale_prefect_server", None):
        for name in ("PREFECT_API_URL", SHARED_SERVER):
            os.environ.pop(name, None)
        stop_prefect_server(started[0], started[2])


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))  # stable: a file's tests keep their order


# set by the pytest-xdist controller to the URL of the server it started for all its workers
SHARED_SERVER = "ROLLSCALE_TESTS_PREFECT_SERVER"


def start_prefect_server():
    """A Prefect API server on a free port, started, not yet answering: (process, url, log file)."""
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(Path(os.environ["PREFECT_HOME"]) / "server.log", "w")
    server = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                               "--port", str(port)], stdout=log, stderr=subprocess.STDOUT,
                              env={**os.environ, "PREFECT_UI_ENABLED": "false"}, start_new_session=True)
    return server, f"http://127.0.0.1:{port}/api", log


def wait_for_prefect_server(url: str, server=None, log_name: str = "") -> None:
    import time
    import urllib.request

    deadline = time.monotonic() + 180
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5):
                return
        except OSError:
            if (server is not None and server.poll() is not None) or time.monotonic() > deadline:
                if server is not None:
                    server.kill()
                raise RuntimeError(f"the tests' Prefect server at {url} did not start (log: {log_name})") from None
            time.sleep(0.5)


def stop_prefect_server(server, log) -> None:
    import subprocess

    server.terminate()
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.kill()
    log.close()


@pytest.fixture(scope="session", autouse=True)
def prefect_server():
    """One Prefect API server for the whole session: every flow the tests start (in this process
    or in `python -m flows` subprocesses, which inherit PREFECT_API_URL) reports to it instead of
    starting a temporary server of its own (~15 s each on a 2-core machine). Under pytest-xdist the
    controller starts it for all workers (pytest_configure). Tests that need a server of their own
    (tests/test_schedule.py) set PREFECT_API_URL themselves."""
    if os.environ.get("PREFECT_API_URL"):  # the caller's server, or the xdist controller's
        if os.environ.get(SHARED_SERVER) == os.environ["PREFECT_API_URL"]:
            wait_for_prefect_server(os.environ["PREFECT_API_URL"])  # started while the workers collected
        yield os.environ["PREFECT_API_URL"]
        return
    server, url, log = start_prefect_server()
    wait_for_prefect_server(url, server, log.name)
    os.environ["PREFECT_API_URL"] = url
    try:
        yield url
    finally:
        os.environ.pop("PREFECT_API_URL", None)
        stop_prefect_server(server, log)


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
