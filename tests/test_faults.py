"""Faults a long study meets: a sweep killed mid-run (and read meanwhile), a corrupt
checkpoint, a full disk, an unwritable artifacts folder, Ctrl-C and SIGTERM."""

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
from rollscale.pipeline.stages.specs import RUN_INFO, stage_running
from rollscale.pipeline.query.storage import query
from rollscale.pipeline.stages.status import study_status
from tests.test_study import copy_study, prepared_study, sweep_rows, write_params

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


def check_complete_rows(run_dir: Path, c_max: int, eval_every: int, eval_per_doubling: int = 4) -> None:
    """Every step once, in order, and the evaluations the schedule asks for (the shared budget schedule by
    default, science §9.1; ``eval_per_doubling`` 0: every ``eval_every`` steps); C grows to C_max."""
    from rollscale.core.fit import schedule as evaluation_schedule

    steps = pd.concat([pd.read_parquet(p) for p in sorted(run_dir.glob("steps-*.parquet"))], ignore_index=True)
    evals = pd.concat([pd.read_parquet(p) for p in sorted(run_dir.glob("evals-*.parquet"))], ignore_index=True)
    last = int(steps["step"].max())
    assert steps["step"].tolist() == list(range(1, last + 1)), f"{run_dir.name}: steps lost or duplicated"
    assert steps["c"].is_monotonic_increasing and steps["c"].iloc[-1] >= c_max > steps["c"].iloc[-2]
    if eval_per_doubling:
        schedule = evaluation_schedule.budget_schedule(c_max, eval_per_doubling)
        c = [0, *steps["c"].tolist()]
        wanted = sorted({0, last, *(i for i in range(1, last + 1) if evaluation_schedule.eval_due(i, c[i - 1], c[i], eval_every, schedule))})
    else:
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


def results(art: Path) -> dict[Path, bytes]:
    """Every file under ``art`` but the locks (filelock leaves its empty stage lock behind; the study's lock says
    who holds the folder)."""
    from rollscale.pipeline.stages.specs import STUDY_LOCK

    return {p: p.read_bytes() for p in art.rglob("*") if p.is_file() and p.name not in (".stage.lock", STUDY_LOCK)}


def test_full_or_read_only_artifacts_folder_fails_before_any_work(prepared, small_disk):
    art = copy_study(prepared, small_disk)
    params = write_params(small_disk.parent)
    before = results(art)

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
    assert results(art) == before


# ---------------------------------------------------------------------------- Ctrl-C and SIGTERM

# runs long enough for a signal to land mid-run: n = 4 ends at 40 steps while n = 2 is still at work
INTERRUPTED_SWEEP = {"n": [2, 4], "b_problem": [4], "c_max": 640, "eval_every": 8, "checkpoint_every": 4}


@pytest.fixture(scope="module")
def uninterrupted(prepared, tmp_path_factory):
    """The sweep's steps and evals tables when nothing stops it."""
    root = tmp_path_factory.mktemp("uninterrupted")
    art = copy_study(prepared, root)
    sweep_flow(params_path=str(write_params(root, sweep=INTERRUPTED_SWEEP)), artifacts=str(art))
    return {kind: sweep_rows(art, kind) for kind in ("steps", "evals")}


def live_members(pgid: int) -> list[int]:
    """Processes of group ``pgid`` that are still running (zombies left to init are not)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            pids.append(int(stat.parent.name))
    return pids


def interrupt(args: list[str], signum: int, when, what: str, log: Path, env: dict | None = None, cwd: Path = REPO):
    """Start ``rollscale ARGS`` in a process group of its own, send ``signum`` to the whole group
    (as a terminal's Ctrl-C does) once ``when()`` holds; (exit status, seconds to exit, the output
    written after the signal, what ``when()`` returned)."""
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "rollscale.pipeline.cli", *args], cwd=cwd, env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            stage_pid = wait_for(when, what, timeout=300, proc=proc)
            before = log.stat().st_size
            t0 = time.monotonic()
            os.killpg(proc.pid, signum)
            proc.wait(timeout=30)
            seconds = time.monotonic() - t0
            print(f"rollscale {' '.join(args[-4:])}: {signal.Signals(signum).name} -> exit {proc.returncode} "
                  f"in {seconds:.2f} s")
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    deadline = time.monotonic() + 3  # multiprocessing's resource tracker ends once its pipe closes
    while (left := live_members(proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"outlived the command: {[Path(f'/proc/{p}/cmdline').read_bytes()[:200] for p in left]}"
    written = log.read_bytes()
    if before and written[before - 1:before] != b"\n":  # mid-line at the signal (a progress line): from the next line
        before = written.find(b"\n", before) + 1 or len(written)
    return proc.returncode, seconds, written[before:].decode(), stage_pid


def said(after: str, prefixes=("np4_",)) -> list[str]:
    """The lines printed after the signal, without the runs' own progress lines."""
    return [line for line in after.splitlines() if line.strip() and not line.startswith(prefixes)]


