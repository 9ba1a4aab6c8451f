"""Shared pieces of the report: table registry, chart and table specs, formatting helpers."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import altair as alt
import numpy as np
import pandas as pd

from rollscale.config.study import BucketParams
from rollscale.core.fit.bootstrap import ONE_SEED
from rollscale.tables import STUDY_TABLES, table_stage

# the study tables the report may draw on: every stage's (rollscale.tables); a tracked production run's table
# is no stage's, so the report never says its "stage" has not run
TABLE_NAMES: tuple[str, ...] = STUDY_TABLES

# the bucket section's own defaults (config/study.BucketParams), for params that leave a bound out
DEFAULT_BUCKET_BOUNDS: dict[str, tuple[float, float]] = BucketParams().bounds
BUCKET_COLOURS = {"hard": "#d62728", "easy": "#2ca02c", "very_easy": "#1f77b4"}

# K_sat above this many times the largest group size n is drawn at the cap:
# beyond it the estimate no longer tells "many" from "infinitely many" rollouts.
K_SAT_CAP_PER_N = 4.0

MIN_INTERVAL_SEEDS = 3  # a key's own bootstrap over fewer seeds is no interval (science §9.3)

CHART_WIDTH = 520
CHART_HEIGHT = 280
N_SCHEME = alt.Scale(scheme={"name": "viridis", "extent": [0.0, 0.85]})  # no pale yellow end


# ---------------------------------------------------------------------------
# result shapes


@dataclass(frozen=True)
class ChartSpec:
    """One figure of the report: a drawn Altair chart, or why it is missing.

    Exactly one of ``chart`` and ``missing`` is set. ``caption`` is one
    sentence saying what the figure shows.
    """

    name: str
    title: str
    caption: str
    chart: alt.TopLevelMixin | None = None
    missing: str | None = None

    def __post_init__(self) -> None:
        if (self.chart is None) == (self.missing is None):
            raise ValueError(f"ChartSpec {self.name!r}: expected exactly one of chart and missing")

    @property
    def drawn(self) -> bool:
        return self.chart is not None


@dataclass(frozen=True)
class TableSpec:
    """One table of the report, already formatted as strings, or why it is missing."""

    name: str
    title: str
    caption: str
    frame: pd.DataFrame | None = None
    missing: str | None = None

    def __post_init__(self) -> None:
        if (self.frame is None) == (self.missing is None):
            raise ValueError(f"TableSpec {self.name!r}: expected exactly one of frame and missing")


@dataclass(frozen=True)
class ReportPaths:
    """Where :func:`write_report` put the report."""

    out_dir: Path
    html: Path
    summary: Path
    pngs: dict[str, Path] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)
    headline: str = ""  # the report's first sentence: the answer, or "No answer yet: ..."


# ---------------------------------------------------------------------------
# input handling


# why a table whose stage ran can be empty (the report says this, not "missing")
EMPTY_WHY: dict[str, str] = {
    "profile": "the problem pool was empty",
    "buckets": "no problem fell in a bucket",
    "bucket_counts": "no problem fell in a bucket",
    "noise_prompts": "measure recorded no prompt",
    "noise_steps": "measure recorded no step",
    "runs": "the sweep trained no run (every grid point was skipped; see its log)",
    "steps": "no sweep run has committed a step",
    "evals": "no sweep run has committed an evaluation",
    "fits": "fit found no finished run to fit (fit.run_status)",
    "frontier": "no curve could be fitted (each needs 4 record points at distinct budgets; the fits say which "
                "had too few)",
    "steps_to_target": "no run reached the target reward R*",
    "crs_prediction": "no group of runs to compare at a fixed batch, or no CRS measured",
    "noise_along": "no sweep step split its prompts into two halves (sweep.noise_halves: false, or one prompt a "
                   "step)",
    "epoch_transitions": "the frontier's best key never changed within the budget: there is no transition",
    "record_points": "no run has an evaluation to take record points from",
    "search": "the sweep's method makes no decisions (grid), or no rung has ended yet",
    "decision": "no finished run to decide from yet (the fit reads finished runs; `rollscale status` shows the rest)",
    "forecast": "no design group with two ordered keys (n or B_problem) and finished runs to forecast over",
    "backtest": "no design group with two ordered keys (n or B_problem) and finished runs to backtest",
    "production": "`rollscale track` has read no production run's logs yet",
}


class StageNotRun(str):
    """A report part's absence because the stage that writes its table has not run (the page
    calls only these "missing"; an empty result or too few points is said as such)."""


class StudyTables(dict):
    """The report's tables by name: a DataFrame, or None where absent; ``empty`` names the
    tables whose stage ran and wrote no row (None here, like absent ones, for the builders)."""

    empty: frozenset[str] = frozenset()


def stages_not_run(t: Mapping[str, pd.DataFrame | None]) -> list[str]:
    """The stages (in study order) none of whose tables is there, not even empty."""
    empty = getattr(t, "empty", frozenset())
    stages = list(dict.fromkeys(table_stage(name) for name in TABLE_NAMES))
    ran = {table_stage(name) for name in TABLE_NAMES if t.get(name) is not None or name in empty}
    return [s for s in stages if s not in ran]


def check_tables(tables: Mapping[str, pd.DataFrame | None]) -> StudyTables:
    if isinstance(tables, StudyTables):
        return tables
    if not isinstance(tables, Mapping):
        raise ValueError(f"tables: expected a mapping of table name -> DataFrame or None, got {type(tables).__name__}")
    unknown = sorted(set(tables) - set(TABLE_NAMES))
    if unknown:
        raise ValueError(f"tables: unknown table names {unknown} (expected some of {list(TABLE_NAMES)})")
    out = StudyTables()
    empty = set()
    for name in TABLE_NAMES:
        df = tables.get(name)
        if df is not None and not isinstance(df, pd.DataFrame):
            raise ValueError(f"tables[{name!r}]: expected a pandas DataFrame or None, got {type(df).__name__}")
        # an empty table has nothing to draw, like an absent one; absent() tells the two apart
        out[name] = df if df is not None and len(df) else None
        if df is not None and not len(df):
            empty.add(name)
    out.empty = frozenset(empty)
    return out


def require_columns(df: pd.DataFrame, table: str, columns: Sequence[str]) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(f"tables[{table!r}]: missing columns {missing} (has {list(df.columns)})")


def missing_stage(table: str, what: str | None = None) -> StageNotRun:
    stage = table_stage(table)
    what = what or f"`{table}` table"
    return StageNotRun(f"No {what} yet: run the `{stage}` stage (dvc repro {stage}).")


def absent(t: Mapping[str, pd.DataFrame | None], table: str, what: str | None = None) -> str:
    """Why ``table`` cannot be shown: its stage has not run, or it ran and the table is empty."""
    if table in getattr(t, "empty", frozenset()):
        return f"The `{table}` table is empty: {EMPTY_WHY[table]}."
    return missing_stage(table, what)


def params_dict(params: Any) -> dict[str, Any]:
    if params is None:
        return {}
    if hasattr(params, "model_dump"):  # a pydantic StudyParams
        params = params.model_dump()
    if not isinstance(params, Mapping):
        raise ValueError(f"params: expected a mapping (the parsed params.yaml) or None, got {type(params).__name__}")
    return dict(params)


def bucket_bounds(params: Mapping[str, Any]) -> dict[str, tuple[float, float]]:
    section = params.get("bucket") or {}
    if not isinstance(section, Mapping):
        raise ValueError(f"params['bucket']: expected a mapping, got {type(section).__name__}")
    out = {}
    for name, default in DEFAULT_BUCKET_BOUNDS.items():
        value = section.get(name, default)
        try:
            lo, hi = (float(v) for v in value)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"params['bucket'][{name!r}]: expected [lo, hi], got {value!r}") from exc
        if not (0.0 <= lo <= hi <= 1.0):
            raise ValueError(f"params['bucket'][{name!r}]: expected 0 <= lo <= hi <= 1, got {value!r}")
        out[name] = (lo, hi)
    return out


def k_sat_cap(params: Mapping[str, Any], n_max: float) -> float:
    section = params.get("report") or {}
    cap = section.get("k_sat_cap") if isinstance(section, Mapping) else None
    if cap is None:
        return K_SAT_CAP_PER_N * n_max
    cap = float(cap)
    if not (math.isfinite(cap) and cap > 1.0):
        raise ValueError(f"params['report']['k_sat_cap']: expected a finite number > 1, got {cap!r}")
    return cap


def as_numeric(series: pd.Series) -> pd.Series:
    return pd.to_numeric(series, errors="coerce").astype(float)


def inline_records(df: pd.DataFrame) -> alt.InlineData:
    """Inline Vega data: NaN and +-inf become null, numpy scalars plain Python."""
    rows = []
    for rec in df.to_dict("records"):
        clean = {}
        for key, value in rec.items():
            if isinstance(value, (np.generic,)):
                value = value.item()
            if isinstance(value, float) and not math.isfinite(value):
                value = None
            elif value is pd.NA or value is pd.NaT:
                value = None
            clean[str(key)] = value
        rows.append(clean)
    return alt.InlineData(values=rows)


def finish_chart(chart: alt.TopLevelMixin, title: str) -> alt.TopLevelMixin:
    """Title and shared styling; the PNG then reads on its own."""
    return (
        chart.properties(title=alt.TitleParams(title, anchor="start", fontSize=15, offset=10))
        .configure_axis(labelFontSize=11, titleFontSize=12, titleFontWeight="normal")
        .configure_legend(labelFontSize=11, titleFontSize=12, titleLimit=260, labelLimit=260)
        .configure_header(labelFontSize=12, titleFontSize=12)
        .configure_view(stroke="#ccc")
    )


def log_scale(**kw: Any) -> alt.Scale:
    # no rounding out to whole decades: it leaves most of the plot empty
    return alt.Scale(type="log", nice=False, padding=12, **kw)


def log_axis(**kw: Any) -> alt.Axis:
    # SI labels (2k, 10k) stay short enough not to run into each other
    return alt.Axis(format="~s", labelSeparation=6, labelOverlap="greedy", **kw)


def log2_ticks(values: Sequence[float]) -> list[float]:
    finite = [v for v in values if v is not None and math.isfinite(v) and v > 0]
    if not finite:
        return []
    lo, hi = math.floor(math.log2(min(finite))), math.ceil(math.log2(max(finite)))
    return [float(2**e) for e in range(lo, hi + 1)]


_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def fmt_value(value: Any, decimals: int | None = None) -> str:
    """Every number of the report, formatted for people: the one helper the tables, the text and the charts'
    labels use. Thousands get separators and no decimals (40,000, never 4e+04 or 3.968e+04); smaller numbers
    4 significant digits (0.5432, 12.35); below 0.001, ``1.2×10⁻⁵``; ``decimals`` fixes the places (rewards in
    the first line: 0.54); inf as ∞, missing as —, booleans as yes / no."""
    if value is None or value is pd.NA or value is pd.NaT:
        return "—"
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, (int, np.integer)):
        return f"{int(value):,}"
    if isinstance(value, (float, np.floating)):
        v = float(value)
        if math.isnan(v):
            return "—"
        if math.isinf(v):
            return "∞" if v > 0 else "−∞"
        if decimals is not None:
            text = f"{v:,.{decimals}f}"
            return text[1:] if text.startswith("-") and not text.strip("-0.,") else text  # no "-0.00"
        if abs(v) >= 999.95 or (v == int(v) and abs(v) < 1e15):
            return f"{v:,.0f}"
        if v == 0 or abs(v) >= 1e-3:
            return f"{v:.4g}"
        mantissa, exponent = f"{v:.2e}".split("e")
        return f"{float(mantissa):.3g}×10{str(int(exponent)).translate(_SUPERSCRIPT)}"
    return str(value)


def fmt_interval(value: Any, lo: Any, hi: Any, decimals: int | None = None, no_interval: str = ONE_SEED) -> str:
    """``v [lo, hi]`` with :func:`fmt_value`, or ``v (1 seed, no interval)`` (``no_interval``) where the interval is
    missing. With ``decimals``, places are added (up to 4) until an estimate inside its interval no longer prints
    on its edge: ``-0.005 [-0.015, 0.005]``, never ``-0.01 [-0.01, 0.01]``."""
    v = fmt_value(value, decimals)
    lo_f, hi_f = (float(pd.to_numeric(x, errors="coerce")) for x in (lo, hi))
    if v == "—":
        return v
    if math.isnan(lo_f) or math.isnan(hi_f):
        return f"{v} ({no_interval})"
    x = float(pd.to_numeric(value, errors="coerce"))
    while decimals is not None and decimals < 4 and lo_f < x < hi_f and \
            fmt_value(x, decimals) in (fmt_value(lo_f, decimals), fmt_value(hi_f, decimals)):
        decimals += 1
    return f"{fmt_value(x, decimals)} [{fmt_value(lo_f, decimals)}, {fmt_value(hi_f, decimals)}]"


def plus_minus(value: Any, se: Any) -> str:
    v = fmt_value(value)
    if v == "—" or se is None or (isinstance(se, float) and math.isnan(se)):
        return v
    return f"{v} ± {fmt_value(se)}"


def format_frame(df: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({str(c): [fmt_value(v) for v in df[c]] for c in df.columns}, columns=[str(c) for c in df.columns])


def group_labels(frame: pd.DataFrame) -> pd.Series:
    """"bucket / rule / fixed" of each row ("/ all" dropped); an empty Series for no rows (pandas' row-wise join
    of an empty frame gives a frame)."""
    labels = [" / ".join(map(str, row)) for row in frame[["bucket", "rule", "fixed"]].itertuples(index=False)]
    return pd.Series(labels, index=frame.index, dtype=object).str.removesuffix(" / all")
