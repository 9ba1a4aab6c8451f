"""Charts of the difficulty profile and the gradient noise (science §2, §6.2, §6.3, §6.4)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import altair as alt
import numpy as np
import pandas as pd

from rollscale.core.fit.targets import measured_crs
from rollscale.core.noise.correlation import k_sat_null
from rollscale.core.noise.summary import quintile_table
from rollscale.report.base import (
    BUCKET_COLOURS,
    CHART_HEIGHT,
    CHART_WIDTH,
    ChartSpec,
    bucket_bounds,
    finish_chart,
    fmt_value,
    k_sat_cap,
    log_axis,
    log_scale,
    absent,
    as_numeric,
    inline_records,
    require_columns,
)
from rollscale.report.noise_along import PAST, key_rows, resolved_share, window_mid


def k_sat_null_by_n(noise_prompts: pd.DataFrame) -> dict[int, float]:
    out = {}
    for n_value, group in noise_prompts.groupby("n"):
        n_int = int(n_value)
        nulls = as_numeric(group["k_sat_null"]).dropna() if "k_sat_null" in group else pd.Series(dtype=float)
        out[n_int] = float(nulls.iloc[0]) if len(nulls) else k_sat_null(n_int)
    return out


def usable_k_sat(noise_prompts: pd.DataFrame) -> pd.DataFrame:
    df = noise_prompts.copy()
    df["k_sat"] = as_numeric(df["k_sat"])
    df["pass_rate"] = as_numeric(df["pass_rate"])
    # NaN K_sat: rho undefined (all rollouts of the group equal); nothing to report
    return df[df["k_sat"].notna() & df["pass_rate"].notna()]


def quintile_tables(noise_prompts: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Split-half K_sat by pass-rate quintile, unfiltered and IQR-filtered (science §6.3).

    Uses :func:`rollscale.core.noise.summary.quintile_table` per group size n (prompts of
    all measurement steps pooled), with the null value ``k_sat_null =
    |R| + 1`` and ``median_ratio = median / k_sat_null`` beside K_sat as §6.3
    asks. Rows whose K_sat is NaN (rho undefined) are left out. Keys:
    ``"unfiltered"`` and ``"iqr_filtered"``; columns ``n,
    pass_rate_quintile, count, mean, median, std, [n_outliers], k_sat_null,
    median_ratio``.
    """
    if not isinstance(noise_prompts, pd.DataFrame):
        raise ValueError(f"noise_prompts: expected a pandas DataFrame, got {type(noise_prompts).__name__}")
    require_columns(noise_prompts, "noise_prompts", ["n", "pass_rate", "k_sat"])
    df = usable_k_sat(noise_prompts)
    if df.empty:
        raise ValueError("noise_prompts: expected at least one row with a K_sat and a pass rate")
    nulls = k_sat_null_by_n(df)
    out: dict[str, pd.DataFrame] = {}
    for key, drop in (("unfiltered", False), ("iqr_filtered", True)):
        parts = []
        for n_value, group in df.groupby("n"):
            table = quintile_table(group["pass_rate"].to_numpy(), group["k_sat"].to_numpy(), drop_outliers=drop)
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


