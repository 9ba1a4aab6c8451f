"""The study report: Altair charts, one offline HTML page, PNGs and a Markdown summary.

Inputs are the study tables of the design (``profile``, ``buckets``,
``noise_prompts``, ``noise_steps``, ``runs``, ``steps``, ``evals``, ``fits``,
``frontier``, ``steps_to_target``, ``crs_prediction``, ``epoch_transitions``)
as pandas DataFrames; any of them may be missing (None). A missing or too
small table never fails the report: the chart or table in its place says
which stage to run.

* :func:`build_charts` draws the figures (science §2, §5, §6.2, §6.3, §7).
* :func:`summary_tables` gives the tables (bucket counts, K_sat with its null,
  fits with standard errors, steps to target, CRS prediction, runs).
* :func:`write_report` writes ``index.html`` (one self-contained file: the
  Vega / Vega-Lite / vega-embed JavaScript comes inline from vl-convert's
  bundle, so the page opens with no network), ``charts/<name>.png`` and
  ``summary.md``; every file is written atomically.

Chart data is embedded as inline records (NaN and infinities turned into
null) rather than DataFrames, so the charts serialise whatever their size.
"""

from __future__ import annotations

import html
import io
import json
import math
import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import altair as alt
import numpy as np
import pandas as pd

from rollscale.core import noise

__all__ = [
    "TABLE_NAMES",
    "ChartSpec",
    "ReportPaths",
    "TableSpec",
    "build_charts",
    "quintile_tables",
    "summary_tables",
    "write_report",
]

# table -> the pipeline stage that writes it (design.md)
TABLE_STAGES: dict[str, str] = {
    "profile": "profile",
    "buckets": "bucket",
    "noise_prompts": "measure",
    "noise_steps": "measure",
    "runs": "sweep",
    "steps": "sweep",
    "evals": "sweep",
    "fits": "fit",
    "frontier": "fit",
    "steps_to_target": "fit",
    "crs_prediction": "fit",
    "epoch_transitions": "fit",
}
TABLE_NAMES: tuple[str, ...] = tuple(TABLE_STAGES)

DEFAULT_BUCKET_BOUNDS: dict[str, tuple[float, float]] = {
    "hard": (0.0, 0.0625),
    "easy": (0.3, 0.6),
    "very_easy": (0.6, 0.9),
}
BUCKET_COLOURS = {"hard": "#d62728", "easy": "#2ca02c", "very_easy": "#1f77b4"}

# K_sat above this many times the largest group size n is drawn at the cap:
# beyond it the estimate no longer tells "many" from "infinitely many" rollouts.
K_SAT_CAP_PER_N = 4.0

CHART_WIDTH = 520
CHART_HEIGHT = 280
_N_SCHEME = alt.Scale(scheme={"name": "viridis", "extent": [0.0, 0.85]})  # no pale yellow end


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


# ---------------------------------------------------------------------------
# input handling


def _check_tables(tables: Mapping[str, pd.DataFrame | None]) -> dict[str, pd.DataFrame | None]:
    if not isinstance(tables, Mapping):
        raise ValueError(f"tables: expected a mapping of table name -> DataFrame or None, got {type(tables).__name__}")
    unknown = sorted(set(tables) - set(TABLE_NAMES))
    if unknown:
        raise ValueError(f"tables: unknown table names {unknown} (expected some of {list(TABLE_NAMES)})")
    out: dict[str, pd.DataFrame | None] = {}
    for name in TABLE_NAMES:
        df = tables.get(name)
        if df is not None and not isinstance(df, pd.DataFrame):
            raise ValueError(f"tables[{name!r}]: expected a pandas DataFrame or None, got {type(df).__name__}")
        # an empty table is as good as a missing one for the report
        out[name] = df if df is not None and len(df) else None
    return out


def _require(df: pd.DataFrame, table: str, columns: Sequence[str]) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(f"tables[{table!r}]: missing columns {missing} (has {list(df.columns)})")


def _missing_stage(table: str, what: str | None = None) -> str:
    stage = TABLE_STAGES[table]
    what = what or f"`{table}` table"
    return f"No {what} yet: run the `{stage}` stage (dvc repro {stage})."


def _params_dict(params: Any) -> dict[str, Any]:
    if params is None:
        return {}
    if hasattr(params, "model_dump"):  # a pydantic StudyParams
        params = params.model_dump()
    if not isinstance(params, Mapping):
        raise ValueError(f"params: expected a mapping (the parsed params.yaml) or None, got {type(params).__name__}")
    return dict(params)


def _bucket_bounds(params: Mapping[str, Any]) -> dict[str, tuple[float, float]]:
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


def _k_sat_cap(params: Mapping[str, Any], n_max: float) -> float:
    section = params.get("report") or {}
    cap = section.get("k_sat_cap") if isinstance(section, Mapping) else None
    if cap is None:
        return K_SAT_CAP_PER_N * n_max
    cap = float(cap)
    if not (math.isfinite(cap) and cap > 1.0):
        raise ValueError(f"params['report']['k_sat_cap']: expected a finite number > 1, got {cap!r}")
    return cap


def _num(series: pd.Series) -> pd.Series:
    return pd.to_numeric(series, errors="coerce").astype(float)


def _records(df: pd.DataFrame) -> alt.InlineData:
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


def _finish(chart: alt.TopLevelMixin, title: str) -> alt.TopLevelMixin:
    """Title and shared styling; the PNG then reads on its own."""
    return (
        chart.properties(title=alt.TitleParams(title, anchor="start", fontSize=15, offset=10))
        .configure_axis(labelFontSize=11, titleFontSize=12, titleFontWeight="normal")
        .configure_legend(labelFontSize=11, titleFontSize=12, titleLimit=260, labelLimit=260)
        .configure_header(labelFontSize=12, titleFontSize=12)
        .configure_view(stroke="#ccc")
    )


def _log_scale(**kw: Any) -> alt.Scale:
    # no rounding out to whole decades: it leaves most of the plot empty
    return alt.Scale(type="log", nice=False, padding=12, **kw)


def _log_axis(**kw: Any) -> alt.Axis:
    # SI labels (2k, 10k) stay short enough not to run into each other
    return alt.Axis(format="~s", labelSeparation=6, labelOverlap="greedy", **kw)


def _log2_ticks(values: Sequence[float]) -> list[float]:
    finite = [v for v in values if v is not None and math.isfinite(v) and v > 0]
    if not finite:
        return []
    lo, hi = math.floor(math.log2(min(finite))), math.ceil(math.log2(max(finite)))
    return [float(2**e) for e in range(lo, hi + 1)]


def _fmt(value: Any) -> str:
    """A cell for a report table: 4 significant digits, inf as ∞, missing as —."""
    if value is None or value is pd.NA or value is pd.NaT:
        return "—"
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        v = float(value)
        if math.isnan(v):
            return "—"
        if math.isinf(v):
            return "∞" if v > 0 else "−∞"
        if v == int(v) and abs(v) < 1e7:
            return str(int(v))
        return f"{v:.4g}"
    return str(value)


def _pm(value: Any, se: Any) -> str:
    v = _fmt(value)
    if v == "—" or se is None or (isinstance(se, float) and math.isnan(se)):
        return v
    return f"{v} ± {_fmt(se)}"


