"""The sweep's runs as Ray tasks (``sweep.executor: ray``), through prefect-ray.

Each run is one Ray task asking for ``sweep.ray_cpus_per_run`` CPUs and
``sweep.ray_gpus_per_run`` GPUs, so Ray packs as many runs side by side as the
cluster holds. The cluster is ``sweep.ray_address``, else the ``RAY_ADDRESS``
environment variable, else a local Ray started for this sweep and stopped after
it. The run folders must be on storage every worker shares (the same path on
every node).

Faults: a worker that dies mid-run (killed, node lost) makes Ray start the task
again, up to :data:`WORKER_RETRIES` times, and the run resumes from its last
checkpoint in the run folder (:class:`~rollscale.train.checkpoint.RunStore`); a
transient error inside the run gets one Prefect retry, resuming the same way.
Every start is appended to the run's ``attempts.jsonl`` (pid, host, the step it
resumed from), which ``rollscale status`` shows.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from rollscale.config import LoraParams, SweepParams
from rollscale.lm.models import ModelRef
from rollscale.core.problems import Problem
from rollscale.pipeline.status import record_attempt
from rollscale.train.trainer import RunConfig, RunResult
from tasks.common import transient
from rollscale.pipeline.trackers import TrackerTargets
from tasks.sweep import train_run

log = logging.getLogger("rollscale.train.sweep")

# Ray re-runs a task whose worker process died this many times (system failures only)
WORKER_RETRIES = 3
# settings the workers need: the same Prefect API (else each worker starts its own
# temporary server and the task runs land nowhere the flow can see)
_FORWARDED_ENV = ("PREFECT_SERVER_ANALYTICS_ENABLED", "PREFECT_LOGGING_LEVEL", "PREFECT_API_KEY")


def ray_address(sweep: SweepParams) -> str | None:
    """``sweep.ray_address``, else ``$RAY_ADDRESS``, else None (a local Ray is started)."""
    return sweep.ray_address or os.environ.get("RAY_ADDRESS") or None


def worker_env(api_url: str) -> dict[str, str]:
    """Environment variables for the workers' runtime_env: the Prefect settings, and every
    HF_* (hub cache, token, offline mode) and CUDA_* (visible devices) variable."""
    env = {k: os.environ[k] for k in _FORWARDED_ENV if k in os.environ}
    env.update({k: v for k, v in os.environ.items() if k.startswith(("HF_", "CUDA_"))})
    env["PREFECT_API_URL"] = api_url
    return env


def gpus_per_run(sweep: SweepParams, device: str, cluster_gpus: float) -> float:
    """``sweep.ray_gpus_per_run``, else 1 when the model goes on GPU (``model.device``
    cuda, or auto on a cluster with GPUs), else 0."""
    if sweep.ray_gpus_per_run is not None:
        return sweep.ray_gpus_per_run
    return 1.0 if device == "cuda" or (device == "auto" and cluster_gpus > 0) else 0.0


@task(name="train-run-ray", cache_policy=NO_CACHE, retries=1, retry_delay_seconds=2, retry_condition_fn=transient)
def train_run_on_worker(
    ref: ModelRef,
    config: RunConfig,
    bucket: str,
    train_problems: list[Problem],
    val_problems: list[Problem],
    run_dir: str,
    lora: LoraParams | None,
    torch_threads: int,
    device: str = "auto",
    trackers: TrackerTargets | None = None,
) -> RunResult:
    """:func:`tasks.sweep.train_run` inside a Ray worker, after recording the attempt."""
    import torch

    torch.set_num_threads(torch_threads)
    ours = logging.getLogger("rollscale")
    if not ours.handlers:  # a fresh worker: send progress lines to its stderr, which Ray shows on the driver
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        ours.addHandler(handler)
        ours.setLevel(logging.INFO)
        ours.propagate = False
    attempt = record_attempt(run_dir)
    if attempt["resume_step"]:
        log.info("%s: worker %s:%d resumes from checkpoint step %d",
                 config.run_id, attempt["host"], attempt["pid"], attempt["resume_step"])
    return train_run.fn(ref, config, bucket, train_problems, val_problems, run_dir, lora, device, trackers)


def train_runs_on_ray(
    ref: ModelRef,
    configs: list[RunConfig],
    bucket: str,
    train_problems: list[Problem],
    val_problems: list[Problem],
    runs_dir: Path,
    lora: LoraParams | None,
    sweep: SweepParams,
    torch_threads: int,
    device: str = "auto",
    trackers: TrackerTargets | None = None,
) -> tuple[list[RunResult], list[str]]:
    """Train every run as a Ray task (inside the calling sweep flow); returns the results
    of the runs that returned and one "run_id: error" line per run that raised."""
    import ray
    from prefect.client.orchestration import get_client
    from prefect_ray import RayTaskRunner
    from prefect_ray.context import remote_options

    address = ray_address(sweep)
    if address == "auto":  # the runner would start a new Ray for "auto"; ray.init connects (or fails)
        runner = RayTaskRunner(init_kwargs={"address": "auto"})
    else:
        # a Ray this process starts: no dashboard (one more server, and a port, per sweep)
        runner = RayTaskRunner(address=address, init_kwargs={} if address else {"include_dashboard": False})
    with get_client(sync_client=True) as client:  # the API this flow reports to (a temporary one when unset)
        api_url = str(client.api_url)
    where = address or ("the Ray already started" if ray.is_initialized() else "a local Ray")
    with runner:
        gpus = gpus_per_run(sweep, device, ray.cluster_resources().get("GPU", 0))
        print(f"sweep: {len(configs)} runs as Ray tasks on {where} "
              f"({sweep.ray_cpus_per_run:g} CPU, {gpus:g} GPU per run)")
        with remote_options(num_cpus=sweep.ray_cpus_per_run, num_gpus=gpus,
                            max_retries=WORKER_RETRIES, runtime_env={"env_vars": worker_env(api_url)}):
            futures = [
                runner.submit(train_run_on_worker, {
                    "ref": ref, "config": c, "bucket": bucket, "train_problems": train_problems,
                    "val_problems": val_problems, "run_dir": str(runs_dir / c.run_id), "lora": lora,
                    "torch_threads": torch_threads, "device": device, "trackers": trackers,
                })
                for c in configs
            ]
        results, errors = [], []
        for config, future in zip(configs, futures):
            try:
                results.append(future.result())
            except Exception as err:  # a broken run must not hide the others' results
                log.error("sweep: run %s failed: %s: %s", config.run_id, type(err).__name__, err)
                errors.append(f"{config.run_id}: {type(err).__name__}: {err}")
    return results, errors
