"""The sweep on Ray (``sweep.executor: ray``): a local Ray on this machine's CPUs runs
one run per task, in parallel, with the results of the sequential sweep, and a
worker killed mid-run is retried from the run's checkpoint."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
from prefect import flow, task

from flows.sweep import sweep_flow
from rollscale.config import parse_params
from rollscale.pipeline.stages.status import read_attempts
from tasks.ray_sweep import ray_address, worker_env
from tests.test_study import copy_study, prepared_study, sweep_rows, write_params

pytestmark = pytest.mark.slow

# the victim (n=2) has its worker killed; both runs last long enough to overlap
SWEEP = {"n": [2, 4], "b_problem": [4], "c_max": 960, "eval_every": 10, "checkpoint_every": 4}
VICTIM, OTHER = "np4_nr2_uniform_s0", "np4_nr4_uniform_s0"


def committed(run_dir: Path) -> list[Path]:
    return sorted(p for p in run_dir.glob("ckpt-*") if (p / "MANIFEST.json").exists())


def kill_victim_while_both_train(runs: Path, killed: list, stop: threading.Event) -> None:
    """SIGKILL the worker training VICTIM once it has committed a checkpoint, at a moment
    when the other run is training too (one run at a time never offers one)."""
    victim, other = runs / VICTIM, runs / OTHER
    while not stop.is_set():
        attempts = read_attempts(victim)
        if (attempts and committed(victim) and not (victim / "done.json").exists()
                and read_attempts(other) and not (other / "done.json").exists()):
            pid = attempts[0]["pid"]
            os.kill(pid, signal.SIGKILL)
            killed.append((pid, committed(victim)[-1].name, time.time()))
            return
        time.sleep(0.01)


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory):
    """The same sweep twice: one run after another in this process, and on a local Ray started on demand with a worker killed."""
    prepared = prepared_study(tmp_path_factory)
    out = {}
    for executor in ("local", "ray"):
        root = tmp_path_factory.mktemp(executor)
        art = copy_study(prepared, root)
        params = write_params(root, sweep={**SWEEP, "executor": executor, "ray_cpus_per_run": 1})
        killed, stop = [], threading.Event()
        killer = threading.Thread(target=kill_victim_while_both_train, args=(art / "sweep" / "runs", killed, stop),
                                  daemon=True)
        if executor == "ray":
            killer.start()
        t0 = time.time()
        try:
            runs = sweep_flow(params_path=str(params), artifacts=str(art))
        finally:
            stop.set()
        out[executor] = {"artifacts": art, "runs": runs, "killed": killed, "seconds": time.time() - t0}
    return out


def test_ray_results_equal_the_sequential_sweep(sweeps):
    seq, ray = sweeps["local"], sweeps["ray"]
    assert list(ray["runs"]["status"]) == ["finished", "finished"]
    for kind in ("steps", "evals"):
        pd.testing.assert_frame_equal(sweep_rows(ray["artifacts"], kind), sweep_rows(seq["artifacts"], kind))
    cols = ["run_id", "status", "steps", "c", "c_tokens"]
    pd.testing.assert_frame_equal(ray["runs"][cols], seq["runs"][cols])


def test_runs_train_in_parallel_one_per_task(sweeps):
    ray = sweeps["ray"]
    # the kill waits for a moment when both runs train, in two workers: one came
    assert ray["killed"], "the two runs never trained at the same time"
    runs = ray["artifacts"] / "sweep" / "runs"
    spans, workers = {}, set()
    for run_dir in sorted(runs.iterdir()):
        first = read_attempts(run_dir)[0]
        # a first attempt ends when its worker is killed, or when the run is done
        end = ray["killed"][0][2] if run_dir.name == VICTIM else (run_dir / "done.json").stat().st_mtime
        spans[run_dir.name] = (first["started_unix"], end)
        workers.add(first["pid"])
    (a0, a1), (b0, b1) = spans.values()
    assert a0 < b1 and b0 < a1, f"the two runs did not train at the same time: {spans}"
    assert len(workers) == 2 and os.getpid() not in workers  # two worker processes, not this one


def test_a_killed_worker_is_retried_from_its_checkpoint(sweeps):
    ray = sweeps["ray"]
    assert ray["killed"], "the victim's worker should be killed mid-run while the other run trains"
    pid, checkpoint, _ = ray["killed"][0]
    attempts = read_attempts(ray["artifacts"] / "sweep" / "runs" / VICTIM)
    assert len(attempts) == 2 and attempts[0]["pid"] == pid != attempts[1]["pid"]
    assert attempts[0]["resume_step"] is None
    # the retry starts from the checkpoint the killed worker had committed (or a later one it reached)
    assert attempts[1]["resume_step"] >= int(checkpoint.split("-")[1]) >= SWEEP["checkpoint_every"]
    other = read_attempts(ray["artifacts"] / "sweep" / "runs" / OTHER)
    assert len(other) == 1


def test_cluster_address_and_worker_settings(monkeypatch):
    sweep = parse_params({"sweep": {"executor": "ray"}}).sweep
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert ray_address(sweep) is None  # a local Ray is started
    monkeypatch.setenv("RAY_ADDRESS", "ray://head:10001")
    assert ray_address(sweep) == "ray://head:10001"
    sweep = parse_params({"sweep": {"executor": "ray", "ray_address": "auto", "ray_gpus_per_run": 1}}).sweep
    assert ray_address(sweep) == "auto" and sweep.ray_gpus_per_run == 1
    monkeypatch.setenv("PREFECT_LOGGING_LEVEL", "DEBUG")
    env = worker_env("http://10.0.0.1:4200/api")
    assert env["PREFECT_API_URL"] == "http://10.0.0.1:4200/api" and env["PREFECT_LOGGING_LEVEL"] == "DEBUG"


@task
def nap_then_write(path: str, seconds: float) -> str:
    time.sleep(seconds)
    Path(path).write_text("the unit ran to its end")
    return path


def test_an_interrupt_cancels_the_ray_tasks_on_a_cluster_it_did_not_start(tmp_path):
    """Ctrl-C in a sweep on a Ray cluster (rollscale.pipeline.runtime.workers.stop_units): its tasks are cancelled,
    not left to finish, and the cluster, which the sweep did not start, is left running.
    (~15 s: a local Ray stands for the cluster; the sweep on it is tested above.)"""
    import ray
    from prefect_ray import RayTaskRunner
    from ray.exceptions import TaskCancelledError

    from rollscale.pipeline.runtime.workers import stop_units, submit_all

    ray.init(num_cpus=1, include_dashboard=False)
    try:
        @flow
        def interrupted_sweep() -> tuple[float, bool]:
            runner = RayTaskRunner(address="auto")  # Ray is up: the runner joins it, does not own it
            runner.__enter__()
            [future] = submit_all(runner, nap_then_write, [{"path": str(tmp_path / "done"), "seconds": 6}])
            time.sleep(2)  # started
            t0 = time.monotonic()
            stop_units(runner, [future])
            with pytest.raises(TaskCancelledError):
                ray.get(future.wrapped_future, timeout=10)
            return time.monotonic() - t0, ray.is_initialized()

        seconds, cluster_up = interrupted_sweep()
        time.sleep(6)
        assert seconds < 5 and cluster_up and not (tmp_path / "done").exists()
    finally:
        ray.shutdown()


def test_a_sharded_run_is_one_ray_task_that_launches_its_ranks(tmp_path, capsys):
    """``sweep.devices_per_run: 2`` on a local Ray of this machine's 2 CPUs: the run is one Ray task
    holding 2 x ray_cpus_per_run CPUs, which starts torchrun with 2 ranks; the run finishes, its
    checkpoint has both ranks' shards, and its worker was not this process."""
    from rollscale.config import SamplingParams
    from rollscale.lm.models import ModelRef, char_tokenizer
    from rollscale.train.checkpoint import RunStore
    from tasks.ray_sweep import train_runs_on_ray
    from tests.test_distributed import _config, _model, _problems

    char_tokenizer().save_pretrained(tmp_path / "model")
    _model().save_pretrained(tmp_path / "model")
    problems = _problems(12)
    sweep = parse_params({"workers": 2, "sweep": {"executor": "ray", "ray_cpus_per_run": 1,
                                                  "devices_per_run": 2}}).sweep
    unit = dict(ref=ModelRef(str(tmp_path / "model"), chat_template=False, fingerprint="tiny"),
                config=_config(c_max=32, noise_every=0), bucket="easy", train_problems=problems[:8],
                val_problems=problems[8:], run_dir=str(tmp_path / "run"), lora=None, torch_threads=1, device="cpu",
                trackers=None, sampling=SamplingParams(temperature=1.0, max_new_tokens=6), budget=None, devices=2)

    @flow
    def sharded_sweep():
        return train_runs_on_ray([unit], ["sharded"], sweep, device="cpu")

    results, errors = sharded_sweep()
    assert errors == [] and (results[0].status, results[0].c) == ("finished", 32)
    assert "(2 CPU, 0 GPU per run)" in capsys.readouterr().out
    store = RunStore(tmp_path / "run")
    assert list(store.rows("steps")["step"]) == [1, 2]
    assert sorted(p.name for p in store.latest().shards.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    [attempt] = read_attempts(tmp_path / "run")
    assert attempt["pid"] != os.getpid()
