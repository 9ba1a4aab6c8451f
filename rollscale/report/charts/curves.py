"""Charts of the runs' curves and the compute-optimal frontier (science §5, §7)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import altair as alt
import numpy as np
import pandas as pd

from rollscale.core.fit.curves import sigmoid_model
from rollscale.report.base import (
    MIN_INTERVAL_SEEDS,
    CHART_HEIGHT,
    CHART_WIDTH,
    ChartSpec,
    N_SCHEME,
    finish_chart,
    log2_ticks,
    log_axis,
    log_scale,
    absent,
    as_numeric,
    inline_records,
    require_columns,
)


def evals_with_runs(t: dict[str, pd.DataFrame | None], columns: Sequence[str]) -> tuple[pd.DataFrame, bool]:
    """Evals joined with the runs' n, B_problem and bucket; False when runs is missing."""
    ev = t["evals"]
    assert ev is not None
    require_columns(ev, "evals", ["run_id", "c", *columns])
    ev = ev.copy()
    ev["c"] = as_numeric(ev["c"])
    for col in columns:
        ev[col] = as_numeric(ev[col])
    runs = t["runs"]
    has_runs = runs is not None
    if has_runs:
        require_columns(runs, "runs", ["run_id", "n"])
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


def run_colour(has_runs: bool) -> alt.Color:
    if has_runs:
        return alt.Color("n:O", title="n (rollouts per prompt)", scale=N_SCHEME)
    return alt.Color("run_id:N", title="run (runs table missing)", scale=alt.Scale(scheme="tableau10"))


def chart_reward_vs_compute(t: dict[str, pd.DataFrame | None], params: Mapping[str, Any]) -> ChartSpec:
    name, title = "reward_vs_compute", "Validation reward against compute, every run"
    caption = (
        "Validation avg@k (science §5) with a ±1 SE band against cumulative compute C in rollouts generated "
        "(science §1, log scale) for every run, coloured by n"
    )
    if t["evals"] is None:
        return ChartSpec(name, title, caption + ".", missing=absent(t, "evals", "sweep results"))
    ev, has_runs = evals_with_runs(t, ["avg_at_k"])
    has_se = "avg_at_k_se" in ev.columns and as_numeric(ev["avg_at_k_se"]).notna().any()
    if has_se:
        ev["avg_at_k_se"] = as_numeric(ev["avg_at_k_se"])
        # a reward is in [0, 1]: the band is clipped there
        ev["lo"] = (ev["avg_at_k"] - ev["avg_at_k_se"]).clip(lower=0.0)
        ev["hi"] = (ev["avg_at_k"] + ev["avg_at_k_se"]).clip(upper=1.0)
    n_zero = int((ev["c"] <= 0).sum())
    ev = ev[(ev["c"] > 0) & ev["avg_at_k"].notna()]
    if ev.empty:
        return ChartSpec(name, title, caption + ".", missing="The `evals` table has no evaluation at C > 0 to plot.")
    cols = [c for c in ("run_id", "c", "avg_at_k", "lo", "hi", "n", "b_problem", "bucket", "step", "epochs")
            if c in ev.columns]
    data = ev[cols].sort_values(["run_id", "c"])
    colour = run_colour(has_runs)
    # the band fills through its own legend-less scale: on the colour scale the legend turns pale
    band_fill = alt.Fill("n:O", scale=N_SCHEME, legend=None) if has_runs else alt.Fill(
        "run_id:N", scale=alt.Scale(scheme="tableau10"), legend=None
    )
    x = alt.X("c:Q", title="compute C [rollouts generated]", scale=log_scale(), axis=log_axis())
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
    layered = alt.layer(*sized, data=inline_records(data))
    chart = _facet_buckets(layered, data)
    if n_zero:
        caption += f"; the {n_zero} evaluations at C = 0 are left off the log axis"
    if not has_se:
        caption += "; the evals table has no standard errors, so there is no band"
    if not has_runs:
        caption += "; the runs table is missing, so runs are coloured by run id instead of n"
    return ChartSpec(name, title, caption + ".", chart=finish_chart(chart, title))


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
        reward = sigmoid_model(np.array([r0, a - r0, math.log10(c_mid), beta]), np.log10(grid))
        key = float(pd.to_numeric(r["key"], errors="coerce"))
        parts.append(pd.DataFrame({"key": key, "c": grid, "reward": reward}))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=["key", "c", "reward"])