def no_own_server_left(stage_pid: int) -> bool:
    """The Prefect server a command started for itself (rollscale/pipeline/runtime/server.py) ended with it."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if f"rollscale.pipeline.runtime.server\0{stage_pid}\0".encode() in cmdline.read_bytes():
                return False
        except OSError:
            continue  # ended meanwhile
    return True


def test_ctrl_c_stops_a_sweep_within_seconds_and_the_rerun_completes_it(prepared, uninterrupted, tmp_path):
    """Ctrl-C (SIGINT to the group) while one run has finished and the other trains, two worker
    processes, and the stage's own Prefect server (no PREFECT_API_URL: the server Ctrl-C used to
    kill first). Exit 130 within 10 s in one line, the lock released, the workers gone, the
    finished run untouched; the rerun resumes and ends with the tables of an uninterrupted sweep."""
    art = copy_study(prepared, tmp_path)
    params = write_params(tmp_path, workers=2, sweep=INTERRUPTED_SWEEP)
    runs = art / "sweep" / "runs"
    finished, training = runs / "np4_nr4_uniform_s0", runs / "np4_nr2_uniform_s0"

    def one_finished_one_training():
        if (finished / "done.json").exists() and committed_checkpoints(training):
            assert not (training / "done.json").exists(), "the sweep ended before the signal: make runs longer"
            return json.loads((art / "sweep" / RUN_INFO).read_text())["pid"]
        return None

    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    rc, seconds, after, stage_pid = interrupt(
        ["--artifacts", str(art), "run", "sweep", "--params", str(params)], signal.SIGINT,
        one_finished_one_training, "a finished run beside a training one", tmp_path / "sweep.log", env)
    command = f"rollscale --artifacts {art} run sweep --params {params}"
    assert rc == 130 and seconds < 10, (rc, seconds, after)
    assert said(after) == [f"sweep: interrupted (SIGINT); 1 of 2 runs finished, 1 resumes from its last "
                           f"checkpoint: rerun `{command}` to go on"], after
    assert not stage_running(art, "sweep") and no_own_server_left(stage_pid)
    kept = {p: p.read_bytes() for p in finished.rglob("*") if p.is_file()  # its checkpoints and rows
            and p.name not in ("attempts.jsonl", "run.parquet")}

    status = study_status(REPO, art)
    sweep = {s.stage: s for s in status.stages}["sweep"]
    assert sweep.state == "interrupted" and sweep.detail.startswith("by SIGINT at "), sweep
    runs_now = {r.run_id: r for r in status.runs}
    assert runs_now[finished.name].status == "finished"
    last = committed_checkpoints(training)[-1]
    assert (runs_now[training.name].status, runs_now[training.name].step) == ("interrupted", int(last.name[5:]))
    # the raw `runs` table agrees with status (issue 32: it said "running", 0 steps)
    table = query("select run_id, status, steps from runs", art).set_index("run_id")
    assert (table.loc[training.name, "status"], table.loc[training.name, "steps"]) == ("interrupted", int(last.name[5:]))
    assert table.loc[finished.name, "status"] == "finished"

    sweep_flow(params_path=str(params), artifacts=str(art))  # the rerun (in this process: seconds less)
    assert {p: p.read_bytes() for p in kept} == kept, "the finished run was trained again"
    for kind in ("steps", "evals"):
        pd.testing.assert_frame_equal(sweep_rows(art, kind), uninterrupted[kind])
    assert {r.status for r in study_status(REPO, art).runs} == {"finished"}


def test_sigterm_stops_a_sweep_training_in_the_stage_process(prepared, uninterrupted, tmp_path):
    """SIGTERM (a service manager's stop) to the group while the one in-process worker (a thread
    of the stage's process) trains: exit 143 within 10 s in one line; the resumed sweep equals an
    uninterrupted one."""
    art = copy_study(prepared, tmp_path)
    params = write_params(tmp_path, sweep=INTERRUPTED_SWEEP)
    first = art / "sweep" / "runs" / "np4_nr2_uniform_s0"  # the longest run goes first

    def training():
        return committed_checkpoints(first) and json.loads((art / "sweep" / RUN_INFO).read_text())["pid"]

    rc, seconds, after, _ = interrupt(["--artifacts", str(art), "run", "sweep", "--params", str(params)],
                                      signal.SIGTERM, training, "a first checkpoint", tmp_path / "sweep.log")
    assert rc == 143 and seconds < 10, (rc, seconds, after)
    assert said(after) == [f"sweep: interrupted (SIGTERM); 0 of 2 runs finished, 1 resumes from its last "
                           f"checkpoint, 1 starts from the beginning: rerun `rollscale --artifacts {art} run sweep "
                           f"--params {params}` to go on"], after
    assert not stage_running(art, "sweep")
    sweep_flow(params_path=str(params), artifacts=str(art))
    for kind in ("steps", "evals"):
        pd.testing.assert_frame_equal(sweep_rows(art, kind), uninterrupted[kind])
