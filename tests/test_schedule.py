"""The study served as a Prefect deployment with the cron schedule of params
(``rollscale serve``), against a Prefect server on loopback, as in production."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from rollscale.config import ParamsError, parse_params

pytestmark = pytest.mark.slow

SCHEDULE = {"deployment": "ci-study", "cron": "0 3 * * 1-5", "timezone": "Europe/Paris", "stages": ["bucket"]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM the process group we started, SIGKILL it if it lingers."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def wait_until(condition, what: str, timeout: float, procs=()):
    deadline = time.time() + timeout
    while time.time() < deadline:
        for p, log in procs:
            if p.poll() is not None:
                pytest.fail(f"{what}: a process ended (rc {p.returncode}):\n{Path(log).read_text()[-3000:]}")
        found = condition()
        if found:
            return found
        time.sleep(0.5)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")


def api(url: str, method: str = "GET", body: dict | None = None) -> dict | None:
    """A call to the Prefect REST API; None while it is not up or the object does not exist yet."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    for attempt in range(6):
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as err:
            if err.code == 404:
                return None
            # 503: the busy server refused the request (its database was locked) without acting on
            # it, so even a POST may be sent again
            if err.code == 503 and attempt < 5:
                time.sleep(2)
                continue
            raise AssertionError(f"{method} {url}: HTTP {err.code}: {err.read()[:500]!r}") from None
        except (OSError, ValueError):  # not listening yet (a POST is never retried: it could run twice)
            if method != "GET":
                raise
            return None


def test_schedule_params_are_checked():
    sched = parse_params({"schedule": SCHEDULE}).schedule
    assert (sched.cron, sched.timezone, sched.stages, sched.force) == ("0 3 * * 1-5", "Europe/Paris", ["bucket"], False)
    assert parse_params({"schedule": {"cron": "@daily"}}).schedule.cron == "@daily"
    assert parse_params({}).schedule.cron is None  # served without a schedule
    for bad, key in (({"cron": "0 3 * *"}, "schedule.cron"), ({"cron": "every day"}, "schedule.cron"),
                     ({"timezone": "Mars/Olympus"}, "schedule.timezone"),
                     ({"deployment": "a/b"}, "schedule.deployment"), ({"stages": ["fit", "fit"]}, "schedule.stages")):
        with pytest.raises(ParamsError, match=key):
            parse_params({"schedule": bad})


def test_served_deployment_runs_on_request_and_carries_the_cron_schedule(dvc_study, tmp_path):
    """Server on a free loopback port, `rollscale serve` beside it in the project that `dvc repro`
    built (tests/test_dvc.py), one run started through the API and awaited, then both stopped
    by their process ids. The run reproduces what DVC finds stale, and dvc.lock records it."""
    root, env = dvc_study
    original = (root / "params.yaml").read_text()
    study = yaml.safe_load(original)
    study["schedule"] = SCHEDULE
    study["bucket"]["seed"] = study["bucket"].get("seed", 0) + 1  # bucket is stale now
    params = root / "params.yaml"
    params.write_text(yaml.safe_dump(study))
    art = root / "artifacts"
    port = free_port()
    base = f"http://127.0.0.1:{port}/api"
    env = {**env, "PREFECT_HOME": str(tmp_path / "prefect-home"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_API_URL": base, "PREFECT_UI_ENABLED": "false"}
    logs = {name: tmp_path / f"{name}.log" for name in ("server", "serve")}
    server = subprocess.Popen([str(Path(sys.executable).parent / "prefect"), "server", "start", "--host", "127.0.0.1",
                               "--port", str(port)], env=env, stdout=logs["server"].open("w"), stderr=subprocess.STDOUT,
                              start_new_session=True)
    serve = None
    try:
        wait_until(lambda: api(f"{base}/health"), "the Prefect server", 90, [(server, logs["server"])])
        serve = subprocess.Popen([sys.executable, "-m", "rollscale.pipeline.cli", "--artifacts", str(art), "serve", "--params",
                                  str(params)], env=env, cwd=root, stdout=logs["serve"].open("w"),
                                 stderr=subprocess.STDOUT, start_new_session=True)
        procs = [(server, logs["server"]), (serve, logs["serve"])]
        deployment = wait_until(lambda: api(f"{base}/deployments/name/study/ci-study"), "the deployment", 90, procs)

        # the cron schedule of params, active while served
        [schedule] = deployment["schedules"]
        assert schedule["schedule"]["cron"] == "0 3 * * 1-5" and schedule["schedule"]["timezone"] == "Europe/Paris"
        assert schedule["active"] and deployment["parameters"]["stages"] == ["bucket"]
        assert deployment["parameters"]["project"] == str(root.resolve())

        run = api(f"{base}/deployments/{deployment['id']}/create_flow_run", "POST", {})

        def finished():
            state = (api(f"{base}/flow_runs/{run['id']}") or {}).get("state") or {}
            return state.get("type") if state.get("type") in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED") else None

        assert wait_until(finished, "the flow run", 120, procs) == "COMPLETED", logs["serve"].read_text()[-3000:]
        assert (art / "bucket" / "buckets.parquet").exists()
        assert "study: bucket: running (changed: param bucket (params.yaml): modified" in logs["serve"].read_text()
        r = subprocess.run([sys.executable, "-m", "dvc", "status", "bucket"], cwd=root, env=env, capture_output=True,
                           text=True)
        assert "bucket:" not in r.stdout, r.stdout  # DVC agrees: the served run recorded it in dvc.lock
        served = f"rollscale --artifacts {art} serve --params {params}"
        record = json.loads((art / "bucket" / ".stage.record.json").read_text())
        assert record["command"] == served and record["status"] == "finished", record

        # SIGTERM (a service manager's stop) to the group: exit 143 within 10 s, in one line
        t0 = time.monotonic()
        os.killpg(serve.pid, signal.SIGTERM)
        serve.wait(timeout=30)
        seconds = time.monotonic() - t0
        print(f"rollscale serve: SIGTERM -> exit {serve.returncode} in {seconds:.2f} s")
        assert serve.returncode == 143 and seconds < 10, (serve.returncode, seconds)
        last = logs["serve"].read_text().strip().splitlines()[-1]
        assert last == f"serve: stopped (SIGTERM); `{served}` serves the deployment again", last
    finally:
        params.write_text(original)
        for proc in (serve, server):
            if proc is not None:
                stop(proc)
    assert server.returncode is not None and serve.returncode is not None
