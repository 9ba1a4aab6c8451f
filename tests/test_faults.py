"""Faults a long study meets: a sweep killed mid-run (and read meanwhile), a corrupt
checkpoint, a full disk, an unwritable artifacts folder."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pandas as pd
import pytest

import rollscale.train.checkpoint as checkpoint_module
from flows.report import report_flow
from flows.sweep import sweep_flow
from rollscale.train.checkpoint import RunStore
from rollscale.pipeline.status import study_status
from tests.test_study import copy_study, prepared_study, write_params

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]

# long enough that reads, a report and a kill all land while it trains
LONG_SWEEP = {"n": [2, 4], "b_problem": [4], "c_max": 6000, "eval_every": 25, "checkpoint_every": 5}


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    return prepared_study(tmp_path_factory)


def cli(artifacts: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rollscale.pipeline.cli", "--artifacts", str(artifacts), *args],
                          capture_output=True, text=True, timeout=timeout, cwd=REPO)


def committed_checkpoints(run_dir: Path) -> list[Path]:
    return sorted(p for p in run_dir.glob("ckpt-*") if (p / "MANIFEST.json").exists())


def wait_for(condition, what: str, timeout: float = 180, proc: subprocess.Popen | None = None):
    deadline = time.time() + timeout
    while time.time() < deadline:
        found = condition()
        if found:
            return found
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"the sweep ended (rc {proc.returncode}) before {what}")
        time.sleep(0.02)
    pytest.fail(f"timed out waiting for {what}")


def check_complete_rows(run_dir: Path, c_max: int, eval_every: int) -> None:
    """Every step once, in order, and the evaluations the schedule asks for; C grows to C_max."""
    steps = pd.concat([pd.read_parquet(p) for p in sorted(run_dir.glob("steps-*.parquet"))], ignore_index=True)
    evals = pd.concat([pd.read_parquet(p) for p in sorted(run_dir.glob("evals-*.parquet"))], ignore_index=True)
    last = int(steps["step"].max())
    assert steps["step"].tolist() == list(range(1, last + 1)), f"{run_dir.name}: steps lost or duplicated"
    assert steps["c"].is_monotonic_increasing and steps["c"].iloc[-1] >= c_max > steps["c"].iloc[-2]
    wanted = sorted({0, *range(eval_every, last + 1, eval_every), last})
    assert evals["step"].tolist() == wanted, f"{run_dir.name}: evaluations lost or duplicated"
    run = pd.read_parquet(run_dir / "run.parquet").iloc[0]
    assert (run["status"], run["steps"], run["c"]) == ("finished", last, steps["c"].iloc[-1])


def test_sweep_killed_while_read_resumes_without_lost_or_duplicated_rows(prepared, tmp_path):
    """SIGKILL mid-run, while `rollscale sql`, `rollscale status` and the report read the
    sweep's tables; then the newest checkpoint is truncated and the sweep started again."""
    art = copy_study(prepared, tmp_path)
    params = write_params(tmp_path, sweep=LONG_SWEEP)
    log = (tmp_path / "sweep.log").open("w")
    # own session: the kill takes the whole process group (its Prefect server too), like a lost node
    proc = subprocess.Popen([sys.executable, "-m", "rollscale.pipeline.cli", "--artifacts", str(art), "run", "sweep",
                             "--params", str(params)], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    runs = art / "sweep" / "runs"
    try:
        wait_for(lambda: any(committed_checkpoints(d) for d in runs.glob("*")), "a first checkpoint", proc=proc)

        # readers while the sweep writes: none fails, none waits on it
        counts = []
        for _ in range(2):
            t0 = time.time()
            r = cli(art, "sql", "select count(*) as n from steps")
            assert r.returncode == 0, r.stderr
            assert time.time() - t0 < 60
            counts.append(int(r.stdout.split()[-1]))
        assert counts[0] > 0 and counts[1] >= counts[0]
        r = cli(art, "status", "--json")
        assert r.returncode == 0, r.stderr
        status = json.loads(r.stdout)
        assert {s["stage"]: s for s in status["stages"]}["sweep"]["state"] == "running"
        assert "running" in {run["status"] for run in status["runs"]}
        paths = report_flow(params_path=str(params), artifacts=str(art))
        assert paths.html.exists() and paths.summary.exists()

        # kill while a run is between checkpoints, with two committed ones to fall back on
        def mid_run():
            for d in sorted(runs.glob("*")):
                if not (d / "done.json").exists() and len(committed_checkpoints(d)) >= 2:
                    return d
            return None
        victim = wait_for(mid_run, "a run with two checkpoints", proc=proc)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        log.close()
    assert proc.returncode == -signal.SIGKILL, "the kill should land mid-sweep"
    assert not (victim / "done.json").exists()

    status = study_status(REPO, art)
    assert {s.stage: s.state for s in status.stages}["sweep"] == "interrupted"
    assert {r.run_id: r.status for r in status.runs}[victim.name] == "interrupted"

    # the newest checkpoint is damaged as a crash on a bad disk would leave it: truncated weights
    older, newest = committed_checkpoints(victim)[-2:]
    with open(newest / "model.pt", "r+b") as fh:
        fh.truncate(100)
    kept_parts = {p: p.read_bytes() for p in victim.glob("*-*.parquet")
                  if int(p.stem.split("-")[1]) <= int(older.name.split("-")[1])}

    r = cli(art, "run", "sweep", "--params", str(params), timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert f"skipping corrupt checkpoint {newest}" in r.stderr and f"using {older}" in r.stderr
    for part, data in kept_parts.items():
        assert part.read_bytes() == data, f"{part.name} (committed before the kill) changed"
    for run_dir in sorted(runs.glob("*")):
        check_complete_rows(run_dir, LONG_SWEEP["c_max"], LONG_SWEEP["eval_every"])
    # no run left behind (that the stage is up to date is DVC's to say: tests/test_dvc.py)
    assert {s.stage: s.state for s in study_status(REPO, art).stages}["sweep"] not in ("running", "interrupted",
                                                                                         "failed")
    assert {r.status for r in study_status(REPO, art).runs} == {"finished"}


@pytest.fixture
def small_disk(tmp_path):
    """A 16 MiB tmpfs: a disk that can really fill up, or be made read-only (needs root)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mnt = tmp_path / "disk"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(disk: Path) -> Path:
    """Write zeros until the disk is full; returns the filler file."""
    filler = disk / "filler"
    with open(filler, "wb") as fh:
        try:
            while True:
                fh.write(b"\0" * (1 << 16))
                fh.flush()
        except OSError as err:
            assert err.errno == errno.ENOSPC
    return filler


def test_disk_full_mid_run_fails_clearly_and_keeps_earlier_results(prepared, small_disk, monkeypatch):
    art = copy_study(prepared, small_disk)
    params = write_params(small_disk, sweep={"n": [4], "c_max": 320, "checkpoint_every": 5, "eval_every": 5})
    bucket_bytes = (art / "bucket" / "buckets.parquet").read_bytes()
    write_bytes = checkpoint_module._write_bytes
    filled = []

    def fill_before_the_second_checkpoint(path, data):
        # the disk fills up just as checkpoint 10 (its rows first) is written
        if not filled and "000010" in str(path):
            filled.append(fill(small_disk))
        write_bytes(path, data)

    monkeypatch.setattr(checkpoint_module, "_write_bytes", fill_before_the_second_checkpoint)
    # the run's error, or the refresh of the DuckDB file after it, names the cause
    with pytest.raises(Exception, match="No space left on device"):
        sweep_flow(params_path=str(params), artifacts=str(art))
    assert filled

    run_dir = next((art / "sweep" / "runs").glob("*"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no checkpoint may be found corrupt
        latest = RunStore(run_dir).latest()
        assert latest is not None and latest.step == 5, "the checkpoint before the full disk must stay valid"
        assert RunStore(run_dir).rows("steps")["step"].tolist() == [1, 2, 3, 4, 5]
    assert (art / "bucket" / "buckets.parquet").read_bytes() == bucket_bytes

    # space again: the same flow resumes from step 5 and finishes
    monkeypatch.setattr(checkpoint_module, "_write_bytes", write_bytes)
    filled[0].unlink()
    sweep_flow(params_path=str(params), artifacts=str(art))
    check_complete_rows(run_dir, 320, 5)


def test_full_or_read_only_artifacts_folder_fails_before_any_work(prepared, small_disk):
    art = copy_study(prepared, small_disk)
    params = write_params(small_disk.parent)
    before = {p: p.read_bytes() for p in art.rglob("*") if p.is_file()}

    filler = fill(small_disk)
    r = cli(art, "run", "bucket", "--params", str(params))
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"rollscale: artifacts folder {art / 'bucket'} is not writable (No space left on device)" in r.stderr
    assert "earlier results are unchanged" in r.stderr
    filler.unlink()

    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    r = cli(art, "run", "sweep", "--params", str(params))
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"rollscale: artifacts folder {art / 'sweep'} is not writable (Read-only file system)" in r.stderr
    assert {p: p.read_bytes() for p in art.rglob("*") if p.is_file()} == before
