"""Stage ``sweep``: GRPO training runs over rollouts per prompt n, prompts per step
B_problem and allocation rules, each with a rollout budget C_max (science §1, §3-5).

For every grid point of the chosen design (prompt axis, rollout axis,
iso-batch or grid), within the hardware bound B_problem * n <= B_max, we train
the base model with GRPO on the bucket's training split until the run has
generated C_max rollouts, logging every step and evaluating on the bucket's
validation split. Runs are checkpointed; finished runs are not trained again,
interrupted ones resume, and a run that diverges (non-finite loss) is recorded
as failed while the others go on.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pandas as pd
from prefect import flow

from rollscale.core.problems.problem import Problem
from rollscale.core.search.decisions import rung_budgets
from rollscale.files import write_json_atomic, write_parquet_atomic
from rollscale.train.search_groups import search_plan, search_settings
from rollscale.train.sweep import point_config, run_configs
from rollscale.train.run_config import RunConfig, config_hash
from rollscale.pipeline.outputs import run_damage
from rollscale.pipeline.stages import ARCHIVE_STALE_ENV, read_json
from rollscale.pipeline.status import runs_kept, sweep_progress
from rollscale.pipeline.trackers import tracker_targets
from tasks.common import ARTIFACTS, bucket_problems, read_model_ref, read_params, refresh_duckdb
from tasks.models import sampling_config
from tasks.parallel import local_runner, raise_first_error, run_all
from tasks.search import FrontierSearch, no_search
from tasks.sweep import END_REASONS, train_run_in_worker

def run_identity(config: RunConfig, bucket: str, train: list[Problem]) -> dict:
    """What makes a run folder's content valid for this config."""
    return {"config_hash": config_hash(config), "bucket": bucket, "train_ids": len(train),
            "train_first": train[0].problem_id, "train_last": train[-1].problem_id}


def stale_run_dirs(runs_dir: Path, wanted: dict[str, dict]) -> list[Path]:
    """Run folders of other configs: not in this sweep's grid, or their identity changed."""
    if not runs_dir.exists():
        return []
    stale = []
    for run_dir in sorted(p for p in runs_dir.iterdir() if p.is_dir()):
        ident_file = run_dir / "identity.json"
        ident = json.loads(ident_file.read_text()) if ident_file.exists() else None
        if not (run_dir.name in wanted and ident == wanted[run_dir.name]):
            stale.append(run_dir)
    return stale


def refuse_stale_runs(runs_dir: Path, wanted: dict[str, dict], allowed: bool) -> list[Path]:
    """The run folders of other configs (:func:`stale_run_dirs`). Params alone never take ended runs
    (done.json: finished or failed) out of the tables: that needs ``allowed`` (``rollscale run sweep
    --archive-stale``), else a ValueError names them, before the sweep has moved anything."""
    stale = stale_run_dirs(runs_dir, wanted)
    ended = [d.name for d in stale if (d / "done.json").exists()]
    if ended and not allowed:
        shown = ", ".join(ended[:4]) + (f" and {len(ended) - 4} more" if len(ended) > 4 else "")
        raise ValueError(f"sweep: this grid would move {len(ended)} ended runs out of the runs/steps/evals tables "
                         f"(not in the grid, or their config changed): {shown}; to archive them run `rollscale run "
                         "sweep --archive-stale` (or `rollscale study --archive-stale`), to keep them restore the grid")
    return stale


def archive_stale_runs(runs_dir: Path, stale: list[Path]) -> None:
    """Move run folders of other configs out of the ``runs`` tables (kept under archive/)."""
    for run_dir in stale:
        dest = runs_dir.parent / "archive" / f"{run_dir.name}-{time.strftime('%Y%m%d-%H%M%S')}"
        dest.parent.mkdir(parents=True, exist_ok=True)
        print(f"sweep: archiving {run_dir.name} (not in this sweep's grid, or its config changed) to {dest}")
        shutil.move(str(run_dir), dest)


def reopen_damaged_runs(artifacts: Path, run_dirs: list[Path]) -> set[str]:
    """Ended runs (finished, or stopped by the search) whose stored results fail the checks ``fit`` reads
    them with (:func:`rollscale.pipeline.outputs.run_damage`): named, and their done marker removed, so
    each is trained again from its newest good checkpoint (the run store skips damaged ones) to the
    untouched run's rows; never recorded as it is. Their ids."""
    damaged = set()
    for run_dir in run_dirs:
        if problem := run_damage(artifacts, run_dir):
            print(f"sweep: {run_dir.name} is damaged ({problem}): training it again from its last good checkpoint")
            (run_dir / "done.json").unlink(missing_ok=True)
            damaged.add(run_dir.name)
    return damaged


def in_play(search: FrontierSearch, alone: list[RunConfig]) -> list[RunConfig]:
    """The runs of a frontier sweep: those its decisions have put in play, and the grid points it does
    not search (each once)."""
    return list({c.run_id: c for c in search.configs() + alone}.values())


