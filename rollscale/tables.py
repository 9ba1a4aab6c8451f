"""The study's tables: where each one's Parquet files live under ``artifacts/``, and
which stage writes it (the contract users query with ``rollscale sql``).

A leaf module (it imports nothing from rollscale): the pipeline queries these
tables, the report reads them, and both take the list from here.
"""

from __future__ import annotations

__all__ = ["RUN_PART_TABLES", "SEARCH_COLUMNS", "STUDY_TABLES", "TABLES", "TRACKED_TABLES", "table_stage"]

# table name -> Parquet glob relative to the artifacts folder.
# The first path component is the stage that writes the table.
TABLES: dict[str, str] = {
    "profile": "profile/profile.parquet",
    "buckets": "bucket/buckets.parquet",
    "bucket_counts": "bucket/bucket_counts.parquet",
    "noise_prompts": "measure/noise_prompts.parquet",
    "noise_steps": "measure/noise_steps.parquet",
    "runs": "sweep/runs/*/run.parquet",
    "steps": "sweep/runs/*/steps-*.parquet",
    "evals": "sweep/runs/*/evals-*.parquet",
    "search": "sweep/search.parquet",
    "fits": "fit/fits.parquet",
    "frontier": "fit/frontier.parquet",
    "steps_to_target": "fit/steps_to_target.parquet",
    "crs_prediction": "fit/crs_prediction.parquet",
    "noise_along": "fit/noise_along.parquet",
    "epoch_transitions": "fit/epoch_transitions.parquet",
    "record_points": "fit/record_points.parquet",
    "decision": "fit/decision.parquet",
    "forecast": "fit/forecast.parquet",
    "backtest": "fit/backtest.parquet",
    "production": "production/production.parquet",
}
# the ``search`` table's columns (rollscale.core.search.state makes its rows): here, so that every stage's check
# of a damaged search table reads them without importing the search
SEARCH_COLUMNS = ("group", "decision", "rung", "c", "key", "seed", "action", "rule", "c_train", "leader",
                  "leader_lo", "key_hi", "best_share", "at_c", "n_points", "note", "c_star", "r_star", "d_lo", "d_hi")
# tables whose rows are committed by a run's checkpoints (rollscale.train.checkpoint)
RUN_PART_TABLES = ("steps", "evals")
# tables no stage writes: a command outside the study (name -> the command). Their folder under artifacts/ is
# no stage, so the report and `rollscale status` never count it as one that has not run; `rollscale sql` queries them
TRACKED_TABLES: dict[str, str] = {"production": "rollscale track --logs DIR"}
# the study's own tables, each written by a stage of dvc.yaml
STUDY_TABLES: tuple[str, ...] = tuple(name for name in TABLES if name not in TRACKED_TABLES)


def table_stage(name: str) -> str:
    """The stage that writes table ``name`` (for a tracked table, the folder its command writes)."""
    return TABLES[name].split("/")[0]

