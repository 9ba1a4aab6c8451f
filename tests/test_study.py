"""The study flow: stages in dvc.yaml order, skipped when unchanged, and ``rollscale status``.

``prepared_study`` (base, profile and bucket of a tiny study, built once per
test session by the study flow itself) is shared with the schedule, Ray and
fault tests.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from flows.study import select_stages, study_flow
from rollscale.pipeline import cli
from rollscale.config import load_params
from rollscale.pipeline.status import (
    FAILED,
    LOCK,
    MARKER,
    StageBusyError,
    StageLock,
    load_stage_specs,
    lock_alive,
    stage_run,
    study_status,
)
from rollscale.pipeline.storage import write_parquet_atomic

pytestmark = pytest.mark.slow

# a 2-layer model trained for seconds: a quarter of the pool lands in Easy [0.25, 0.75]
TINY = {
    "workers": 1,  # in-process; tests/test_parallel.py checks that 2 workers give the same tables
    "data": {"size": 120, "config": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}},
    "base": {"hidden_size": 32, "num_layers": 2, "num_heads": 2, "intermediate_size": 64, "max_positions": 32,
             "train_size": 2000, "steps": 200, "batch_size": 32, "lr": 3e-3},
    "sampling": {"max_new_tokens": 4},
    "profile": {"k": 4, "k_extreme": 0, "chunk_size": 40},
    "bucket": {"val_size": 4, "used": [], "mixtures": {}, "easy": [0.25, 0.75], "extremely_hard": False},
    "sweep": {"bucket": "easy", "design": "rollout_axis", "n": [2, 4], "b_problem": [4], "c_max": 64, "seeds": [0],
              "eval_every": 4, "eval_k": 2, "checkpoint_every": 4, "train": {"lr_base": 1e-3, "warmup_steps": 0}},
}
PREPARED = ("base", "profile", "bucket")
WALL_TIMES = ["t_generate", "t_score", "t_train", "t_eval"]


def merged(base: dict, over: dict) -> dict:
    out = dict(base)
    for key, value in over.items():
        nested = isinstance(value, dict) and isinstance(base.get(key), dict)
        out[key] = merged(base[key], value) if nested else value
    return out


def write_params(root: Path, **over) -> Path:
    path = root / "params.yaml"
    path.write_text(yaml.safe_dump(merged(TINY, over)))
    return path


def prepared_study(tmp_path_factory) -> Path:
    """A folder with params.yaml and artifacts/{base,profile,bucket}, made once per session."""
    root = tmp_path_factory.getbasetemp() / "tiny-study"
    if not (root / "ready").exists():
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir()
        params = write_params(root)
        outcome = study_flow(params_path=str(params), artifacts=str(root / "artifacts"), stages=list(PREPARED))
        assert outcome == {s: "ran" for s in PREPARED}
        (root / "ready").touch()
    return root


def copy_study(prepared: Path, dest: Path, stages=PREPARED) -> Path:
    """Copy stage folders with their modification times (so their fingerprints still match)."""
    art = dest / "artifacts"
    for stage in stages:
        shutil.copytree(prepared / "artifacts" / stage, art / stage, copy_function=shutil.copy2)
    return art


def sweep_rows(artifacts: Path, kind: str) -> pd.DataFrame:
    """One table of a sweep (steps or evals) without wall times, in run and step order."""
    files = sorted((artifacts / "sweep" / "runs").glob(f"*/{kind}-*.parquet"))
    df = pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)
    return df.drop(columns=[c for c in WALL_TIMES if c in df]).sort_values(["run_id", "step"]).reset_index(drop=True)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    return prepared_study(tmp_path_factory)


@pytest.fixture(scope="module")
def studied(prepared, tmp_path_factory):
    """The prepared study with sweep and fit run by the study flow."""
    root = tmp_path_factory.mktemp("studied")
    art = copy_study(prepared, root)
    params = write_params(root)
    outcome = study_flow(params_path=str(params), artifacts=str(art), stages=[*PREPARED, "sweep", "fit"])
    assert outcome == {"base": "skipped", "profile": "skipped", "bucket": "skipped", "sweep": "ran", "fit": "ran"}
    return root


def status_json(root: Path, capsys) -> dict:
    capsys.readouterr()
    args = ["--artifacts", str(root / "artifacts"), "status", "--params", str(root / "params.yaml"), "--json"]
    assert cli.main(args) == 0
    return json.loads(capsys.readouterr().out)


def states(status: dict) -> dict[str, str]:
    return {s["stage"]: s["state"] for s in status["stages"]}


def test_study_covers_every_stage_the_cli_runs_in_dvc_order():
    specs = load_stage_specs()
    assert tuple(specs) == cli.STAGES
    assert select_stages(specs, ["fit", "base"]) == ["base", "fit"]
    assert select_stages(specs, None) == list(cli.STAGES)
    with pytest.raises(ValueError, match=r"unknown stage\(s\) \['bukket'\]"):
        select_stages(specs, ["bukket"])


def test_unchanged_stages_are_skipped_and_changes_rerun_what_depends_on_them(studied, tmp_path):
    root = tmp_path
    art = copy_study(studied, root, (*PREPARED, "sweep", "fit"))
    params = write_params(root)
    run_files = {p: p.stat().st_mtime_ns for p in (art / "sweep" / "runs").rglob("*") if p.is_file()}
    assert run_files

    # nothing changed: every stage is skipped, no file is rewritten
    outcome = study_flow(params_path=str(params), artifacts=str(art), stages=[*PREPARED, "sweep", "fit"])
    assert set(outcome.values()) == {"skipped"}

    # a fit parameter: only fit runs again
    params = write_params(root, fit={"bin_width": 0.05})
    fits_before = (art / "fit" / "fits.parquet").stat().st_mtime_ns
    outcome = study_flow(params_path=str(params), artifacts=str(art), stages=[*PREPARED, "sweep", "fit"])
    assert outcome == {"base": "skipped", "profile": "skipped", "bucket": "skipped", "sweep": "skipped", "fit": "ran"}
    assert (art / "fit" / "fits.parquet").stat().st_mtime_ns != fits_before
    assert {p: p.stat().st_mtime_ns for p in run_files} == run_files, "the sweep was recomputed"
    marker = json.loads((art / "fit" / MARKER).read_text())
    assert marker["stage"] == "fit" and len(marker["fingerprint"]) == 32 and "params fit" in marker["inputs"]

    # a bucket parameter: bucket reruns, and the sweep (which reads its output) becomes stale
    params = write_params(root, fit={"bin_width": 0.05}, bucket={"seed": 7})
    assert study_flow(params_path=str(params), artifacts=str(art), stages=["bucket"]) == {"bucket": "ran"}
    status = study_status(load_params(params), art)
    by_stage = {s.stage: s for s in status.stages}
    assert by_stage["bucket"].state == "done"
    assert by_stage["sweep"].state == "stale" and "artifacts/bucket" in by_stage["sweep"].detail
    assert by_stage["fit"].state == "stale" and "after sweep (stale)" in by_stage["fit"].detail

    # --force recomputes an unchanged stage
    assert study_flow(params_path=str(params), artifacts=str(art), stages=["bucket"], force=True) == {"bucket": "ran"}


def test_status_shows_done_stale_running_interrupted_failed_and_run_progress(studied, tmp_path, capsys):
    root = tmp_path
    art = copy_study(studied, root, (*PREPARED, "sweep", "fit"))
    write_params(root)
    status = status_json(root, capsys)
    assert [s["stage"] for s in status["stages"]] == list(cli.STAGES)
    # fit's own inputs are unchanged, but it reads the measure stage's output, which does not exist yet
    assert states(status) == {"base": "done", "profile": "done", "bucket": "done", "measure": "not run",
                              "sweep": "done", "fit": "stale", "report": "not run"}
    assert {s["stage"]: s for s in status["stages"]}["fit"]["detail"] == "after measure (not run)"
    runs = {r["run_id"]: r for r in status["runs"]}
    table = pd.concat([pd.read_parquet(p) for p in (art / "sweep" / "runs").glob("*/run.parquet")])
    assert set(runs) == set(table["run_id"]) and len(runs) == 2
    for row in table.itertuples():
        r = runs[row.run_id]
        assert (r["status"], r["step"], r["c"], r["c_max"]) == ("finished", row.steps, row.c, 64)
        # every run starts in a worker (a pool process, or in-process with one worker) and records it once
        assert r["fraction"] >= 1.0 and r["attempts"] == 1

    # a changed param makes its stage stale, naming the change
    write_params(root, sweep={"eval_k": 3})
    sweep = {s["stage"]: s for s in status_json(root, capsys)["stages"]}["sweep"]
    assert sweep["state"] == "stale" and sweep["detail"] == "changed: params sweep"
    write_params(root)

    # a live lock: running, with this process as the holder; its runs are running
    run_id = sorted(runs)[0]
    run_dir = art / "sweep" / "runs" / run_id
    row = pd.read_parquet(run_dir / "run.parquet").assign(status="running")
    write_parquet_atomic(row, run_dir / "run.parquet")
    (run_dir / "done.json").unlink()
    with StageLock(art, "sweep"):
        status = status_json(root, capsys)
        sweep = {s["stage"]: s for s in status["stages"]}["sweep"]
        assert sweep["state"] == "running" and f"pid {os.getpid()}" in sweep["detail"]
        assert {r["run_id"]: r["status"] for r in status["runs"]}[run_id] == "running"
        with pytest.raises(StageBusyError, match="'sweep' is already running"):
            StageLock(art, "sweep").__enter__()
    assert not (art / "sweep" / LOCK).exists()

    # a lock left by a process that is gone: interrupted, and so is its run
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (art / "sweep" / LOCK).write_text(json.dumps({"stage": "sweep", "pid": dead.pid, "host": socket.gethostname(),
                                                  "started_at": "2026-01-01T00:00:00+00:00"}))
    status = status_json(root, capsys)
    assert states(status)["sweep"] == "interrupted"
    assert {r["run_id"]: r["status"] for r in status["runs"]}[run_id] == "interrupted"
    with StageLock(art, "sweep"):  # the next run takes the lock over
        assert json.loads((art / "sweep" / LOCK).read_text())["pid"] == os.getpid()

    # a stage that raised: failed, with the error; its last good marker is kept
    marker = (art / "fit" / MARKER).read_text()
    with pytest.raises(RuntimeError, match="boom"), stage_run("fit", load_params(root / "params.yaml"), art):
        raise RuntimeError("boom")
    fit = {s["stage"]: s for s in status_json(root, capsys)["stages"]}["fit"]
    assert fit["state"] == "failed" and "RuntimeError: boom" in fit["detail"]
    assert (art / "fit" / MARKER).read_text() == marker and (art / "fit" / FAILED).exists()

    # the table for people
    capsys.readouterr()
    assert cli.main(["--artifacts", str(art), "status", "--params", str(root / "params.yaml")]) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[0].split() == ["stage", "state", "finished", "detail"]
    assert "failed" in text and "interrupted" in text and f"{run_id}" in text and "/ 64" in text


def test_a_busy_stage_refuses_a_second_run(studied, tmp_path):
    art = copy_study(studied, tmp_path, PREPARED)
    params = write_params(tmp_path)
    before = (art / "bucket" / "buckets.parquet").read_bytes()
    with StageLock(art, "bucket"):
        r = subprocess.run([sys.executable, "-m", "rollscale.pipeline.cli", "--artifacts", str(art), "run", "bucket",
                            "--params", str(params)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stderr
    assert "stage 'bucket' is already running (pid" in r.stderr and "Traceback" not in r.stderr
    assert (art / "bucket" / "buckets.parquet").read_bytes() == before


def test_lock_liveness_on_other_hosts_and_without_hard_links(tmp_path, monkeypatch):
    now = 1_000_000.0
    other = {"pid": 1, "host": socket.gethostname() + "-elsewhere"}
    assert lock_alive({**other, "heartbeat_unix": now - 5}, now=now, heartbeat_s=10)
    assert not lock_alive({**other, "heartbeat_unix": now - 31}, now=now, heartbeat_s=10)
    assert not lock_alive(other, now=now)  # no heartbeat at all
    assert lock_alive({"pid": os.getpid(), "host": socket.gethostname()})

    def no_links(src, dst):
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    with StageLock(tmp_path, "fit", heartbeat_s=0.05) as lock:
        held = json.loads((tmp_path / "fit" / LOCK).read_text())
        assert held["pid"] == os.getpid() and held["stage"] == "fit"
        first_beat = held["heartbeat_unix"]
        time.sleep(0.3)
        assert json.loads((tmp_path / "fit" / LOCK).read_text())["heartbeat_unix"] > first_beat
        with pytest.raises(StageBusyError):
            StageLock(tmp_path, "fit").__enter__()
    assert not lock.path.exists()
