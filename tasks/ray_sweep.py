"""The sweep's runs as Ray tasks (``sweep.executor: ray``), through prefect-ray: the same
dispatch as the local process pool (:mod:`rollscale.pipeline.runtime.workers`) on a Ray cluster.

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

import os
from typing import Any, Callable

from rollscale.config import SweepParams
from rollscale.train.run_config import RunResult
from rollscale.pipeline.runtime.workers import flow_api_url, run_all, worker_env
from tasks.sweep import train_run

# Ray re-runs a task whose worker process died this many times (system failures only)
WORKER_RETRIES = 3


def ray_address(sweep: SweepParams) -> str | None:
    """``sweep.ray_address``, else ``$RAY_ADDRESS``, else None (a local Ray is started)."""
    return sweep.ray_address or os.environ.get("RAY_ADDRESS") or None


def gpus_per_run(sweep: SweepParams, device: str, cluster_gpus: float) -> float:
    """``sweep.ray_gpus_per_run``, else 1 when the model goes on GPU (``model.device``
    cuda, or auto on a cluster with GPUs), else 0."""
    if sweep.ray_gpus_per_run is not None:
        return sweep.ray_gpus_per_run
    return 1.0 if device == "cuda" or (device == "auto" and cluster_gpus > 0) else 0.0


def train_runs_on_ray(
    units: list[dict[str, Any]],
    labels: list[str],
    sweep: SweepParams,
    on_result: Callable[[int, RunResult], list[tuple[dict[str, Any], str]] | None] | None = None,
    device: str = "auto",
) -> tuple[dict[int, RunResult], list[str]]:
    """Train every run (the parameters of :func:`tasks.sweep.train_run`, in a worker) as a Ray
    task, inside the calling sweep flow; returns {index: result} and one "run_id: error" line
    per run that raised. ``on_result`` may return new units (a search's next rung), run the same way."""
    import ray
    from prefect_ray import RayTaskRunner
    from prefect_ray.context import remote_options

    address = ray_address(sweep)
    if address == "auto":  # the runner would start a new Ray for "auto"; ray.init connects (or fails)
        runner = RayTaskRunner(init_kwargs={"address": "auto"})
    else:
        # a Ray this process starts: no dashboard (one more server, and a port, per sweep)
        runner = RayTaskRunner(address=address, init_kwargs={} if address else {"include_dashboard": False})
    api_url = flow_api_url()
    where = address or ("the Ray already started" if ray.is_initialized() else "a local Ray")
    if ray.is_initialized():
        cluster_gpus = ray.cluster_resources().get("GPU", 0)
    else:  # a local Ray sees this machine's GPUs; a remote one is asked for by ray_gpus_per_run
        import torch

        cluster_gpus = torch.cuda.device_count() if not address else 0
    # a sharded run's task holds its N devices' resources; torchrun starts its N processes there (one node)
    gpus = gpus_per_run(sweep, device, cluster_gpus) * sweep.devices_per_run
    cpus = sweep.ray_cpus_per_run * sweep.devices_per_run
    print(f"sweep: {len(units)} runs as Ray tasks on {where} "
          f"({cpus:g} CPU, {gpus:g} GPU per run)")
    with remote_options(num_cpus=cpus, num_gpus=gpus,
                        max_retries=WORKER_RETRIES, runtime_env={"env_vars": worker_env(api_url)}):
        return run_all(runner, train_run, units, labels, on_result)
