"""Tasks of ``rollscale track`` (flows/track.py): the run's logs, the study's tables, the tick, its files.

Not a DVC stage: a production run's logs change while nothing of the study does, so the tick itself decides
what is new (:func:`rollscale.integrations.track.tick.track_tick`) and writes only then.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from rollscale.config import StudyParams, TrackParams
from rollscale.core.fit.analysis import run_evals
from rollscale.files import write_parquet_atomic, write_text_atomic
from rollscale.integrations.track.logs import LogsNotYet, RunLog, read_log
from rollscale.integrations.track.tick import Tick, track_tick
from rollscale.tables import TABLES
from tasks.common import retried_task
from tasks.fit import read_tables

PAGE = "production/index.html"  # under artifacts/, beside the production table


@retried_task(name="read-run-log")
def read_run_log(logs: str, fmt: str) -> RunLog | str:
    """The run's logs now, or the line to say while it has written none (the tick waits for them)."""
    try:
        return read_log(logs, fmt)
    except LogsNotYet as why:
        return f"track: waiting for the run's logs: {why}; the next tick reads them again"


@retried_task(name="study-evaluations")
def study_tables(artifacts: Path, params: StudyParams) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The ``decision`` table and the study's evaluations of finished runs (as the fit stage reads them)."""
    t = read_tables(artifacts, ["decision", "runs", "evals"])
    if t["decision"] is None:
        raise LookupError(f"{artifacts / TABLES['decision']}: no decision yet; run the fit stage first (rollscale run fit)")
    if t["runs"] is None or t["evals"] is None:
        raise LookupError(f"{artifacts / 'sweep'}: no runs or evaluations of the study; run the sweep stage first")
    return t["decision"], run_evals(t["runs"], t["evals"], params.fit.run_status)


@retried_task(name="track-tick")
def tick(params: StudyParams, track: TrackParams, decision: pd.DataFrame, evals: pd.DataFrame, log: RunLog,
         artifacts: Path, logs_id: str) -> Tick:
    path = artifacts / TABLES["production"]
    table = pd.read_parquet(path) if path.exists() else None
    return track_tick(params, track, decision, evals, log, table, logs_id, track.format, str(artifacts))


@retried_task(name="write-production")
def write_tick(done: Tick, artifacts: Path) -> list[Path]:
    """The ``production`` table and the page, atomically; nothing when the tick found nothing new."""
    if done.table is None or done.page is None:
        return []
    return [write_parquet_atomic(done.table, artifacts / TABLES["production"]),
            write_text_atomic(done.page, artifacts / PAGE)]