def chart_difficulty(t: dict[str, pd.DataFrame | None], params: Mapping[str, Any]) -> ChartSpec:
    name, title = "difficulty", "Difficulty profile: avg@k per problem with the bucket bands"
    bounds = bucket_bounds(params)
    caption = (
        "Histogram of each problem's avg@k (mean 0/1 reward over k samples, science §2) with the "
        "bucket bounds from params shaded behind it."
    )
    prof = t["profile"]
    if prof is None:
        return ChartSpec(name, title, caption, missing=absent(t, "profile", "difficulty profile"))
    require_columns(prof, "profile", ["avg_at_k"])
    vals = as_numeric(prof["avg_at_k"]).dropna().to_numpy()
    if vals.size == 0:
        return ChartSpec(name, title, caption, missing="The `profile` table has no avg@k values to plot.")
    ks = as_numeric(prof["k"]).dropna().unique() if "k" in prof else np.array([])
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
        alt.Chart(inline_records(bands))
        .mark_rect(opacity=0.18)
        .encode(x="lo:Q", x2="hi:Q", color=colour, tooltip=["bucket:N", "range:N"])
    )
    bar_layer = (
        alt.Chart(inline_records(bars))
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
    return ChartSpec(name, title, caption, chart=finish_chart(chart, title))


def chart_k_sat(t: dict[str, pd.DataFrame | None], params: Mapping[str, Any]) -> ChartSpec:
    name, title = "k_sat", "Split-half K_sat per prompt against pass rate, with the null"
    np_ = t["noise_prompts"]
    base_caption = (
        "Each point is one measured prompt group's split-half K_sat = 1/rho (science §6.3) against its pass rate; "
        "the dashed line is the null |R| + 1 that the estimator returns for exchangeable rollouts whatever the data"
    )
    if np_ is None:
        return ChartSpec(name, title, base_caption + ".", missing=absent(t, "noise_prompts", "noise measurements"))
    require_columns(np_, "noise_prompts", ["n", "pass_rate", "k_sat"])
    df = usable_k_sat(np_)
    if df.empty:
        return ChartSpec(
            name, title, base_caption + ".", missing="The `noise_prompts` table has no prompt with a defined K_sat."
        )
    nulls = k_sat_null_by_n(df)
    cap = k_sat_cap(params, float(df["n"].max()))
    clipped = (df["k_sat"] > cap) | np.isinf(df["k_sat"])
    n_inf = int(np.isinf(df["k_sat"]).sum())
    clipped_label = f"clipped at cap {cap:g} (K_sat > cap or ∞)"
    pts = pd.DataFrame(
        {
            "pass_rate": df["pass_rate"].to_numpy(),
            "k_sat_plot": np.where(clipped, cap, df["k_sat"].to_numpy()),
            "k_sat": [fmt_value(v) for v in df["k_sat"]],
            "clipped": clipped.to_numpy(),
            "status": np.where(clipped, clipped_label, "K_sat (finite)"),
            "problem_id": df["problem_id"].astype(str).to_numpy() if "problem_id" in df else "",
            "step": as_numeric(df["step"]).to_numpy() if "step" in df else np.nan,
            "n": as_numeric(df["n"]).to_numpy(),
        }
    )
    status_domain = ["K_sat (finite)", clipped_label]
    y_min = max(min(float(pts["k_sat_plot"].min()), min(nulls.values())) / 1.3, 0.5)
    y_scale = alt.Scale(type="log", domain=[y_min, cap * 1.3])
    points = (
        alt.Chart(inline_records(pts))
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
        alt.Chart(inline_records(lines))
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
    return ChartSpec(name, title, caption, chart=finish_chart(chart, title))


# line samples in the legend: the default symbol (the line's point) hides the dash
_DASH_LEGEND = alt.Legend(
    symbolType="stroke", symbolStrokeWidth=2, symbolSize=300, symbolStrokeColor="#333", symbolFillColor="transparent"
)

_NOISE_STEP_QUANTITIES = {
    "b_simple": "B_simple (McCandlish)",
    "k_crit": "K_crit",
    "k_sat_icc": "K_sat_icc = 1/rho_icc",
}


def chart_noise_steps(t: dict[str, pd.DataFrame | None], params: Mapping[str, Any]) -> ChartSpec:
    name, title = "noise_steps", "Gradient noise over training steps: B_simple, K_crit and rho_icc"
    caption = (
        "Step-level noise (science §6.2, §6.3): B_simple, K_crit and K_sat_icc in rollouts on a log scale (top) and "
        "the intraclass rho_icc (bottom) at each measurement step; one step's ratio is noisy and infinite where "
        "its signal is not above 0: the table 'Gradient noise pooled over steps' gives them pooled, with intervals"
    )
    ns = t["noise_steps"]
    if ns is None:
        return ChartSpec(name, title, caption + ".", missing=absent(t, "noise_steps", "noise measurements"))
    require_columns(ns, "noise_steps", ["step", "n", "rho_icc", "k_crit", "b_simple"])
    quantities = [q for q in _NOISE_STEP_QUANTITIES if q in ns.columns]
    long = ns[["step", "n", *quantities]].melt(id_vars=["step", "n"], var_name="quantity", value_name="value")
    long["value"] = as_numeric(long["value"])
    n_inf = int(np.isinf(long["value"]).sum())
    long = long[np.isfinite(long["value"]) & (long["value"] > 0)].copy()
    long["quantity"] = long["quantity"].map(_NOISE_STEP_QUANTITIES)
    rho = pd.DataFrame({"step": as_numeric(ns["step"]), "n": as_numeric(ns["n"]), "rho_icc": as_numeric(ns["rho_icc"])}).dropna()
    if long.empty and rho.empty:
        return ChartSpec(name, title, caption + ".", missing="The `noise_steps` table has no finite values to plot.")
    multi_n = ns["n"].nunique() > 1
    # a step is a count: whole-number ticks only (a 3-step measurement has no step 1.1)
    step_x = alt.X("step:Q", title="training step [steps]", axis=alt.Axis(format="d", tickMinStep=1))
    top_enc: dict[str, Any] = {
        "x": step_x,
        "y": alt.Y("value:Q", title="noise scale [rollouts]", scale=log_scale(), axis=log_axis()),
        "color": alt.Color("quantity:N", title="quantity",
                           scale=alt.Scale(domain=list(_NOISE_STEP_QUANTITIES.values()),
                                           range=["#1f77b4", "#d62728", "#ff7f0e"])),
        "tooltip": ["step:Q", "n:Q", "quantity:N", alt.Tooltip("value:Q", format=".4g")],
    }
    if multi_n:
        top_enc["strokeDash"] = alt.StrokeDash("n:N", title="n (rollouts per prompt)", legend=_DASH_LEGEND)
        top_enc["detail"] = "n:N"
    top = alt.Chart(inline_records(long)).mark_line(point=True).encode(**top_enc)
    bottom_enc: dict[str, Any] = {
        "x": step_x,
        "y": alt.Y("rho_icc:Q", title="rho_icc [dimensionless]"),
        "tooltip": ["step:Q", "n:Q", alt.Tooltip("rho_icc:Q", format=".4f")],
    }
    if multi_n:
        bottom_enc["strokeDash"] = alt.StrokeDash("n:N", title="n (rollouts per prompt)", legend=_DASH_LEGEND)
    bottom = (
        alt.Chart(inline_records(rho))
        .mark_line(point=alt.OverlayMarkDef(color="#2ca02c"), color="#2ca02c")
        .encode(**bottom_enc)
    )
    chart = alt.vconcat(
        top.properties(width=CHART_WIDTH + 120, height=CHART_HEIGHT - 40),
        bottom.properties(width=CHART_WIDTH + 120, height=CHART_HEIGHT - 120),
    )
    if n_inf:
        caption += f"; infinite values (signal below the noise floor; {n_inf} here) leave gaps in the lines"
    return ChartSpec(name, title, caption + ".", chart=finish_chart(chart, title))


def chart_noise_along(t: dict[str, pd.DataFrame | None], params: Mapping[str, Any]) -> ChartSpec:
    name, title = "noise_along", "Gradient noise along training: |G|², B_simple and the CRS against C, every key"
    caption = (
        "From every training step's two random halves of prompts (science §6.4), pooled per doubling of C (a key's "
        "seeds together), with 95 % block-bootstrap intervals over steps: the signal |G|² (top; a window whose "
        "interval reaches 0 has not resolved it), B_simple in rollouts (middle) and the CRS = min(K_sat, K_crit) in "
        "rollouts per prompt (bottom; rho_icc from the measure stage). The measure stage's pre-sweep CRS, where "
        "finite, is the dashed line"
    )
    off = _runs_without_halves(t.get("steps"))
    na = t.get("noise_along")
    if na is None:
        why = absent(t, "noise_along", "noise along training")
        # type(why): a stage that has not run stays "missing" (StageNotRun), not "empty", with the note added
        return ChartSpec(name, title, caption + ".", missing=type(why)(why + (f" Off in {off} runs." if off else "")))
    require_columns(na, "noise_along", ["run_id", "n", "b_problem", "c_lo", "c_hi", "g2", "g2_lo", "g2_hi",
                                        "b_simple_rollouts", "crs", "crs_lo", "crs_hi", "steps"])
    rows = key_rows(na)
    rows = rows[rows["steps"] >= 1].copy()
    rows["c_mid"] = window_mid(rows)
    several_b = rows["b_problem"].nunique() > 1
    rows["key"] = [f"n = {int(n)}" + (f", B_problem = {int(b)}" if several_b else "")
                   for n, b in zip(rows["n"], rows["b_problem"])]
    keys = list(dict.fromkeys(rows.sort_values(["b_problem", "n"])["key"]))
    colour = alt.Color("key:N", title="key", sort=keys, scale=alt.Scale(scheme="viridis"))
    x = alt.X("c_mid:Q", title="C, the window's middle [rollouts]", scale=log_scale(), axis=log_axis())

    def panel(value: str, lo: str, hi: str, y_title: str, log: bool) -> tuple[alt.Chart, int]:
        d = rows[["key", "c_mid", "c_lo", "c_hi", "steps", value, lo, hi]].rename(
            columns={value: "v", lo: "lo", hi: "hi"})
        finite = np.isfinite(d["v"]) & ((d["v"] > 0) if log else True)
        dropped = int((~finite).sum())
        d = d[finite].copy()
        if d.empty:
            return alt.Chart(inline_records(d)).mark_point(), dropped
        cap = float(d["v"].abs().max()) * 10 if log else float(np.nanmax(np.abs(d[["v", "hi"]].replace(np.inf, np.nan))
                                                                      .to_numpy(float))) * 1.2
        d["hi"] = np.where(np.isfinite(d["hi"]), d["hi"], cap)  # an unbounded interval drawn to the cap
        d["lo"] = np.where(np.isfinite(d["lo"]), d["lo"], np.nan)
        if log:
            d["lo"] = np.maximum(d["lo"], float(d["v"].min()) / 10)
        y = alt.Y("v:Q", title=y_title, scale=log_scale() if log else alt.Scale(zero=True),
                  axis=log_axis() if log else alt.Axis())
        tip = ["key:N", alt.Tooltip("c_lo:Q", format=",.0f"), alt.Tooltip("c_hi:Q", format=",.0f"), "steps:Q",
               alt.Tooltip("v:Q", format=".4g", title=y_title), alt.Tooltip("lo:Q", format=".4g"),
               alt.Tooltip("hi:Q", format=".4g")]
        line = alt.Chart(inline_records(d)).mark_line(point=True).encode(x=x, y=y, color=colour, tooltip=tip)
        # a window without an interval (one step, or no rho interval) gets no rule: Vega-Lite would draw an empty
        # layer with infinite extents and warn in the console
        bounded = d[np.isfinite(d["lo"]) & np.isfinite(d["hi"])]
        if bounded.empty:
            return line, dropped
        rule = alt.Chart(inline_records(bounded)).mark_rule().encode(x=x, y="lo:Q", y2="hi:Q", color=colour)
        return alt.layer(line, rule), dropped

    top, _ = panel("g2", "g2_lo", "g2_hi", "|G|² [squared gradient norm]", log=False)
    zero = alt.Chart(inline_records(pd.DataFrame({"y": [0.0]}))).mark_rule(color="#333", strokeDash=[4, 3]).encode(y="y:Q")
    middle, inf_b = panel("b_simple_rollouts", "b_simple_rollouts_lo", "b_simple_rollouts_hi",
                          "B_simple [rollouts]", log=True)
    bottom, inf_crs = panel("crs", "crs_lo", "crs_hi", "CRS [rollouts per prompt]", log=True)
    crs_measured = _measured_crs(t.get("noise_steps"))
    if math.isfinite(crs_measured):
        line = pd.DataFrame({"y": [crs_measured], "line": [f"measure stage (pre-sweep): CRS {crs_measured:.3g}"]})
        bottom = alt.layer(bottom, alt.Chart(inline_records(line)).mark_rule(strokeDash=[6, 3], color="#333")
                           .encode(y="y:Q", tooltip=["line:N"]))
    size = dict(width=CHART_WIDTH + 120, height=CHART_HEIGHT - 80)
    chart = alt.vconcat(alt.layer(zero, top).properties(**size), middle.properties(**size), bottom.properties(**size))
    past, resolved = 0, 0
    for _, g in rows.groupby("key"):
        r, w = resolved_share(g)
        resolved, past = resolved + r, past + w
    caption += (f"; |G|²'s lower bound is above 0 in {resolved} of {past} windows past {PAST:,} rollouts"
                if past else "")
    if off:
        caption += f"; the halves were off (sweep.noise_halves: false) in {off} runs, which have no rows"
    if inf_b or inf_crs:
        caption += (f"; infinite or undefined values (signal not above 0, or no rho) leave gaps: {inf_b} B_simple, "
                    f"{inf_crs} CRS")
    return ChartSpec(name, title, caption + ".", chart=finish_chart(chart, title))


def _measured_crs(noise_steps: pd.DataFrame | None) -> float:
    """The measure stage's CRS (median over its steps at its largest n), the pre-sweep estimate; NaN if none."""
    if noise_steps is None or not {"n", "crs"} <= set(noise_steps.columns):
        return math.nan
    return measured_crs(noise_steps)[0]


def _runs_without_halves(steps: pd.DataFrame | None) -> int:
    """Runs whose steps never split their prompts into halves (``sweep.noise_halves: false``, or a study from
    before it): the report says the noise along training was off for them."""
    if steps is None or "run_id" not in steps.columns:
        return 0
    if "half_dot" not in steps.columns:
        return int(steps["run_id"].nunique())
    split = np.isfinite(as_numeric(steps["half_dot"]).to_numpy(float))
    return int(steps["run_id"].nunique() - steps.loc[split, "run_id"].nunique())