def mark_interrupted(artifacts: Path, runs: list) -> None:
    """The ``runs`` rows of an interrupted sweep agree with ``rollscale status`` (issue 32: the table said
    "running", 0 steps): a run the interrupt ended mid-way is "interrupted" at its last committed step and
    C; one whose ``done.json`` was written before its row (the interrupt fell between) gets its ended
    status. A later sweep marks the interrupted ones running again as it resumes them."""
    for r in runs:
        path = artifacts / "sweep" / "runs" / r.run_id / "run.parquet"
        if r.status not in ("interrupted", "finished", "stopped", "failed") or not path.exists():
            continue
        row = pd.read_parquet(path)
        if row["status"].iloc[0] == "running":
            done = read_json(path.parent / "done.json") or {}  # an ended run's own account, else the checkpoint's
            step = int(done.get("steps", r.step or 0))
            reason = f"interrupted at step {step}" if r.status == "interrupted" else END_REASONS.get(r.status)
            ended = {k: done[k] for k in ("c_tokens",) if k in done}
            write_parquet_atomic(row.assign(status=r.status, steps=step, c=int(done.get("c", r.c or 0)),
                                            end_reason=reason, **ended).astype({"end_reason": "string"}), path)
    refresh_duckdb(artifacts)


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
    sampling = sampling_config(params.sampling)
    configs = run_configs(sweep, sampling)
    sweep_dir = root / "sweep"
    runs_dir = sweep_dir / "runs"
    trackers = tracker_targets(params.tracking, root / "trackers")

    # Frontier search (science §8): runs advance in rungs of budget, and after each rung of a group the
    # keys that cannot be best at any budget to come stop there; grid: every run trains to C_max.
    search, alone = None, []
    if sweep.search.method in ("frontier", "decision"):  # §8, or §9.4: one loop, the method in the settings
        groups = search_plan(sweep)
        grid = {c.run_id: c for c in configs}

        def config_of(group: str, key, seed: int) -> RunConfig:
            config = point_config(sweep, sampling, groups.point(group, key, seed))
            return grid.get(config.run_id, config)

        search = FrontierSearch(groups, search_settings(sweep, params.study), sweep_dir, sweep.bucket, config_of,
                                lambda c: runs_dir / c.run_id)
        alone = [point_config(sweep, sampling, p) for p in groups.alone]
        configs = in_play(search, alone)
    wanted = {c.run_id: run_identity(c, sweep.bucket, train) for c in configs}
    # the input is checked before anything is moved: a refused sweep leaves its outputs as they were
    stale = refuse_stale_runs(runs_dir, wanted, os.environ.get(ARCHIVE_STALE_ENV, "") == "1")
    if search:
        search.begin()
        rungs = rung_budgets(sweep.c_max, sweep.search.eta, sweep.search.first_rung)
        if groups.groups:
            what = "frontier search" if sweep.search.method == "frontier" else "search to the decision at C*"
            print(f"sweep: {what} over {groups.design} in {len(groups.groups)} group(s), rungs at C = "
                  f"{', '.join(f'{c:,}' for c in rungs)} (eta {sweep.search.eta}, alpha {sweep.search.alpha})")
        else:
            print("sweep: frontier search: no two keys to choose between in this grid; every run trains to C_max")
    else:
        no_search(sweep_dir)
    archive_stale_runs(runs_dir, stale)
    damaged = reopen_damaged_runs(root, [runs_dir / c.run_id for c in configs])
    print(f"sweep: {sweep.design} on bucket {sweep.bucket!r} ({len(train)} train / {len(val)} val problems), "
          f"{len(configs)} runs of C_max = {sweep.c_max:,} rollouts: {', '.join(c.run_id for c in configs)}")
    for i, config in enumerate(configs, 1):
        print(f"sweep: run {i}/{len(configs)}: {config.run_id} (B = {config.b_problem} x {config.n}, "
              f"~{config.nominal_steps} steps, lr {config.lr:.2e})")

    submitted: list[RunConfig] = []  # the pool's index -> run

    def unit(config: RunConfig, budget: float | None) -> tuple[dict, str]:
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

    # the longest runs (most steps: more evaluations and per-step work) go first, so the pool's
    # last round is short runs, not one long run beside an idle worker
    first = search.start() + [(c, None) for c in alone] if search else [(c, None) for c in configs]
    if search:
        first += search.repair(damaged - {c.run_id for c, _ in first})
    units, labels = zip(*[unit(c, b) for c, b in sorted(first, key=lambda u: -u[0].nominal_steps)]) if first else ((), ())

    def finished(i: int, result) -> list[tuple[dict, str]]:
        if result.status == "failed":
            print(f"sweep: {result.run_id} failed: {result.error}")
        new = search.finished(submitted[i], result) if search else []
        refresh_duckdb(root)
        return [unit(c, b) for c, b in new]

    if sweep.executor == "ray":
        from tasks.ray_sweep import train_runs_on_ray

        _, errors = train_runs_on_ray(list(units), list(labels), sweep, finished, params.model.device)
    else:
        side = params.workers // sweep.devices_per_run  # a run of N processes takes N slots
        print(f"sweep: {len(units)} runs to train now, {min(side, max(len(units), 1))} side by side "
              f"({sweep.devices_per_run} process(es) each, {params.torch_threads} torch thread each)")
        _, errors = run_all(local_runner(side, params.torch_threads), train_run_in_worker, list(units),
                            list(labels), finished)
    if search:  # the keys and seeds the search added are runs of the sweep too
        configs = in_play(search, alone)
    refresh_duckdb(root)
    runs = pd.concat([pd.read_parquet(runs_dir / c.run_id / "run.parquet") for c in configs
                      if (runs_dir / c.run_id / "run.parquet").exists()], ignore_index=True)
    print("sweep: runs\n" + runs[["run_id", "status", "steps", "c", "end_reason"]].to_string(index=False))
    raise_first_error("sweep (the other runs finished)", errors)
    return runs


if __name__ == "__main__":
    sweep_flow()