def _fit_status(fits: pd.DataFrame | None, kind: str) -> str | None:
    if fits is None or "kind" not in fits.columns or "status" not in fits.columns:
        return None
    rows = fits[fits["kind"].astype(str) == kind]
    return None if rows.empty else str(rows["status"].iloc[0])


_BAND_COLUMNS = ("frontier_reward_lo", "frontier_reward_hi", "best_key_lo", "best_key_hi", "best_key_share")


def chart_frontier(t: dict[str, pd.DataFrame | None], params: Mapping[str, Any]) -> ChartSpec:
    name, title = "frontier", "Compute-optimal frontier F(C) coloured by n*, and the fitted n*(C)"
    caption = (
        "Left: the frontier F(C) = max over n of the fitted per-n sigmoids (thin lines) with each grid point "
        "coloured by its argmax n*, with its 95 % bootstrap band over seeds (grey; only with 3 or more seeds a key, "
        "clipped to [0, 1]); right: n*(C) on a log2 axis "
        "with the range of n* over bootstrap refits (grey bars) and the fitted logistic n*(C) line (science §7)"
    )
    fr = t["frontier"]
    if fr is None:
        return ChartSpec(name, title, caption + ".", missing=absent(t, "frontier", "frontier fit"))
    require_columns(fr, "frontier", ["design", "frontier_reward", "best_key"])
    rows = []
    notes = []
    for design in [d for d in _DESIGN_LABELS if d in set(fr["design"].astype(str))]:
        part = fr[fr["design"].astype(str) == design].copy()
        xcol = "m" if design == "iso_batch" and "m" in part and as_numeric(part["m"]).notna().any() else "c"
        require_columns(part, "frontier", [xcol])
        df = pd.DataFrame(
            {
                "x": as_numeric(part[xcol]),
                "frontier_reward": as_numeric(part["frontier_reward"]),
                "key": as_numeric(part["best_key"]),
                "key_fit": as_numeric(part["n_star_fit"]) if "n_star_fit" in part else np.nan,
                **{c: as_numeric(part[c]) if c in part else np.nan for c in _BAND_COLUMNS},
            }
        )
        df = df[(df["x"] > 0) & df["frontier_reward"].notna()]
        if "n_seeds" in part:  # a bootstrap over fewer than 3 seeds a key is no interval (science §9.3): no band
            few = as_numeric(part["n_seeds"]).reindex(df.index).fillna(0) < MIN_INTERVAL_SEEDS
            df.loc[few, list(_BAND_COLUMNS)] = np.nan
        df[["frontier_reward_lo", "frontier_reward_hi"]] = df[["frontier_reward_lo", "frontier_reward_hi"]].clip(0, 1)
        if df.empty:
            notes.append(f"design {design!r} has no usable frontier points")
            continue
        star, key_title, x_title, y_title = _DESIGN_LABELS[design]
        x = alt.X("x:Q", title=x_title, scale=log_scale(), axis=log_axis())
        colour = alt.Color("key:O", title=key_title, scale=N_SCHEME)
        curves = _sigmoid_curves(t["fits"], design, float(df["x"].min()), float(df["x"].max()))
        left_layers = []
        if not curves.empty:
            left_layers.append(
                alt.Chart(inline_records(curves.rename(columns={"c": "x"})))
                .mark_line(strokeWidth=1.2, opacity=0.55)
                # own legend-less stroke scale: on the colour scale the legend would turn pale
                .encode(x=x, y="reward:Q", stroke=alt.Stroke("key:O", scale=N_SCHEME, legend=None))
            )
        band = df.dropna(subset=["frontier_reward_lo", "frontier_reward_hi"])
        if not band.empty:  # 95 % bootstrap band over seeds (science §7)
            left_layers.append(
                alt.Chart(inline_records(band)).mark_area(color="#999", opacity=0.25)
                .encode(x=x, y="frontier_reward_lo:Q", y2="frontier_reward_hi:Q")
            )
        else:
            notes.append(f"{design} design: 1 seed, no interval")
        left_layers.append(
            alt.Chart(inline_records(df))
            .mark_line(color="#999", strokeWidth=1)
            .encode(x=x, y=alt.Y("frontier_reward:Q", title="validation reward [fraction correct]"))
        )
        left_layers.append(
            alt.Chart(inline_records(df))
            .mark_circle(size=45, opacity=0.95)
            .encode(
                x=x,
                y="frontier_reward:Q",
                color=colour,
                tooltip=[alt.Tooltip("x:Q", title=x_title, format=".4g"),
                         alt.Tooltip("frontier_reward:Q", format=".3f"), alt.Tooltip("key:O", title=star),
                         alt.Tooltip("best_key_share:Q", title="share of refits", format=".0%")],
            )
        )
        left = alt.layer(*left_layers).properties(
            width=CHART_WIDTH - 140, height=CHART_HEIGHT - 20, title=f"frontier ({design} design)"
        )
        ticks = log2_ticks(list(df["key"]) + list(df["key_fit"].dropna()))
        y_key = alt.Y("key:Q", title=y_title, scale=alt.Scale(type="log", base=2), axis=alt.Axis(values=ticks))
        right_layers = []
        bars = df.dropna(subset=["best_key_lo", "best_key_hi"])
        if not bars.empty:  # the range of n* over bootstrap refits
            right_layers.append(
                alt.Chart(inline_records(bars)).mark_rule(color="#999", opacity=0.6)
                .encode(x=x, y=alt.Y("best_key_lo:Q", scale=alt.Scale(type="log", base=2)), y2="best_key_hi:Q")
            )
        right_layers += [
            alt.Chart(inline_records(df))
            .mark_circle(size=40)
            .encode(x=x, y=y_key, color=colour, tooltip=[alt.Tooltip("x:Q", format=".4g"), "key:Q"])
        ]
        fit_pts = df.dropna(subset=["key_fit"])
        fit_pts = fit_pts[fit_pts["key_fit"] > 0]
        if not fit_pts.empty:
            right_layers.append(
                alt.Chart(inline_records(fit_pts))
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
    return ChartSpec(name, title, caption + ".", chart=finish_chart(chart, title))


def chart_best_worst(t: dict[str, pd.DataFrame | None], params: Mapping[str, Any]) -> ChartSpec:
    name, title = "best_worst_at_k", "best@k and worst@k against compute, per n"
    caption = (
        "Coverage best@k and reliability worst@k (science §5) against compute C in rollouts (log scale) for every "
        "run coloured by n, with each run's peak marked by a larger point, the optimum it reached"
    )
    if t["evals"] is None:
        return ChartSpec(name, title, caption + ".", missing=absent(t, "evals", "sweep results"))
    ev, has_runs = evals_with_runs(t, ["best_at_k", "worst_at_k"])
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
    colour = run_colour(has_runs)
    x = alt.X("c:Q", title="compute C [rollouts generated]", scale=log_scale(), axis=log_axis())
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
        data=inline_records(long),
    )
    facet: dict[str, Any] = {"column": alt.Column("metric:N", title=None)}
    if long["bucket"].nunique() > 1:
        facet["row"] = alt.Row("bucket:N", title="training bucket")
    chart = layered.facet(**facet)
    if not has_runs:
        caption += "; the runs table is missing, so runs are coloured by run id instead of n"
    return ChartSpec(name, title, caption + ".", chart=finish_chart(chart, title))