def _format_frame(df: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({str(c): [_fmt(v) for v in df[c]] for c in df.columns}, columns=[str(c) for c in df.columns])


# ---------------------------------------------------------------------------
# quintile tables (science §6.3)


def _k_sat_null_by_n(noise_prompts: pd.DataFrame) -> dict[int, float]:
    out = {}
    for n_value, group in noise_prompts.groupby("n"):
        n_int = int(n_value)
        nulls = _num(group["k_sat_null"]).dropna() if "k_sat_null" in group else pd.Series(dtype=float)
        out[n_int] = float(nulls.iloc[0]) if len(nulls) else noise.k_sat_null(n_int)
    return out


def _usable_k_sat(noise_prompts: pd.DataFrame) -> pd.DataFrame:
    df = noise_prompts.copy()
    df["k_sat"] = _num(df["k_sat"])
    df["pass_rate"] = _num(df["pass_rate"])
    # NaN K_sat: rho undefined (all rollouts of the group equal); nothing to report
    return df[df["k_sat"].notna() & df["pass_rate"].notna()]


def quintile_tables(noise_prompts: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Split-half K_sat by pass-rate quintile, unfiltered and IQR-filtered (science §6.3).

    Uses :func:`rollscale.core.noise.quintile_table` per group size n (prompts of
    all measurement steps pooled), with the null value ``k_sat_null =
    |R| + 1`` and ``median_ratio = median / k_sat_null`` beside K_sat as §6.3
    asks. Rows whose K_sat is NaN (rho undefined) are left out. Keys:
    ``"unfiltered"`` and ``"iqr_filtered"``; columns ``n,
    pass_rate_quintile, count, mean, median, std, [n_outliers], k_sat_null,
    median_ratio``.
    """
    if not isinstance(noise_prompts, pd.DataFrame):
        raise ValueError(f"noise_prompts: expected a pandas DataFrame, got {type(noise_prompts).__name__}")
    _require(noise_prompts, "noise_prompts", ["n", "pass_rate", "k_sat"])
    df = _usable_k_sat(noise_prompts)
    if df.empty:
        raise ValueError("noise_prompts: expected at least one row with a K_sat and a pass rate")
    nulls = _k_sat_null_by_n(df)
    out: dict[str, pd.DataFrame] = {}
    for key, drop in (("unfiltered", False), ("iqr_filtered", True)):
        parts = []
        for n_value, group in df.groupby("n"):
            table = noise.quintile_table(group["pass_rate"].to_numpy(), group["k_sat"].to_numpy(), drop_outliers=drop)
            table = table.reset_index()
            table["pass_rate_quintile"] = table["pass_rate_quintile"].astype(str)
            table.insert(0, "n", int(n_value))
            null = nulls[int(n_value)]
            table["k_sat_null"] = null
            table["median_ratio"] = table["median"] / null
            parts.append(table)
        out[key] = pd.concat(parts, ignore_index=True)
    return out


# ---------------------------------------------------------------------------
# charts


def _chart_difficulty(t: dict[str, pd.DataFrame | None], params: Mapping[str, Any]) -> ChartSpec:
    name, title = "difficulty", "Difficulty profile: avg@k per problem with the bucket bands"
    bounds = _bucket_bounds(params)
    caption = (
        "Histogram of each problem's avg@k (mean 0/1 reward over k samples, science §2) with the "
        "bucket bounds from params shaded behind it."
    )
    prof = t["profile"]
    if prof is None:
        return ChartSpec(name, title, caption, missing=_missing_stage("profile", "difficulty profile"))
    _require(prof, "profile", ["avg_at_k"])
    vals = _num(prof["avg_at_k"]).dropna().to_numpy()
    if vals.size == 0:
        return ChartSpec(name, title, caption, missing="The `profile` table has no avg@k values to plot.")
    ks = _num(prof["k"]).dropna().unique() if "k" in prof else np.array([])
    if len(ks) == 1 and float(ks[0]).is_integer() and 1 <= ks[0] <= 256:
        k = int(ks[0])
        # one bar per attainable value j/k, centred on it
        edges = np.clip((np.arange(k + 2) - 0.5) / k, 0.0, 1.0)
        k_text = f"k = {k}"
    else:
        edges = np.histogram_bin_edges(vals, bins=40, range=(0.0, 1.0))
        k_text = "k varies"
    counts, edges = np.histogram(vals, bins=edges)
    bars = pd.DataFrame({"lo": edges[:-1], "hi": edges[1:], "problems": counts})
    bands = pd.DataFrame(
        [{"bucket": b, "lo": lo, "hi": hi, "range": f"[{lo:g}, {hi:g}]"} for b, (lo, hi) in bounds.items()]
    )
    colour = alt.Color(
        "bucket:N",
        title="bucket band (params)",
        scale=alt.Scale(domain=list(bounds), range=[BUCKET_COLOURS[b] for b in bounds]),
    )
    band_layer = (
        alt.Chart(_records(bands))
        .mark_rect(opacity=0.18)
        .encode(x="lo:Q", x2="hi:Q", color=colour, tooltip=["bucket:N", "range:N"])
    )
    bar_layer = (
        alt.Chart(_records(bars))
        .mark_rect(color="#4c4c4c", stroke="white", strokeWidth=0.5)
        .encode(
            x=alt.X("lo:Q", title=f"avg@k [fraction of k samples correct, {k_text}]", scale=alt.Scale(domain=[0, 1])),
            x2="hi:Q",
            y=alt.Y("problems:Q", title="problems [count]"),
            tooltip=[
                alt.Tooltip("lo:Q", format=".3f", title="from"),
                alt.Tooltip("hi:Q", format=".3f", title="to"),
                "problems:Q",
            ],
        )
    )
    chart = alt.layer(band_layer, bar_layer).properties(width=CHART_WIDTH + 120, height=CHART_HEIGHT)
    n_zero = int(np.sum(vals == 0.0))
    caption = caption[:-1] + f" ({len(vals)} problems, {n_zero} with avg@k = 0)."
    return ChartSpec(name, title, caption, chart=_finish(chart, title))


def _chart_k_sat(t: dict[str, pd.DataFrame | None], params: Mapping[str, Any]) -> ChartSpec:
    name, title = "k_sat", "Split-half K_sat per prompt against pass rate, with the null"
    np_ = t["noise_prompts"]
    base_caption = (
        "Each point is one measured prompt group's split-half K_sat = 1/rho (science §6.3) against its pass rate; "
        "the dashed line is the null |R| + 1 that the estimator returns for exchangeable rollouts whatever the data"
    )
    if np_ is None:
        return ChartSpec(name, title, base_caption + ".", missing=_missing_stage("noise_prompts", "noise measurements"))
    _require(np_, "noise_prompts", ["n", "pass_rate", "k_sat"])
    df = _usable_k_sat(np_)
    if df.empty:
        return ChartSpec(
            name, title, base_caption + ".", missing="The `noise_prompts` table has no prompt with a defined K_sat."
        )
    nulls = _k_sat_null_by_n(df)
    cap = _k_sat_cap(params, float(df["n"].max()))
    clipped = (df["k_sat"] > cap) | np.isinf(df["k_sat"])
    n_inf = int(np.isinf(df["k_sat"]).sum())
    clipped_label = f"clipped at cap {cap:g} (K_sat > cap or ∞)"
    pts = pd.DataFrame(
        {
            "pass_rate": df["pass_rate"].to_numpy(),
            "k_sat_plot": np.where(clipped, cap, df["k_sat"].to_numpy()),
            "k_sat": [_fmt(v) for v in df["k_sat"]],
            "clipped": clipped.to_numpy(),
            "status": np.where(clipped, clipped_label, "K_sat (finite)"),
            "problem_id": df["problem_id"].astype(str).to_numpy() if "problem_id" in df else "",
            "step": _num(df["step"]).to_numpy() if "step" in df else np.nan,
            "n": _num(df["n"]).to_numpy(),
        }
    )
    status_domain = ["K_sat (finite)", clipped_label]
    y_min = max(min(float(pts["k_sat_plot"].min()), min(nulls.values())) / 1.3, 0.5)
    y_scale = alt.Scale(type="log", domain=[y_min, cap * 1.3])
    points = (
        alt.Chart(_records(pts))
        .mark_point(filled=True, opacity=0.7)
        .encode(
            size=alt.condition(alt.datum.clipped, alt.value(90), alt.value(30)),
            x=alt.X("pass_rate:Q", title="pass rate [fraction of the group's n rollouts correct]",
                    scale=alt.Scale(domain=[0, 1])),
            y=alt.Y("k_sat_plot:Q", title="split-half K_sat = 1/rho [rollouts]", scale=y_scale),
            color=alt.Color("status:N", title=None,
                            scale=alt.Scale(domain=status_domain, range=["#1f77b4", "#d62728"]),
                            legend=alt.Legend(orient="bottom", direction="vertical")),
            shape=alt.Shape("status:N", title=None,
                            scale=alt.Scale(domain=status_domain, range=["circle", "triangle-up"])),
            tooltip=["problem_id:N", "step:Q", "n:Q", alt.Tooltip("pass_rate:Q", format=".3f"), "k_sat:N"],
        )
    )
    null_dashes = [[6, 3], [12, 4], [3, 3], [8, 2, 2, 2]]
    lines = pd.DataFrame(
        [{"y": v, "line": f"null |R|+1 = {v:g} (n = {n})"} for n, v in sorted(nulls.items())]
        + [{"y": cap, "line": f"cap = {cap:g} (K_sat above it drawn here)"}]
    )
    dashes = [null_dashes[i % len(null_dashes)] for i in range(len(nulls))] + [[2, 2]]
    rules = (
        alt.Chart(_records(lines))
        .mark_rule(strokeWidth=1.5, color="#333")
        .encode(
            y="y:Q",
            strokeDash=alt.StrokeDash(
                "line:N", title="reference lines",
                scale=alt.Scale(domain=list(lines["line"]), range=dashes),
                legend=alt.Legend(orient="bottom", direction="vertical", symbolStrokeWidth=1.5, symbolSize=400),
            ),
            tooltip=["line:N"],
        )
    )
    chart = alt.layer(rules, points).properties(width=CHART_WIDTH + 120, height=CHART_HEIGHT + 40)
    caption = (
        base_caption
        + f"; K_sat above the cap of {cap:g} rollouts, or infinite (rho <= 0), is drawn at the cap as a red triangle "
        f"({int(clipped.sum())} of {len(df)} prompts, {n_inf} infinite)."
    )
    return ChartSpec(name, title, caption, chart=_finish(chart, title))


# line samples in the legend: the default symbol (the line's point) hides the dash
_DASH_LEGEND = alt.Legend(
    symbolType="stroke", symbolStrokeWidth=2, symbolSize=300, symbolStrokeColor="#333", symbolFillColor="transparent"
)

_NOISE_STEP_QUANTITIES = {
    "b_simple": "B_simple (McCandlish)",
    "k_crit": "K_crit",
    "k_sat_icc": "K_sat_icc = 1/rho_icc",
}


def _chart_noise_steps(t: dict[str, pd.DataFrame | None], params: Mapping[str, Any]) -> ChartSpec:
    name, title = "noise_steps", "Gradient noise over training steps: B_simple, K_crit and rho_icc"
    caption = (
        "Step-level noise (science §6.2, §6.3): B_simple, K_crit and K_sat_icc in rollouts on a log scale (top) and "
        "the intraclass rho_icc (bottom) at each measurement step"
    )
    ns = t["noise_steps"]
    if ns is None:
        return ChartSpec(name, title, caption + ".", missing=_missing_stage("noise_steps", "noise measurements"))
    _require(ns, "noise_steps", ["step", "n", "rho_icc", "k_crit", "b_simple"])
    quantities = [q for q in _NOISE_STEP_QUANTITIES if q in ns.columns]
    long = ns[["step", "n", *quantities]].melt(id_vars=["step", "n"], var_name="quantity", value_name="value")
    long["value"] = _num(long["value"])
    n_inf = int(np.isinf(long["value"]).sum())
    long = long[np.isfinite(long["value"]) & (long["value"] > 0)].copy()
    long["quantity"] = long["quantity"].map(_NOISE_STEP_QUANTITIES)
    rho = pd.DataFrame({"step": _num(ns["step"]), "n": _num(ns["n"]), "rho_icc": _num(ns["rho_icc"])}).dropna()
    if long.empty and rho.empty:
        return ChartSpec(name, title, caption + ".", missing="The `noise_steps` table has no finite values to plot.")
    multi_n = ns["n"].nunique() > 1
    step_x = alt.X("step:Q", title="training step [steps]")
    top_enc: dict[str, Any] = {
        "x": step_x,
        "y": alt.Y("value:Q", title="noise scale [rollouts]", scale=_log_scale(), axis=_log_axis()),
        "color": alt.Color("quantity:N", title="quantity",
                           scale=alt.Scale(domain=list(_NOISE_STEP_QUANTITIES.values()),
                                           range=["#1f77b4", "#d62728", "#ff7f0e"])),
        "tooltip": ["step:Q", "n:Q", "quantity:N", alt.Tooltip("value:Q", format=".4g")],
    }
    if multi_n:
        top_enc["strokeDash"] = alt.StrokeDash("n:N", title="n (rollouts per prompt)", legend=_DASH_LEGEND)
        top_enc["detail"] = "n:N"
    top = alt.Chart(_records(long)).mark_line(point=True).encode(**top_enc)
    bottom_enc: dict[str, Any] = {
        "x": step_x,
        "y": alt.Y("rho_icc:Q", title="rho_icc [dimensionless]"),
        "tooltip": ["step:Q", "n:Q", alt.Tooltip("rho_icc:Q", format=".4f")],
    }
    if multi_n:
        bottom_enc["strokeDash"] = alt.StrokeDash("n:N", title="n (rollouts per prompt)", legend=_DASH_LEGEND)
    bottom = (
        alt.Chart(_records(rho))
        .mark_line(point=alt.OverlayMarkDef(color="#2ca02c"), color="#2ca02c")
        .encode(**bottom_enc)
    )
    chart = alt.vconcat(
        top.properties(width=CHART_WIDTH + 120, height=CHART_HEIGHT - 40),
        bottom.properties(width=CHART_WIDTH + 120, height=CHART_HEIGHT - 120),
    )
    if n_inf:
        caption += f"; infinite values (signal below the noise floor; {n_inf} here) leave gaps in the lines"
    return ChartSpec(name, title, caption + ".", chart=_finish(chart, title))


def _evals_with_runs(t: dict[str, pd.DataFrame | None], columns: Sequence[str]) -> tuple[pd.DataFrame, bool]:
    """Evals joined with the runs' n, B_problem and bucket; False when runs is missing."""
    ev = t["evals"]
    assert ev is not None
    _require(ev, "evals", ["run_id", "c", *columns])
    ev = ev.copy()
    ev["c"] = _num(ev["c"])
    for col in columns:
        ev[col] = _num(ev[col])
    runs = t["runs"]
    has_runs = runs is not None
    if has_runs:
        _require(runs, "runs", ["run_id", "n"])
        keep = [c for c in ("run_id", "n", "b_problem", "bucket") if c in runs.columns]
        ev = ev.drop(columns=[c for c in keep if c != "run_id" and c in ev.columns]).merge(
            runs[keep], on="run_id", how="left"
        )
    ev["run_id"] = ev["run_id"].astype(str)
    if "bucket" not in ev:
        ev["bucket"] = "all"
    ev["bucket"] = ev["bucket"].fillna("unknown").astype(str)
    return ev, has_runs


def _facet_buckets(layered: alt.LayerChart, data: pd.DataFrame, **facet: Any) -> alt.TopLevelMixin:
    if data["bucket"].nunique() > 1:
        facet.setdefault("column", alt.Column("bucket:N", title="training bucket"))
    if facet:
        return layered.facet(**facet)
    return layered


def _run_colour(has_runs: bool) -> alt.Color:
    if has_runs:
        return alt.Color("n:O", title="n (rollouts per prompt)", scale=_N_SCHEME)
    return alt.Color("run_id:N", title="run (runs table missing)", scale=alt.Scale(scheme="tableau10"))


def _chart_reward_vs_compute(t: dict[str, pd.DataFrame | None], params: Mapping[str, Any]) -> ChartSpec:
    name, title = "reward_vs_compute", "Validation reward against compute, every run"
    caption = (
        "Validation avg@k (science §5) with a ±1 SE band against cumulative compute C in rollouts generated "
        "(science §1, log scale) for every run, coloured by n"
    )
    if t["evals"] is None:
        return ChartSpec(name, title, caption + ".", missing=_missing_stage("evals", "sweep results"))
    ev, has_runs = _evals_with_runs(t, ["avg_at_k"])
    has_se = "avg_at_k_se" in ev.columns and _num(ev["avg_at_k_se"]).notna().any()
    if has_se:
        ev["avg_at_k_se"] = _num(ev["avg_at_k_se"])
        ev["lo"] = ev["avg_at_k"] - ev["avg_at_k_se"]
        ev["hi"] = ev["avg_at_k"] + ev["avg_at_k_se"]
    n_zero = int((ev["c"] <= 0).sum())
    ev = ev[(ev["c"] > 0) & ev["avg_at_k"].notna()]
    if ev.empty:
        return ChartSpec(name, title, caption + ".", missing="The `evals` table has no evaluation at C > 0 to plot.")
    cols = [c for c in ("run_id", "c", "avg_at_k", "lo", "hi", "n", "b_problem", "bucket", "step", "epochs")
            if c in ev.columns]
    data = ev[cols].sort_values(["run_id", "c"])
    colour = _run_colour(has_runs)
    # the band fills through its own legend-less scale: on the colour scale the legend turns pale
    band_fill = alt.Fill("n:O", scale=_N_SCHEME, legend=None) if has_runs else alt.Fill(
        "run_id:N", scale=alt.Scale(scheme="tableau10"), legend=None
    )
    x = alt.X("c:Q", title="compute C [rollouts generated]", scale=_log_scale(), axis=_log_axis())
    tooltip = [c + (":N" if c in ("run_id", "bucket") else ":Q") for c in cols if c not in ("lo", "hi")]
    layers = []
    if has_se:
        layers.append(
            alt.Chart().mark_area(opacity=0.15).encode(x=x, y="lo:Q", y2="hi:Q", fill=band_fill, detail="run_id:N")
        )
    layers.append(
        alt.Chart()
        .mark_line(point=alt.OverlayMarkDef(size=18))
        .encode(
            x=x,
            y=alt.Y("avg_at_k:Q", title="validation reward avg@k [fraction correct]"),
            color=colour,
            detail="run_id:N",
            tooltip=tooltip,
        )
    )
    sized = [lyr.properties(width=CHART_WIDTH, height=CHART_HEIGHT) for lyr in layers]
    layered = alt.layer(*sized, data=_records(data))
    chart = _facet_buckets(layered, data)
    if n_zero:
        caption += f"; the {n_zero} evaluations at C = 0 are left off the log axis"
    if not has_se:
        caption += "; the evals table has no standard errors, so there is no band"
    if not has_runs:
        caption += "; the runs table is missing, so runs are coloured by run id instead of n"
    return ChartSpec(name, title, caption + ".", chart=_finish(chart, title))


_DESIGN_LABELS = {
    "n": ("n*", "n (rollouts per prompt)", "compute C [rollouts generated]", "n* [rollouts per prompt]"),
    "b_problem": ("B_problem*", "B_problem (prompts per step)", "compute C [rollouts generated]",
                  "B_problem* [prompts per step]"),
    "iso_batch": ("n* at fixed B", "n (rollouts per prompt, fixed B)", "optimizer steps M [steps]",
                  "n* [rollouts per prompt]"),
}


def _sigmoid_curves(fits: pd.DataFrame | None, design: str, c_lo: float, c_hi: float) -> pd.DataFrame:
    """Each key's fitted R(C) = R0 + (A - R0) / (1 + (C_mid / C)^beta) on a log grid (science §7)."""
    if fits is None or "kind" not in fits.columns:
        return pd.DataFrame(columns=["key", "c", "reward"])
    rows = fits[fits["kind"].astype(str) == f"sigmoid_{design}"]
    needed = {"key", "r0", "a", "c_mid", "beta"}
    if rows.empty or not needed <= set(rows.columns):
        return pd.DataFrame(columns=["key", "c", "reward"])
    if "status" in rows:
        rows = rows[rows["status"].astype(str) == "ok"]
    grid = np.logspace(math.log10(c_lo), math.log10(c_hi), 60)
    parts = []
    for _, r in rows.iterrows():
        r0, a, c_mid, beta = (float(pd.to_numeric(r[k], errors="coerce")) for k in ("r0", "a", "c_mid", "beta"))
        if not all(math.isfinite(v) for v in (r0, a, c_mid, beta)) or c_mid <= 0:
            continue
        reward = r0 + (a - r0) / (1.0 + (c_mid / grid) ** beta)
        key = float(pd.to_numeric(r["key"], errors="coerce"))
        parts.append(pd.DataFrame({"key": key, "c": grid, "reward": reward}))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=["key", "c", "reward"])


def _fit_status(fits: pd.DataFrame | None, kind: str) -> str | None:
    if fits is None or "kind" not in fits.columns or "status" not in fits.columns:
        return None
    rows = fits[fits["kind"].astype(str) == kind]
    return None if rows.empty else str(rows["status"].iloc[0])


def _chart_frontier(t: dict[str, pd.DataFrame | None], params: Mapping[str, Any]) -> ChartSpec:
    name, title = "frontier", "Compute-optimal frontier F(C) coloured by n*, and the fitted n*(C)"
    caption = (
        "Left: the frontier F(C) = max over n of the fitted per-n sigmoids (thin lines) with each grid point "
        "coloured by its argmax n*; right: n*(C) on a log2 axis with the fitted logistic n*(C) line (science §7)"
    )
    fr = t["frontier"]
    if fr is None:
        return ChartSpec(name, title, caption + ".", missing=_missing_stage("frontier", "frontier fit"))
    _require(fr, "frontier", ["design", "frontier_reward", "best_key"])
    rows = []
    notes = []
    for design in [d for d in _DESIGN_LABELS if d in set(fr["design"].astype(str))]:
        part = fr[fr["design"].astype(str) == design].copy()
        xcol = "m" if design == "iso_batch" and "m" in part and _num(part["m"]).notna().any() else "c"
        _require(part, "frontier", [xcol])
        df = pd.DataFrame(
            {
                "x": _num(part[xcol]),
                "frontier_reward": _num(part["frontier_reward"]),
                "key": _num(part["best_key"]),
                "key_fit": _num(part["n_star_fit"]) if "n_star_fit" in part else np.nan,
            }
        )
        df = df[(df["x"] > 0) & df["frontier_reward"].notna()]
        if df.empty:
            notes.append(f"design {design!r} has no usable frontier points")
            continue
        star, key_title, x_title, y_title = _DESIGN_LABELS[design]
        x = alt.X("x:Q", title=x_title, scale=_log_scale(), axis=_log_axis())
        colour = alt.Color("key:O", title=key_title, scale=_N_SCHEME)
        curves = _sigmoid_curves(t["fits"], design, float(df["x"].min()), float(df["x"].max()))
        left_layers = []
        if not curves.empty:
            left_layers.append(
                alt.Chart(_records(curves.rename(columns={"c": "x"})))
                .mark_line(strokeWidth=1.2, opacity=0.55)
                # own legend-less stroke scale: on the colour scale the legend would turn pale
                .encode(x=x, y="reward:Q", stroke=alt.Stroke("key:O", scale=_N_SCHEME, legend=None))
            )
        left_layers.append(
            alt.Chart(_records(df))
            .mark_line(color="#999", strokeWidth=1)
            .encode(x=x, y=alt.Y("frontier_reward:Q", title="validation reward [fraction correct]"))
        )
        left_layers.append(
            alt.Chart(_records(df))
            .mark_circle(size=45, opacity=0.95)
            .encode(
                x=x,
                y="frontier_reward:Q",
                color=colour,
                tooltip=[alt.Tooltip("x:Q", title=x_title, format=".4g"),
                         alt.Tooltip("frontier_reward:Q", format=".3f"), alt.Tooltip("key:O", title=star)],
            )
        )
        left = alt.layer(*left_layers).properties(
            width=CHART_WIDTH - 140, height=CHART_HEIGHT - 20, title=f"frontier ({design} design)"
        )
        ticks = _log2_ticks(list(df["key"]) + list(df["key_fit"].dropna()))
        y_key = alt.Y("key:Q", title=y_title, scale=alt.Scale(type="log", base=2), axis=alt.Axis(values=ticks))
        right_layers = [
            alt.Chart(_records(df))
            .mark_circle(size=40)
            .encode(x=x, y=y_key, color=colour, tooltip=[alt.Tooltip("x:Q", format=".4g"), "key:Q"])
        ]
        fit_pts = df.dropna(subset=["key_fit"])
        fit_pts = fit_pts[fit_pts["key_fit"] > 0]
        if not fit_pts.empty:
            right_layers.append(
                alt.Chart(_records(fit_pts))
                .mark_line(color="black", strokeDash=[5, 3])
                .encode(x=x, y=alt.Y("key_fit:Q", scale=alt.Scale(type="log", base=2)))
            )
        else:
            status = _fit_status(t["fits"], "n_star" if design == "n" else f"n_star_{design}")
            notes.append(f"no fitted {star}(C) line for the {design} design" + (f" ({status})" if status else ""))
        right = alt.layer(*right_layers).properties(
            width=CHART_WIDTH - 240, height=CHART_HEIGHT - 20, title=f"{star} and its fit (dashed)"
        )
        rows.append(alt.hconcat(left, right).resolve_scale(color="shared"))
    if not rows:
        return ChartSpec(name, title, caption + ".",
                         missing="The `frontier` table has no usable points: "
                         + "; ".join(notes or ["no known design"]) + ".")
    chart = rows[0] if len(rows) == 1 else alt.vconcat(*rows).resolve_scale(color="independent")
    if notes:
        caption += "; " + "; ".join(notes)
    return ChartSpec(name, title, caption + ".", chart=_finish(chart, title))


def _chart_best_worst(t: dict[str, pd.DataFrame | None], params: Mapping[str, Any]) -> ChartSpec:
    name, title = "best_worst_at_k", "best@k and worst@k against compute, per n"
    caption = (
        "Coverage best@k and reliability worst@k (science §5) against compute C in rollouts (log scale) for every "
        "run coloured by n, with each run's peak marked by a larger point, the optimum it reached"
    )
    if t["evals"] is None:
        return ChartSpec(name, title, caption + ".", missing=_missing_stage("evals", "sweep results"))
    ev, has_runs = _evals_with_runs(t, ["best_at_k", "worst_at_k"])
    ev = ev[ev["c"] > 0]
    idv = [c for c in ("run_id", "c", "n", "b_problem", "bucket", "eval_k") if c in ev.columns]
    long = ev[[*idv, "best_at_k", "worst_at_k"]].melt(id_vars=idv, var_name="metric", value_name="value")
    long = long[long["value"].notna()].copy()
    if long.empty:
        return ChartSpec(name, title, caption + ".",
                         missing="The `evals` table has no best@k / worst@k at C > 0 to plot.")
    long["metric"] = long["metric"].map({"best_at_k": "best@k (coverage)", "worst_at_k": "worst@k (all k correct)"})
    long = long.sort_values(["run_id", "metric", "c"]).reset_index(drop=True)
    # a run's optimum: the first evaluation (lowest C) reaching its highest value
    long["is_peak"] = long.index.isin(long.groupby(["run_id", "metric"])["value"].idxmax())
    colour = _run_colour(has_runs)
    x = alt.X("c:Q", title="compute C [rollouts generated]", scale=_log_scale(), axis=_log_axis())
    y = alt.Y("value:Q", title="fraction of validation problems [0-1]")
    tooltip = ["run_id:N", "metric:N", alt.Tooltip("c:Q", format=".4g"), alt.Tooltip("value:Q", format=".3f")]
    if has_runs:
        tooltip.append("n:Q")
    lines = alt.Chart().mark_line(strokeWidth=1.5).encode(x=x, y=y, color=colour, detail="run_id:N", tooltip=tooltip)
    peaks = (
        alt.Chart()
        .mark_point(filled=True, size=70, stroke="black", strokeWidth=0.6)
        .encode(x=x, y=y, color=colour, tooltip=tooltip)
        .transform_filter(alt.datum.is_peak)
    )
    layered = alt.layer(
        lines.properties(width=CHART_WIDTH - 180, height=CHART_HEIGHT - 40),
        peaks.properties(width=CHART_WIDTH - 180, height=CHART_HEIGHT - 40),
        data=_records(long),
    )
    facet: dict[str, Any] = {"column": alt.Column("metric:N", title=None)}
    if long["bucket"].nunique() > 1:
        facet["row"] = alt.Row("bucket:N", title="training bucket")
    chart = layered.facet(**facet)
    if not has_runs:
        caption += "; the runs table is missing, so runs are coloured by run id instead of n"
    return ChartSpec(name, title, caption + ".", chart=_finish(chart, title))


def _steps_fit_row(fits: pd.DataFrame | None, axis: str) -> dict[str, Any] | None:
    if fits is None or "kind" not in fits.columns:
        return None
    rows = fits[fits["kind"].astype(str) == f"steps_to_target_{axis}"]
    return None if rows.empty else rows.iloc[0].to_dict()


def _chart_steps_to_target(t: dict[str, pd.DataFrame | None], params: Mapping[str, Any]) -> ChartSpec:
    name, title = "steps_to_target", "Steps and rollouts to reach the target reward: S(B) and E(B)"
    caption = (
        "Steps to target S(B) and rollouts trained on E(B) = B·S(B) against the batch size B = B_problem·n "
        "(log-log), for the prompt axis (n fixed) and the rollout axis (B_problem fixed), with the fitted "
        "S(B) = S_min (1 + B_crit / B) as lines (science §7)"
    )
    st = t["steps_to_target"]
    if st is None:
        missing = _missing_stage("steps_to_target", "steps-to-target results")
        return ChartSpec(name, title, caption + ".", missing=missing)
    _require(st, "steps_to_target", ["axis", "b", "steps"])
    obs = pd.DataFrame({"axis": st["axis"].astype(str), "b": _num(st["b"]), "S": _num(st["steps"])})
    for col in ("n", "b_problem", "target"):
        obs[col] = _num(st[col]) if col in st else np.nan
    obs = obs[(obs["b"] > 0) & (obs["S"] > 0)]
    if obs.empty:
        return ChartSpec(name, title, caption + ".",
                         missing="No run reached the target reward, so there is no S(B) to plot (`steps_to_target`).")
    obs["E"] = obs["b"] * obs["S"]
    obs["kind"] = "observed"
    fit_parts, notes = [], []
    for axis in sorted(obs["axis"].unique()):
        row = _steps_fit_row(t["fits"], axis)
        if row is None:
            notes.append(f"no fit for the {axis} axis")
            continue
        status = str(row.get("status", "ok"))
        s_min, e_min = (float(pd.to_numeric(row.get(k), errors="coerce")) for k in ("s_min", "e_min"))
        if status != "ok" or not (math.isfinite(s_min) and math.isfinite(e_min)):
            notes.append(f"{axis} axis fit: {status}")
            continue
        b_obs = obs.loc[obs["axis"] == axis, "b"]
        grid = np.logspace(math.log10(b_obs.min()), math.log10(b_obs.max()), 50)
        s_fit = s_min + e_min / grid
        fit_parts.append(pd.DataFrame({"axis": axis, "b": grid, "S": s_fit, "E": grid * s_fit, "kind": "fit"}))
        b_crit = float(pd.to_numeric(row.get("b_crit"), errors="coerce"))
        b_crit_se = float(pd.to_numeric(row.get("b_crit_se"), errors="coerce"))
        notes.append(f"{axis} axis B_crit = {_pm(b_crit, b_crit_se)} rollouts")
    data = pd.concat([obs, *fit_parts], ignore_index=True)
    x = alt.X("b:Q", title="batch size B [rollouts per step]", scale=_log_scale(), axis=_log_axis())
    axis_colour = alt.Color("axis:N", title="axis",
                            scale=alt.Scale(domain=["prompt", "rollout"], range=["#1f77b4", "#d62728"]))

    def panel(field_: str, y_title: str) -> alt.TopLevelMixin:
        y = alt.Y(f"{field_}:Q", title=y_title, scale=_log_scale(), axis=_log_axis())
        pts = (
            alt.Chart()
            .mark_point(filled=True, size=55)
            .encode(x=x, y=y, color=axis_colour,
                    tooltip=["axis:N", "b:Q", "n:Q", "b_problem:Q", f"{field_}:Q", "target:Q"])
            .transform_filter(alt.datum.kind == "observed")
        )
        line = (
            alt.Chart()
            .mark_line(strokeDash=[5, 3])
            .encode(x=x, y=y, color=axis_colour)
            .transform_filter(alt.datum.kind == "fit")
        )
        return alt.layer(
            pts.properties(width=CHART_WIDTH - 200, height=CHART_HEIGHT - 80),
            line.properties(width=CHART_WIDTH - 200, height=CHART_HEIGHT - 80),
            data=_records(data),
        ).facet(column=alt.Column("axis:N", title=None, header=alt.Header(labelExpr="datum.value + ' axis'")))

    chart = alt.vconcat(
        panel("S", "S: steps to target [steps]"), panel("E", "E = B·S [rollouts trained on]")
    )
    if notes:
        caption += "; " + "; ".join(notes)
    return ChartSpec(name, title, caption + ".", chart=_finish(chart, title))


def _chart_crs_prediction(t: dict[str, pd.DataFrame | None], params: Mapping[str, Any]) -> ChartSpec:
    name, title = "crs_prediction", "CRS-predicted against observed best n under a fixed total batch"
    caption = (
        "Each point is one fixed total batch B: the n nearest the measured critical rollout size CRS (science §6.3) "
        "against the n that reached the best validation reward (science §7); points on the dashed y = x line agree"
    )
    cp = t["crs_prediction"]
    if cp is None:
        return ChartSpec(name, title, caption + ".", missing=_missing_stage("crs_prediction", "CRS prediction check"))
    _require(cp, "crs_prediction", ["b", "predicted_n", "observed_best_n"])
    df = pd.DataFrame(
        {
            "b": _num(cp["b"]),
            "crs": [_fmt(v) for v in _num(cp["crs"])] if "crs" in cp else "—",
            "predicted_n": _num(cp["predicted_n"]),
            "observed_best_n": _num(cp["observed_best_n"]),
        }
    )
    n_unmeasured = int(df["predicted_n"].isna().sum())
    df = df.dropna(subset=["predicted_n", "observed_best_n"])
    df = df[(df["predicted_n"] > 0) & (df["observed_best_n"] > 0)]
    if df.empty:
        return ChartSpec(name, title, caption + ".",
                         missing="The `crs_prediction` table has no row with both a predicted and an observed best n.")
    df["agree"] = np.where(df["predicted_n"] == df["observed_best_n"], "agree", "disagree")
    df["label"] = [f"B={_fmt(b)}" for b in df["b"]]
    ticks = _log2_ticks(list(df["predicted_n"]) + list(df["observed_best_n"]))
    lo, hi = ticks[0] / 1.5, ticks[-1] * 1.5
    axis_scale = alt.Scale(type="log", base=2, domain=[lo, hi])
    diag = pd.DataFrame({"predicted_n": [lo, hi], "observed_best_n": [lo, hi]})
    line = (
        alt.Chart(_records(diag))
        .mark_line(color="#777", strokeDash=[5, 3])
        .encode(x=alt.X("predicted_n:Q", scale=axis_scale), y=alt.Y("observed_best_n:Q", scale=axis_scale))
    )
    pts_enc = {
        "x": alt.X("predicted_n:Q", title="CRS-predicted best n [rollouts per prompt]", scale=axis_scale,
                   axis=alt.Axis(values=ticks)),
        "y": alt.Y("observed_best_n:Q", title="observed best n [rollouts per prompt]", scale=axis_scale,
                   axis=alt.Axis(values=ticks)),
    }
    pts = (
        alt.Chart(_records(df))
        .mark_point(filled=True, size=90, opacity=0.85)
        .encode(
            **pts_enc,
            color=alt.Color("agree:N", title=None,
                            scale=alt.Scale(domain=["agree", "disagree"], range=["#2ca02c", "#ff7f0e"])),
            tooltip=["b:Q", "crs:N", "predicted_n:Q", "observed_best_n:Q", "agree:N"],
        )
    )
    labels = (
        alt.Chart(_records(df))
        .mark_text(align="left", dx=8, dy=-6, fontSize=10, color="#333")
        .encode(**pts_enc, text="label:N")
    )
    chart = alt.layer(line, pts, labels).properties(width=CHART_HEIGHT + 60, height=CHART_HEIGHT + 60)
    caption += f" ({int((df['agree'] == 'agree').sum())} of {len(df)} agree"
    if n_unmeasured:
        caption += f"; {n_unmeasured} batch sizes without a measured CRS are left out"
    return ChartSpec(name, title, caption + ").", chart=_finish(chart, title))


_CHART_BUILDERS = (
    _chart_difficulty,
    _chart_k_sat,
    _chart_noise_steps,
    _chart_reward_vs_compute,
    _chart_frontier,
    _chart_best_worst,
    _chart_steps_to_target,
    _chart_crs_prediction,
)


def build_charts(tables: Mapping[str, pd.DataFrame | None], params: Mapping[str, Any] | None = None) -> list[ChartSpec]:
    """The report's eight figures, in order (science §2, §5, §6.2, §6.3, §7).

    1. ``difficulty``: avg@k histogram with the bucket bands of
       ``params["bucket"]`` (defaults easy [0.3, 0.6], hard [0, 0.0625],
       very_easy [0.6, 0.9]).
    2. ``k_sat``: split-half K_sat against pass rate with the null |R| + 1;
       K_sat above ``params["report"]["k_sat_cap"]`` (default 4 × the largest
       n) or infinite is drawn at the cap as a distinct marker.
    3. ``noise_steps``: B_simple, K_crit, K_sat_icc (log) and rho_icc over steps.
    4. ``reward_vs_compute``: validation avg@k ± SE against C, every run, by n.
    5. ``frontier``: F(C) coloured by n* and the fitted n*(C), per design.
    6. ``best_worst_at_k``: best@k and worst@k against C per run, peaks marked.
    7. ``steps_to_target``: S(B) and E(B) with their fits, prompt and rollout axes.
    8. ``crs_prediction``: predicted against observed best n, with y = x.

    A table that is missing (None, absent or empty) or too small gives a
    ChartSpec with ``missing`` naming the stage to run; a present table
    lacking the columns a chart needs raises ValueError.
    """
    t = _check_tables(tables)
    p = _params_dict(params)
    _bucket_bounds(p)  # bad bounds fail before any drawing
    return [builder(t, p) for builder in _CHART_BUILDERS]


# ---------------------------------------------------------------------------
# tables


def _table_bucket_counts(t: dict[str, pd.DataFrame | None]) -> TableSpec:
    name, title = "bucket_counts", "Bucket counts"
    caption = "Problems per difficulty bucket and split (science §2), with the avg@k range found in each bucket."
    b = t["buckets"]
    if b is None:
        return TableSpec(name, title, caption, missing=_missing_stage("buckets", "buckets"))
    _require(b, "buckets", ["problem_id", "bucket", "split"])
    counts = pd.crosstab(b["bucket"].astype(str), b["split"].astype(str))
    counts["total"] = counts.sum(axis=1)
    counts = counts.reset_index().rename(columns={"row_0": "bucket"})
    counts.columns.name = None
    prof = t["profile"]
    if prof is not None and {"problem_id", "avg_at_k"} <= set(prof.columns):
        merged = b.merge(prof[["problem_id", "avg_at_k"]], on="problem_id", how="left")
        merged["avg_at_k"] = _num(merged["avg_at_k"])
        rng = merged.groupby(merged["bucket"].astype(str))["avg_at_k"].agg(["min", "max"])
        counts["avg@k min"] = counts["bucket"].map(rng["min"])
        counts["avg@k max"] = counts["bucket"].map(rng["max"])
    return TableSpec(name, title, caption, frame=_format_frame(counts))


def _table_profile(t: dict[str, pd.DataFrame | None]) -> TableSpec:
    name, title = "profile_summary", "Difficulty profile"
    caption = "The profiled problem pool by source (science §2): avg@k, length in tokens and truncation rate."
    prof = t["profile"]
    if prof is None:
        return TableSpec(name, title, caption, missing=_missing_stage("profile", "difficulty profile"))
    _require(prof, "profile", ["problem_id", "avg_at_k"])
    df = prof.copy()
    df["source"] = df["source"].astype(str) if "source" in df else "all"
    df["avg_at_k"] = _num(df["avg_at_k"])
    rows = []
    for source, g in [("all", df), *(df.groupby("source") if df["source"].nunique() > 1 else [])]:
        rows.append(
            {
                "source": source,
                "problems": len(g),
                "k": _fmt(_num(g["k"]).max()) if "k" in g else "—",
                "mean avg@k": g["avg_at_k"].mean(),
                "avg@k = 0": int((g["avg_at_k"] == 0).sum()),
                "avg@k = 1": int((g["avg_at_k"] == 1).sum()),
                "mean length [tokens]": _num(g["mean_len"]).mean() if "mean_len" in g else math.nan,
                "truncation rate": _num(g["trunc_rate"]).mean() if "trunc_rate" in g else math.nan,
            }
        )
    return TableSpec(name, title, caption, frame=_format_frame(pd.DataFrame(rows)))


def _table_k_sat_summary(t: dict[str, pd.DataFrame | None]) -> TableSpec:
    name, title = "k_sat_summary", "Split-half K_sat, unfiltered and IQR-filtered, beside its null"
    caption = (
        "Split-half K_sat over all measured prompts (science §6.3) with the null |R| + 1 beside it and the ratio "
        "K_sat / (|R| + 1); a ratio near 1 means the estimator saw nothing beyond exchangeable rollouts."
    )
    np_ = t["noise_prompts"]
    if np_ is None:
        return TableSpec(name, title, caption, missing=_missing_stage("noise_prompts", "noise measurements"))
    _require(np_, "noise_prompts", ["n", "pass_rate", "k_sat"])
    df = _usable_k_sat(np_)
    if df.empty:
        return TableSpec(name, title, caption, missing="The `noise_prompts` table has no prompt with a defined K_sat.")
    nulls = _k_sat_null_by_n(df)
    rows = []
    for n_value, g in df.groupby("n"):
        stats = noise.summary_stats(g["k_sat"].to_numpy())
        null = nulls[int(n_value)]
        n_inf = int(np.isinf(g["k_sat"]).sum())
        for stat in ("count", "mean", "median", "std", "max"):
            unf, fil = stats[stat], stats[f"{stat}_filtered"]
            ratio = stat in ("mean", "median", "max")
            rows.append(
                {
                    "n": int(n_value),
                    "statistic": stat + (f" ({n_inf} infinite)" if stat == "count" and n_inf else ""),
                    "unfiltered": unf,
                    "IQR-filtered": fil,
                    "null |R|+1": null if ratio else math.nan,
                    "unfiltered / null": unf / null if ratio else math.nan,
                    "filtered / null": fil / null if ratio else math.nan,
                }
            )
    return TableSpec(name, title, caption, frame=_format_frame(pd.DataFrame(rows)))


def _tables_quintiles(t: dict[str, pd.DataFrame | None]) -> list[TableSpec]:
    specs = []
    labels = {
        "unfiltered": ("k_sat_quintiles", "K_sat by pass-rate quintile (unfiltered)"),
        "iqr_filtered": ("k_sat_quintiles_filtered", "K_sat by pass-rate quintile (IQR-filtered)"),
    }
    caption = (
        "Split-half K_sat by pass-rate quintile (science §6.3): count, mean, median and std, with the null |R| + 1 "
        "and median / null beside them."
    )
    np_ = t["noise_prompts"]
    frames: dict[str, pd.DataFrame] = {}
    missing = None
    if np_ is None:
        missing = _missing_stage("noise_prompts", "noise measurements")
    else:
        _require(np_, "noise_prompts", ["n", "pass_rate", "k_sat"])
        if _usable_k_sat(np_).empty:
            missing = "The `noise_prompts` table has no prompt with a defined K_sat."
        else:
            frames = quintile_tables(np_)
    for key, (name, title) in labels.items():
        if missing is not None:
            specs.append(TableSpec(name, title, caption, missing=missing))
        else:
            specs.append(TableSpec(name, title, caption, frame=_format_frame(frames[key])))
    return specs


def _table_noise_steps(t: dict[str, pd.DataFrame | None]) -> TableSpec:
    name, title = "noise_steps", "Step-level gradient noise"
    caption = "Per measurement step (science §6.2, §6.3): noise scales in rollouts, rho_icc, K_crit and CRS."
    ns = t["noise_steps"]
    if ns is None:
        return TableSpec(name, title, caption, missing=_missing_stage("noise_steps", "noise measurements"))
    cols = [c for c in ("step", "n", "b_simple", "b_naive", "prompt_noise", "rollout_noise", "rho_icc", "k_sat_icc",
                        "k_crit", "crs") if c in ns.columns]
    return TableSpec(name, title, caption, frame=_format_frame(ns[cols].sort_values(cols[:2])))


def _tables_fits(t: dict[str, pd.DataFrame | None]) -> list[TableSpec]:
    caption = "Fitted parameters ± standard error (science §7), goodness of fit R², points used and fit status."
    fits = t["fits"]
    if fits is None:
        return [TableSpec("fits", "Fits", caption, missing=_missing_stage("fits", "fits"))]
    _require(fits, "fits", ["kind"])
    specs = []
    params_cols = [c for c in fits.columns if f"{c}_se" in fits.columns]
    for kind, g in fits.groupby(fits["kind"].astype(str), sort=False):
        present = [c for c in params_cols if _num(g[c]).notna().any()]
        rows = []
        for _, r in g.iterrows():
            row: dict[str, Any] = {}
            if "key" in g and g["key"].notna().any():
                row["key"] = _fmt(r["key"])
            for c in present:
                row[c] = _pm(pd.to_numeric(r[c], errors="coerce"), pd.to_numeric(r[f"{c}_se"], errors="coerce"))
            for c in ("r2", "n_points", "status"):
                if c in g:
                    row[c] = _fmt(r[c])
            rows.append(row)
        specs.append(TableSpec(f"fits_{kind}", f"Fit: {kind}", caption, frame=pd.DataFrame(rows)))
    return specs


def _table_steps_to_target(t: dict[str, pd.DataFrame | None]) -> TableSpec:
    name, title = "steps_to_target", "Steps to target"
    caption = (
        "First step S at which validation reward reached the target, and E = B·S rollouts trained on, per batch "
        "size B (science §7); the S(B) fits are under Fits."
    )
    st = t["steps_to_target"]
    if st is None:
        return TableSpec(name, title, caption, missing=_missing_stage("steps_to_target", "steps-to-target results"))
    cols = [c for c in ("axis", "target", "n", "b_problem", "b", "steps", "e") if c in st.columns]
    order = [c for c in ("axis", "b") if c in cols]
    return TableSpec(name, title, caption, frame=_format_frame(st[cols].sort_values(order)))


def _table_crs(t: dict[str, pd.DataFrame | None]) -> TableSpec:
    name, title = "crs_prediction", "CRS prediction check"
    caption = (
        "Best n predicted by the measured CRS beside the observed best n under each fixed total batch B (science §7)."
    )
    cp = t["crs_prediction"]
    if cp is None:
        return TableSpec(name, title, caption, missing=_missing_stage("crs_prediction", "CRS prediction check"))
    wanted = ("b", "crs", "predicted_n", "observed_best_n", "observed_best_reward", "agree")
    cols = [c for c in wanted if c in cp.columns]
    return TableSpec(name, title, caption, frame=_format_frame(cp[cols]))


def _table_transitions(t: dict[str, pd.DataFrame | None]) -> TableSpec:
    name, title = "epoch_transitions", "Epochs at frontier transitions"
    caption = (
        "Where the frontier's argmax changes from one key to the next, the epochs the new best run had completed "
        "(science §7)."
    )
    et = t["epoch_transitions"]
    if et is None:
        return TableSpec(name, title, caption, missing=_missing_stage("epoch_transitions", "frontier transitions"))
    return TableSpec(name, title, caption, frame=_format_frame(et))


def _table_runs(t: dict[str, pd.DataFrame | None]) -> TableSpec:
    name, title = "runs", "Runs"
    caption = (
        "Every sweep run with its design, the compute it used, and its final and peak validation avg@k "
        "(science §1, §5)."
    )
    runs = t["runs"]
    if runs is None:
        return TableSpec(name, title, caption, missing=_missing_stage("runs", "sweep runs"))
    _require(runs, "runs", ["run_id"])
    cols = [c for c in ("run_id", "bucket", "n", "b_problem", "m", "rule", "seed", "c_max", "status", "steps", "c")
            if c in runs.columns]
    df = runs[cols].copy()
    df["run_id"] = df["run_id"].astype(str)
    ev = t["evals"]
    if ev is not None and {"run_id", "c", "avg_at_k"} <= set(ev.columns):
        e = ev[["run_id", "c", "avg_at_k"]].copy()
        e["run_id"] = e["run_id"].astype(str)
        e["c"], e["avg_at_k"] = _num(e["c"]), _num(e["avg_at_k"])
        e = e.dropna().sort_values(["run_id", "c"])
        last = e.groupby("run_id").tail(1).set_index("run_id")
        best = e.loc[e.groupby("run_id")["avg_at_k"].idxmax()].set_index("run_id")
        df["final avg@k"] = df["run_id"].map(last["avg_at_k"])
        df["peak avg@k"] = df["run_id"].map(best["avg_at_k"])
        df["C at peak [rollouts]"] = df["run_id"].map(best["c"])
    st = t["steps"]
    if st is not None and "run_id" in st.columns:
        s = st.copy()
        s["run_id"] = s["run_id"].astype(str)
        if "c_tokens" in s:
            df["tokens generated"] = df["run_id"].map(s.groupby("run_id")["c_tokens"].max())
        timing = [c for c in ("t_generate", "t_score", "t_train") if c in s]
        if timing:
            total = s[timing].apply(pd.to_numeric, errors="coerce").sum(axis=1).groupby(s["run_id"]).sum()
            df["time [s]"] = df["run_id"].map(total)
    return TableSpec(name, title, caption, frame=_format_frame(df))


def _table_stages(t: dict[str, pd.DataFrame | None]) -> TableSpec:
    rows = [
        {"table": name, "stage": TABLE_STAGES[name], "rows": "missing" if df is None else str(len(df))}
        for name, df in t.items()
    ]
    return TableSpec(
        "stages",
        "Study tables",
        "Which study tables the report found, and the stage that writes each.",
        frame=pd.DataFrame(rows),
    )


def summary_tables(tables: Mapping[str, pd.DataFrame | None]) -> list[TableSpec]:
    """The report's tables, formatted as strings, in order (science §2, §6.3, §7).

    Study tables found; bucket counts; difficulty profile; split-half K_sat
    summary (unfiltered and IQR-filtered, with the null |R| + 1 and the
    ratio beside it); K_sat by pass-rate quintile, unfiltered and filtered;
    step-level noise; one table per fit kind with parameters ± SE, R²,
    points and status; steps to target; epochs at frontier transitions; CRS
    prediction check; runs. A missing table gives a TableSpec saying which
    stage to run.
    """
    t = _check_tables(tables)
    return [
        _table_stages(t),
        _table_bucket_counts(t),
        _table_profile(t),
        _table_k_sat_summary(t),
        *_tables_quintiles(t),
        _table_noise_steps(t),
        *_tables_fits(t),
        _table_steps_to_target(t),
        _table_transitions(t),
        _table_crs(t),
        _table_runs(t),
    ]


# ---------------------------------------------------------------------------
# writing


def _atomic_write(path: Path, data: bytes) -> None:
    """Write to a temporary file beside ``path``, then rename over it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, 0o644)  # mkstemp makes it 0600; a report is for reading
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _md_cell(value: str) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def _md_table(df: pd.DataFrame) -> str:
    header = "| " + " | ".join(_md_cell(c) for c in df.columns) + " |"
    sep = "|" + "|".join(" --- " for _ in df.columns) + "|"
    body = ["| " + " | ".join(_md_cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join([header, sep, *body])


def _summary_markdown(charts: list[ChartSpec], tables: list[TableSpec]) -> str:
    out = ["# rollscale study report", ""]
    missing = [s for s in tables if s.missing] + [c for c in charts if c.missing]
    if missing:
        out += ["Parts of the study are not there yet; each section below says which stage to run.", ""]
    for spec in tables:
        out += [f"## {spec.title}", "", spec.caption, ""]
        if spec.frame is not None:
            out += [_md_table(spec.frame), ""]
        else:
            out += [f"> **Missing:** {spec.missing}", ""]
    out += ["## Charts", ""]
    for i, c in enumerate(charts, 1):
        if c.chart is not None:
            out.append(f"{i}. [{c.title}](charts/{c.name}.png): {c.caption}")
        else:
            out.append(f"{i}. {c.title}: **missing**. {c.missing}")
    return "\n".join(out) + "\n"


_CSS = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 0 auto; max-width: 1240px;
       padding: 1.5em 2em 4em; color: #222; line-height: 1.45; }
h1 { margin-bottom: 0.2em; } h2 { margin-top: 2em; border-bottom: 1px solid #ddd; padding-bottom: 0.2em; }
nav ol { columns: 2; }
figure { margin: 1.5em 0 2.5em; } figcaption { color: #444; max-width: 60em; margin-top: 0.5em; }
.chart { overflow-x: auto; }
.missing { border: 1px solid #e0b252; background: #fff8e6; padding: 0.8em 1em; border-radius: 4px; }
.error { border: 1px solid #d62728; background: #fdecec; padding: 0.8em 1em; }
table.data { border-collapse: collapse; font-size: 0.9em; margin: 0.6em 0 1.2em; }
table.data th, table.data td { border: 1px solid #ddd; padding: 0.25em 0.6em; text-align: right; }
table.data th { background: #f3f3f3; } table.data td:first-child, table.data th:first-child { text-align: left; }
.caption { color: #444; }
code { background: #f3f3f3; padding: 0 0.25em; border-radius: 3px; }
"""


def _vega_embed_bundle() -> str:
    """vega + vega-lite + vega-embed as one script, from vl-convert (what altair's inline=True uses)."""
    import vl_convert

    # altair's schema "v6.4.1" -> vl-convert's "v6_4", as altair's own inline template asks for it
    vl_version = "_".join(alt.SCHEMA_VERSION.split(".")[:2])
    js = vl_convert.javascript_bundle(vl_version=vl_version)
    if "</script" in js.lower():  # would end the inline <script> early
        raise RuntimeError("the vl-convert JavaScript bundle contains '</script'; cannot inline it")
    return js


def _script_json(obj: Any) -> str:
    # "</" inside a <script> would close it; "<\/" is the same string to JSON
    return json.dumps(obj, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")


def _html_text(text: str) -> str:
    """Escape for HTML, with `code` spans as <code>."""
    return re.sub(r"`([^`<>]+)`", r"<code>\1</code>", html.escape(text))


def _html_page(charts: list[ChartSpec], tables: list[TableSpec]) -> str:
    esc = html.escape
    specs = {c.name: c.chart.to_dict() for c in charts if c.chart is not None}
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        "<title>rollscale study report</title>",
        f"<style>{_CSS}</style>",
        f'<script type="text/javascript">\n{_vega_embed_bundle()}\n</script>',
        "</head><body>",
        "<h1>rollscale study report</h1>",
        '<p class="caption">How to spend rollouts in RLVR: difficulty, gradient noise, the compute frontier and '
        "critical batch sizes. Every chart and table below is in this one file; it needs no network.</p>",
    ]
    n_missing = sum(1 for c in charts if c.missing) + sum(1 for s in tables if s.missing)
    if n_missing:
        parts.append(
            f'<p class="missing">{n_missing} parts of the study are not there yet; '
            "each one says which stage to run.</p>"
        )
    parts.append('<nav><h2>Contents</h2><ol>')
    for i, c in enumerate(charts, 1):
        suffix = "" if c.chart is not None else " (missing)"
        parts.append(f'<li><a href="#fig-{esc(c.name)}">Figure {i}. {esc(c.title)}</a>{suffix}</li>')
    parts.append('<li><a href="#tables">Tables</a></li></ol></nav>')
    parts.append('<section id="figures"><h2>Figures</h2>')
    for i, c in enumerate(charts, 1):
        parts.append(f'<figure id="fig-{esc(c.name)}">')
        if c.chart is not None:
            parts.append(f'<div class="chart" id="chart-{esc(c.name)}" data-chart="{esc(c.name)}"></div>')
        else:
            parts.append(f"<h3>{esc(c.title)}</h3>")
            parts.append(f'<div class="missing" data-missing="{esc(c.name)}"><strong>Missing:</strong> '
                         f"{_html_text(c.missing or '')}</div>")
        parts.append(f"<figcaption><strong>Figure {i}.</strong> {_html_text(c.caption)}</figcaption></figure>")
    parts.append("</section>")
    parts.append('<section id="tables"><h2>Tables</h2>')
    for s in tables:
        parts.append(f'<h3 id="table-{esc(s.name)}">{esc(s.title)}</h3><p class="caption">{_html_text(s.caption)}</p>')
        if s.frame is not None:
            parts.append(s.frame.to_html(index=False, escape=True, border=0, classes="data", na_rep="—"))
        else:
            parts.append(f'<div class="missing"><strong>Missing:</strong> {_html_text(s.missing or "")}</div>')
    parts.append("</section>")
    parts.append(
        '<script type="text/javascript">\n'
        f"const specs = {_script_json(specs)};\n"
        "const embedOpt = {actions: false, renderer: 'svg'};\n"
        "for (const [name, spec] of Object.entries(specs)) {\n"
        "  const el = document.getElementById('chart-' + name);\n"
        "  vegaEmbed(el, spec, embedOpt).catch(function (err) {\n"
        "    el.classList.add('error');\n"
        "    el.textContent = 'This chart could not be drawn: ' + err;\n"
        "    console.error(err);\n"
        "  });\n"
        "}\n"
        "</script>"
    )
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _png_bytes(chart: alt.TopLevelMixin) -> bytes:
    buf = io.BytesIO()
    chart.save(buf, format="png", scale_factor=2)  # rendered by vl-convert
    return buf.getvalue()


def write_report(
    tables: Mapping[str, pd.DataFrame | None],
    out_dir: str | os.PathLike[str],
    params: Mapping[str, Any] | None = None,
) -> ReportPaths:
    """Write the study report into ``out_dir`` (science §2, §5, §6, §7).

    * ``index.html``: one self-contained page (vega, vega-lite and vega-embed
      inlined from vl-convert's bundle; no CDN), all charts with titles and
      captions, a "missing" box for each chart that cannot be drawn yet, and
      every table of :func:`summary_tables`.
    * ``charts/<name>.png`` for each drawn chart (vl-convert, 2× scale); the
      PNG of a chart that is now missing is removed so no stale figure stays.
    * ``summary.md``: the same tables in Markdown, missing sections saying
      which stage to run.

    Every file is written to a temporary file and renamed into place.
    """
    charts = build_charts(tables, params)
    table_specs = summary_tables(tables)
    out = Path(out_dir)
    chart_dir = out / "charts"
    chart_dir.mkdir(parents=True, exist_ok=True)
    pngs: dict[str, Path] = {}
    for c in charts:
        path = chart_dir / f"{c.name}.png"
        if c.chart is not None:
            _atomic_write(path, _png_bytes(c.chart))
            pngs[c.name] = path
        elif path.exists():
            path.unlink()
    html_path, md_path = out / "index.html", out / "summary.md"
    _atomic_write(html_path, _html_page(charts, table_specs).encode("utf-8"))
    _atomic_write(md_path, _summary_markdown(charts, table_specs).encode("utf-8"))
    return ReportPaths(
        out_dir=out,
        html=html_path,
        summary=md_path,
        pngs=pngs,
        missing={c.name: c.missing for c in charts if c.missing is not None},
    )
