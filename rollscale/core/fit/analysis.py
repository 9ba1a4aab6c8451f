"""Study-level frontier analysis: from the sweep's runs and evaluations to the fit tables (science §7).

DataFrames in, DataFrames out, built on :mod:`rollscale.core.fit.curves`. The inputs are
the sweep's ``runs`` and ``evals`` tables (and the measure stage's
``noise_steps`` for the CRS check); the outputs are the rows of the ``fits``,
``frontier``, ``epoch_transitions``, ``steps_to_target``, ``crs_prediction``
and ``record_points`` tables.

Runs are analysed in *families*: one training bucket and one allocation rule.
Runs of different buckets or rules are never pooled. Within a family the free
variable of a frontier (its *design*) is

* ``n``: rollouts per prompt, every run with that n pooled (x = compute C);
* ``b_problem``: prompts per step, among runs with the same n (x = C);
* ``iso_batch``: n among runs with the same total batch B = n·B_problem
  (x = optimizer steps M; the frontier's ``c`` is then B·M).

The frontier tables are built in :mod:`rollscale.core.fit.tables`
(re-exported here), the steps-to-target, rule and CRS tables in
:mod:`rollscale.core.fit.targets`.

``fixed`` names what is held fixed in a group: ``"all"`` for the n design,
``"n=8"``, ``"B=128"``, ``"B_problem=16"``. A fit or check that cannot be made
(one n only, too few points, a CRS not measured) is never an exception: its
row carries NaN numbers and a ``status`` saying why.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import pandas as pd

from rollscale.core.fit import curves as fit
from rollscale.core.fit.columns import EVAL_COLUMNS, RUN_COLUMNS, require
from rollscale.core.fit.tables import DESIGNS, REWARD_MAX, FrontierTables, frontier_analysis
from rollscale.core.fit.targets import (
    AXES,
    SteppedTables,
    crs_prediction,
    measured_crs,
    rule_comparison,
    steps_to_target_analysis,
    target_reward,
)

__all__ = [
    "AXES",
    "DESIGNS",
    "REWARD_MAX",
    "FrontierTables",
    "SteppedTables",
    "crs_prediction",
    "frontier_analysis",
    "rule_comparison",
    "measured_crs",
    "record_points",
    "run_evals",
    "steps_to_target_analysis",
    "target_reward",
]


# ---------------------------------------------------------------------------
# inputs


def run_evals(
    runs: pd.DataFrame, evals: pd.DataFrame, statuses: Iterable[str] | None = ("finished",)
) -> pd.DataFrame:
    """Every evaluation with its run's design, sorted by run and step (science §1, §5, §7).

    ``runs`` needs ``run_id, n, b_problem`` (``bucket``, ``rule``, ``seed``,
    ``c_max``, ``status`` are used when present); ``evals`` needs ``run_id,
    step, c, avg_at_k`` (``epochs`` when present). Only runs whose status is in
    ``statuses`` are kept (None keeps all): a diverged or interrupted run's
    curve would bias the fits. A repeated (run, step) keeps its last row.

    Columns: ``run_id, bucket, rule, seed, c_max, n, b_problem, b, step, c,
    epochs, avg_at_k`` with ``b = n * b_problem`` (science §1).
    """
    require(runs, "runs", RUN_COLUMNS)
    require(evals, "evals", EVAL_COLUMNS)
    r = runs.copy()
    if statuses is not None and "status" in r.columns:
        r = r[r["status"].astype(str).isin(set(statuses))]
    for col, default in (("bucket", "all"), ("rule", "all"), ("seed", 0), ("c_max", np.nan)):
        if col not in r.columns:
            r[col] = default
    r = r[["run_id", "bucket", "rule", "seed", "c_max", "n", "b_problem"]].drop_duplicates("run_id", keep="last")
    r["run_id"] = r["run_id"].astype(str)
    r["bucket"] = r["bucket"].fillna("all").astype(str)
    r["rule"] = r["rule"].fillna("all").astype(str)
    for col in ("n", "b_problem"):
        values = pd.to_numeric(r[col], errors="coerce")
        if values.isna().any() or (values < 1).any() or (values != values.round()).any():
            raise ValueError(f"runs.{col}: expected positive integers, got {r[col].tolist()[:5]}")
        r[col] = values.astype(int)
    r["b"] = r["n"] * r["b_problem"]

    e = evals.copy()
    e["run_id"] = e["run_id"].astype(str)
    if "epochs" not in e.columns:
        e["epochs"] = np.nan
    e = e[["run_id", "step", "c", "epochs", "avg_at_k"]]
    for col in ("step", "c", "epochs", "avg_at_k"):
        e[col] = pd.to_numeric(e[col], errors="coerce").astype(float)
    e = e.dropna(subset=["step", "c", "avg_at_k"])
    out = r.merge(e, on="run_id", how="inner")
    out = out.sort_values(["run_id", "step"]).drop_duplicates(["run_id", "step"], keep="last")
    return out.reset_index(drop=True)


def record_points(evals: pd.DataFrame, bin_width: float) -> pd.DataFrame:
    """Each run's evaluations with ``is_record``: its record-breaking points (science §7).

    ``evals`` is :func:`run_evals`'s table; within a run, rows in step order
    (compute non-decreasing) are bucketed into reward bins of ``bin_width`` and
    the first row of each new highest bin is a record.
    """
    require(evals, "evals", EVAL_COLUMNS)
    if not (isinstance(bin_width, (int, float)) and math.isfinite(bin_width) and bin_width > 0):
        raise ValueError(f"bin_width: expected a positive finite number, got {bin_width!r}")
    out = evals.sort_values(["run_id", "step"]).reset_index(drop=True)
    runs, c = out["run_id"].to_numpy(), out["c"].to_numpy(float)
    falls = np.flatnonzero((runs[1:] == runs[:-1]) & (np.diff(c) < 0))
    if falls.size:
        raise ValueError(f"evals of run {runs[falls[0]]!r}: compute: expected the evaluations in non-decreasing "
                         "compute order")
    out["is_record"] = fit.record_flags(runs, out["avg_at_k"].to_numpy(float), bin_width)
    return out
