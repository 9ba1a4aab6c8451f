"""Stage ``sweep``: GRPO training runs over rollouts per prompt n, prompts per step
B_problem and allocation rules, each with a rollout budget C_max (science §1, §3-5).

For every grid point of the chosen design (prompt axis, rollout axis,
iso-batch or grid), within the hardware bound B_problem * n <= B_max, we train
the base model with GRPO on the bucket's training split, logging every step and
evaluating on the bucket's validation split. We plan the runs of the search
method; train each to its next budget (a grid's: C_max); as the runs of a
group's rung come back, decide from their evaluations which keys stop and which
keys and seeds join (science §9.4; the ``search`` table); and repeat until
every run is stopped or at C_max. Runs are checkpointed; finished runs are not
trained again, interrupted ones resume, and a run that diverges (non-finite
loss) is recorded as failed while the others go on.
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
from prefect import flow

from rollscale.files import write_json_atomic
from rollscale.pipeline.stages.specs import ARCHIVE_STALE_ENV
from rollscale.pipeline.stages.outputs import search_table_damage
from rollscale.pipeline.stages.status import runs_kept, sweep_progress
from rollscale.train.trackers import tracker_targets
from rollscale.train.run_config import RunConfig
from tasks.common import ARTIFACTS, bucket_problems, read_model_ref, read_params, refresh_duckdb
from rollscale.pipeline.runtime.workers import local_runner, raise_first_error, run_all
from rollscale.sweep.rungs import SweepSearch
from tasks.models import sampling_config
from tasks.sweep import (archive_stale_runs, mark_interrupted, refuse_stale_runs, reopen_damaged_runs, run_identity,
                         train_run)


def kept_work(artifacts: Path) -> str:
    """What an interrupted sweep kept: finished runs, and the checkpoints the others resume from."""
    runs = sweep_progress(artifacts, sweep_running=False)
    mark_interrupted(artifacts, runs)
    return runs_kept(runs)


@flow(name="sweep")
def sweep_flow(params_path: str = "params.yaml", artifacts: str = str(ARTIFACTS)) -> pd.DataFrame:
    params = read_params(params_path)
    root = Path(artifacts)
    ref = read_model_ref(root)
    sweep = params.sweep
    train, val = bucket_problems(root, sweep.bucket)
    runs_dir = root / "sweep" / "runs"
    trackers = tracker_targets(params.tracking, root / "trackers")

    # Plan: the runs of the method (sweep.search.method). A grid trains every run to C_max; the search to the
    # decision at C* (science §9.4) advances each group's runs in rungs of budget and decides after each rung;
    # the decisions of an earlier sweep with the same settings read back.
    search = SweepSearch(params, root / "sweep", sampling_config(params.sampling),
                         damage=search_table_damage(root / "sweep"))
    configs = search.configs()
    wanted = {c.run_id: run_identity(c, sweep.bucket, train) for c in configs}
    # the input is checked before anything is moved: a refused sweep leaves its outputs as they were
    stale = refuse_stale_runs(runs_dir, wanted, os.environ.get(ARCHIVE_STALE_ENV, "") == "1")
    search.begin()
    archive_stale_runs(runs_dir, stale)
    damaged = reopen_damaged_runs(root, [runs_dir / c.run_id for c in configs])
    print(f"sweep: {sweep.design} on bucket {sweep.bucket!r} ({len(train)} train / {len(val)} val problems), "
          f"{len(configs)} runs of C_max = {sweep.c_max:,} rollouts: {', '.join(c.run_id for c in configs)}")
    for i, config in enumerate(configs, 1):
        print(f"sweep: run {i}/{len(configs)}: {config.run_id} (B = {config.b_problem} x {config.n}, "
              f"~{config.nominal_steps} steps, lr {config.lr:.2e})")

    submitted: list[RunConfig] = []  # the pool's index -> run

    def unit(config: RunConfig, budget: float | None) -> tuple[dict, str]:
        """Train ``config`` to ``budget`` (None: C_max): a worker's arguments and the run's label."""
        # the folder and what makes it valid exist before a worker starts (a key the search adds too)
        (runs_dir / config.run_id).mkdir(parents=True, exist_ok=True)
        ident = wanted.get(config.run_id) or run_identity(config, sweep.bucket, train)
        write_json_atomic(ident, runs_dir / config.run_id / "identity.json")
        submitted.append(config)
        label = config.run_id if budget is None or budget >= sweep.c_max else f"{config.run_id} to C = {budget:,.0f}"
        return ({"ref": ref, "config": config, "bucket": sweep.bucket, "train_problems": train, "val_problems": val,
                 "run_dir": str(runs_dir / config.run_id), "lora": params.model.lora,
                 "torch_threads": params.torch_threads, "device": params.model.device, "trackers": trackers,
                 "sampling": params.sampling, "budget": budget, "devices": sweep.devices_per_run}, label)

    def decide(i: int, result) -> list[tuple[dict, str]]:
        """A run came back: once its group's rung is in, decide, and train the group's next rung."""
        if result.status == "failed":
            print(f"sweep: {result.run_id} failed: {result.error}")
        new = search.finished(submitted[i], result)
        refresh_duckdb(root)
        return [unit(c, b) for c, b in new]

    # Train every run to its next budget (the longest first); as a group's rung comes back, decide and
    # train its next rung: repeat until every key is stopped or at C_max.
    first = [unit(c, b) for c, b in search.start(damaged)]
    units, labels = [u for u, _ in first], [label for _, label in first]
    if sweep.executor == "ray":
        from tasks.ray_sweep import train_runs_on_ray

        _, errors = train_runs_on_ray(units, labels, sweep, decide, params.model.device)
    else:
        side = params.workers // sweep.devices_per_run  # a run of N processes takes N slots
        print(f"sweep: {len(units)} runs to train now, {min(side, max(len(units), 1))} side by side "
              f"({sweep.devices_per_run} process(es) each, {params.torch_threads} torch thread each)")
        _, errors = run_all(local_runner(side, params.torch_threads), train_run, units, labels, decide)

    configs = search.configs()  # the keys and seeds the search added are runs of the sweep too
    refresh_duckdb(root)
    runs = pd.concat([pd.read_parquet(runs_dir / c.run_id / "run.parquet") for c in configs
                      if (runs_dir / c.run_id / "run.parquet").exists()], ignore_index=True)
    print("sweep: runs\n" + runs[["run_id", "status", "steps", "c", "end_reason"]].to_string(index=False))
    raise_first_error("sweep (the other runs finished)", errors)
    return runs


if __name__ == "__main__":
    sweep_flow()
