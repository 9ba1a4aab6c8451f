"""Tasks of the ``sweep`` stage: one GRPO training run each, and the run folders they train in.

A run's persistence and caching is its :class:`~rollscale.train.checkpoint.RunStore`
(checksummed checkpoints plus the rows they commit): a finished run is not
trained again and an interrupted one resumes from its last checkpoint. So the
task itself is not cached by Prefect (its result lives in the run folder, not
in Prefect's store); it is retried on transient errors, resuming each time.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from pathlib import Path

import pandas as pd
import torch
from prefect import task
from prefect.cache_policies import NO_CACHE

from rollscale.train.checkpoint import RunStore
from rollscale.config import LoraParams, SamplingParams
from rollscale.lm.models import ModelRef
from rollscale.core.problems.problem import Problem
from rollscale.pipeline.stages.outputs import run_damage
from rollscale.pipeline.progress import Progress
from rollscale.pipeline.stages.specs import read_json
from rollscale.train.trackers import ExportingRunStore, RunExporter, TrackerTargets
from rollscale.pipeline.stages.status import record_attempt
from rollscale.files import write_parquet_atomic
from rollscale.train.run_config import END_REASONS, RunConfig, RunResult, config_hash, data_hash, run_row
from rollscale.train.trainer import GRPOTrainer
from tasks.common import refresh_duckdb, transient
from tasks.sharded_run import train_sharded
from tasks.models import training_model

log = logging.getLogger("rollscale.sweep.grid")


def ended_result(store: RunStore, config: RunConfig, train_problems: list[Problem],
                 budget: float | None) -> RunResult | None:
    """The result of a run that needs no training, read from its folder: finished (``done.json``,
    intact) or already paused at ``budget`` (its newest checkpoint at budget <= C < C_max); else
    None. Without it, a resumed sweep loaded the model and built an engine (vLLM: minutes) for
    each finished run only to find it finished."""
    done = store.done()
    if done is not None and done.get("status") == "finished":
        store.check_same_run(done, config.run_id, config_hash(config), data_hash(train_problems))
        return RunResult(config.run_id, "finished", None, int(done.get("steps") or 0), int(done.get("c") or 0),
                         int(done.get("c_tokens") or 0))
    if budget is None or done is not None:
        return None
    ckpt = store.latest()
    c = int(ckpt.state.get("c", 0)) if ckpt else 0
    # evaluated at that step too (a periodic checkpoint past a lowered budget is evaluated on resume)
    if ckpt is None or not budget <= c < config.c_max or ckpt.state.get("last_eval_step") != ckpt.state.get("step"):
        return None
    store.check_same_run(ckpt.state, config.run_id, config_hash(config), data_hash(train_problems))
    return RunResult(config.run_id, "paused", None, int(ckpt.state.get("step", 0)), c,
                     int(ckpt.state.get("c_tokens", 0)))


@task(name="train-run", cache_policy=NO_CACHE, retries=1, retry_delay_seconds=2, retry_condition_fn=transient)
def train_run(
    ref: ModelRef,
    config: RunConfig,
    bucket: str,
    train_problems: list[Problem],
    val_problems: list[Problem],
    run_dir: str,
    lora: LoraParams | None = None,
    device: str = "auto",
    trackers: TrackerTargets | None = None,
    sampling: SamplingParams | None = None,
    budget: float | None = None,
    devices: int = 1,
    torch_threads: int | None = None,
) -> RunResult:
    """Train (or resume, or skip when finished) one GRPO run into ``run_dir``, sampling with
    the ``sampling.backend`` engine (default: HF ``generate`` on the training model); with
    ``trackers``, each checkpoint's committed rows are copied to TensorBoard / MLflow.
    ``budget``: pause there (a search's rung, science §9.4) instead of at C_max.
    ``devices`` > 1: one FSDP2 run over that many processes (:mod:`tasks.sharded_run`); its
    rows go to the trackers when it ends. ``torch_threads``: given where the run trains in a worker (a local
    process or a Ray task, as the sweep starts every run): the worker's torch threads, its progress lines on its
    stderr, and the attempt (pid, host, the checkpoint step it resumes from) recorded in the run's
    ``attempts.jsonl``."""
    if torch_threads is not None:
        _start_in_worker(config, run_dir, torch_threads, budget)
    run_dir_path = Path(run_dir)
    if (ended := ended_result(RunStore(run_dir_path), config, train_problems, budget)) is not None:
        log.info("%s: %s at C = %d, kept (no model loaded)", config.run_id, ended.status, ended.c)
        return ended  # its runs row says so already
    write_parquet_atomic(run_row(config, bucket, "running"), run_dir_path / "run.parquet")
    sampling = sampling or SamplingParams()
    try:
        if devices > 1:
            result = train_sharded(devices, torch.get_num_threads(), ref=ref, config=config, bucket=bucket,
                                   train_problems=train_problems, val_problems=val_problems, run_dir=run_dir,
                                   lora=lora, device=device, sampling=sampling, budget=budget)
            if trackers:
                RunExporter(trackers, run_dir_path, config.run_id, config.to_dict()).export(
                    None if result.status == "paused" else result.status)
        else:
            with training_model(ref, sampling, lora, device) as (model, tokenizer, engine, use_lora):
                trainer = GRPOTrainer(model, tokenizer, train_problems, val_problems, config,
                                      use_chat_template=ref.chat_template, lora=use_lora, engine=engine,
                                      chat_template_kwargs=sampling.chat_template_kwargs)
                result = _train(trainer, config, run_dir_path, trackers, budget)
                del trainer
    except Exception as err:  # a failed run says so in the runs table (a retry or resume overwrites it)
        write_parquet_atomic(run_row(config, bucket, "failed", error=f"{type(err).__name__}: {err}"),
                             run_dir_path / "run.parquet")
        raise
    finally:
        torch.set_grad_enabled(True)
    write_parquet_atomic(run_row(config, bucket, result.status, result), run_dir_path / "run.parquet")
    return result


def _start_in_worker(config: RunConfig, run_dir: str, torch_threads: int, budget: float | None) -> None:
    """A worker's set-up before a run: its threads, a log handler, the attempt recorded."""
    torch.set_num_threads(torch_threads)
    ours = logging.getLogger("rollscale")
    if not ours.handlers:  # a fresh worker: send progress lines to its stderr, which the driver shows
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        ours.addHandler(handler)
        ours.setLevel(logging.INFO)
        ours.propagate = False
    attempt = record_attempt(run_dir, budget=budget)  # the leg's target: a start for the next rung is no restart
    if attempt["resume_step"]:
        log.info("%s: worker %s:%d resumes from checkpoint step %d",
                 config.run_id, attempt["host"], attempt["pid"], attempt["resume_step"])


def _train(trainer: GRPOTrainer, config: RunConfig, run_dir_path: Path, trackers: TrackerTargets | None,
           budget: float | None = None) -> RunResult:
    """The run loop with its progress bar; each checkpoint's rows go to the trackers."""
    exporter = trackers and RunExporter(trackers, run_dir_path, config.run_id, config.to_dict())
    store = ExportingRunStore(run_dir_path, exporter) if exporter else RunStore(run_dir_path)
    resumed = store.latest()  # a resumed run's bar starts at its committed C, not at 0
    # a search's rung pauses the run at its budget: the bar and its ETA run to there (science §9.4)
    end = int(min(config.c_max, budget)) if budget is not None else config.c_max
    start = min(int(resumed.state.get("c", 0)), end) if resumed else 0
    desc = config.run_id if end == config.c_max else f"{config.run_id} (to rung C = {end:,})"
    with Progress(end, desc, unit="rollouts", initial=start) as bar:
        last = {"c": start, "eval": ""}

        def progress(c: int, c_max: int) -> None:
            bar.update(min(c, end) - last["c"], val=last["eval"])
            last["c"] = min(c, end)

        def on_eval(row: dict) -> None:
            last["eval"] = f"{row['avg_at_k']:.3f}"
            log.info("%s: step %d, C=%d, val avg@%d = %.3f ± %.3f, greedy %.3f", config.run_id, row["step"], row["c"],
                     config.eval_k, row["avg_at_k"], row["avg_at_k_se"], row["greedy"])

        result = trainer.run(store, on_eval=on_eval, progress=progress, budget=budget)
    if exporter:  # a paused run's rows go out, its MLflow run stays open
        exporter.export(None if result.status == "paused" else result.status)
    return result


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
    them with (:func:`rollscale.pipeline.stages.outputs.run_damage`): named, and their done marker removed, so
    each is trained again from its newest good checkpoint (the run store skips damaged ones) to the
    untouched run's rows; never recorded as it is. Their ids."""
    damaged = set()
    for run_dir in run_dirs:
        if problem := run_damage(artifacts, run_dir):
            print(f"sweep: {run_dir.name} is damaged ({problem}): training it again from its last good checkpoint")
            (run_dir / "done.json").unlink(missing_ok=True)
            damaged.add(run_dir.name)
    return damaged


def mark_interrupted(artifacts: Path, runs: list) -> None:
    """The ``runs`` rows of an interrupted sweep agree with ``rollscale status`` (the table said
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
