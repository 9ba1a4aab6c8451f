"""The fit stage's forecast past the data (science §10): the ``forecast`` and ``backtest`` tables.

Per design group with an ordered key (the n design, and B_problem at each fixed n; a rule has no order and keeps
§9's per-key decision; an iso-batch group is read against steps, not C, and is left to §9 too): one surface over
the keys (:mod:`rollscale.core.fit.surface`), its bootstrap refits once, and every key's reward read at each
budget of ``budgets`` (the target C* and the multiples of the runs' budget the report's "with more compute"
section shows). Beside it the group's backtest (§11.4): its runs cut at 1 / m of their budget, m = C* / c_max
(at least 2), forecast where they end; its errors widen the forecast's interval (split-conformal). A group whose surface cannot be fitted (too few keys or points) is a ``backtest`` row saying why, never an
error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from rollscale.core.fit.backtest import BACKTEST_COLUMNS, Backtest, calibrated
from rollscale.core.fit.forecast import FORECAST_COLUMNS, ForecastSettings, bootstrap_surface, forecast_group
from rollscale.core.fit.tables import design_groups

__all__ = ["COMPUTE_MULTIPLES", "FORECAST_TABLE_COLUMNS", "BACKTEST_TABLE_COLUMNS", "HorizonTables",
           "forecast_budgets", "horizon_tables"]

COMPUTE_MULTIPLES = (2, 4, 8)  # "with 2x, 4x, 8x more compute" (science §10.5): multiples of the runs' budget
GROUP_COLUMNS = ["design", "bucket", "rule", "fixed"]
FORECAST_TABLE_COLUMNS = [*GROUP_COLUMNS, "target", *[c for c in FORECAST_COLUMNS if c != "group"]]
BACKTEST_TABLE_COLUMNS = [*GROUP_COLUMNS, *BACKTEST_COLUMNS, "coverage", "mean_error", "failed", "note"]
_ORDERED_DESIGNS = ("n", "b_problem")  # designs whose key has an order (the surface is in log2 of it)
MIN_KEYS = 2  # a line through the keys needs two of them


@dataclass(frozen=True)
class HorizonTables:
    forecast: pd.DataFrame  # FORECAST_TABLE_COLUMNS
    backtest: pd.DataFrame  # BACKTEST_TABLE_COLUMNS


def forecast_budgets(c_star: float, c_max: float, multiples: tuple[int, ...] = COMPUTE_MULTIPLES) -> list[float]:
    """The budgets the forecast is read at: C* and ``multiples`` x the runs' budget C_max, increasing."""
    if not (c_star > 0 and c_max > 0):
        raise ValueError(f"forecast budgets: expected C* > 0 and C_max > 0, got {c_star!r} and {c_max!r}")
    return sorted({float(c_star), *(float(m * c_max) for m in multiples)})


def _group_label(design: str, g: object) -> dict[str, str]:
    return {"design": design, "bucket": str(g.bucket), "rule": str(g.rule), "fixed": str(g.fixed)}  # type: ignore


def _backtest_rows(label: dict[str, str], bt: Backtest) -> pd.DataFrame:
    rows = bt.keys if len(bt.keys) else pd.DataFrame([{}])
    return rows.assign(**label, coverage=bt.coverage, mean_error=bt.mean_error, failed=bt.failed, note=bt.note)


def horizon_tables(evals: pd.DataFrame, c_star: float, budgets: list[float],
                   settings: ForecastSettings = ForecastSettings()) -> HorizonTables:
    """Every ordered design group's forecast at ``budgets`` (``target`` marks the rows at ``c_star``) and its
    backtest (``evals``: :func:`rollscale.core.fit.analysis.run_evals`'s table)."""
    forecasts, backtests = [], []
    for design in _ORDERED_DESIGNS:
        for g in design_groups(evals, design)[0]:
            label = _group_label(design, g)
            rows = g.rows
            if rows[g.key_col].nunique() < MIN_KEYS or rows["c"].gt(0).sum() < 4:
                backtests.append(pd.DataFrame([{**label, "coverage": math.nan, "mean_error": math.nan,
                                                "failed": True, "note": "no forecast: fewer than two keys with "
                                                "evaluations past C = 0"}]))
                continue
            try:
                boot = bootstrap_surface(rows, g.key_col, settings.at_answer(rows, c_star))
            except (ValueError, RuntimeError, np.linalg.LinAlgError) as err:
                backtests.append(pd.DataFrame([{**label, "coverage": math.nan, "mean_error": math.nan,
                                                "failed": True, "note": f"no forecast: {err}"}]))
                continue
            try:
                boot, bt = calibrated(boot, rows, g.key_col, c_star)
                backtests.append(_backtest_rows(label, bt))
            except (ValueError, RuntimeError, np.linalg.LinAlgError) as err:
                backtests.append(pd.DataFrame([{**label, "coverage": math.nan, "mean_error": math.nan,
                                                "failed": True, "note": f"no backtest: {err}"}]))
            for c in budgets:
                part = forecast_group(rows, g.key_col, c, settings=boot.settings, boot=boot)
                forecasts.append(part.drop(columns=["group"], errors="ignore").assign(
                    **label, target=bool(math.isclose(c, c_star))))
    forecast = (pd.concat(forecasts, ignore_index=True)[FORECAST_TABLE_COLUMNS] if forecasts
                else pd.DataFrame(columns=FORECAST_TABLE_COLUMNS))
    if len(forecast):
        forecast["leader"] = pd.array([None if pd.isna(v) else int(v) for v in forecast["leader"]], dtype="Int64")
    back = (pd.concat(backtests, ignore_index=True).reindex(columns=BACKTEST_TABLE_COLUMNS) if backtests
            else pd.DataFrame(columns=BACKTEST_TABLE_COLUMNS))
    return HorizonTables(forecast, back)
