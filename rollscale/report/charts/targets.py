"""Charts of steps to target, S(B) / E(B), and the CRS prediction check (science §7)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import altair as alt
import numpy as np
import pandas as pd

from rollscale.core.fit.curves import StepsToTargetFit
from rollscale.report.base import (
    CHART_HEIGHT,
    CHART_WIDTH,
    ChartSpec,
    finish_chart,
    fmt_value,
    log2_ticks,
    log_axis,
    log_scale,
    absent,
    as_numeric,
    plus_minus,
    inline_records,
    require_columns,
)


def _steps_fit_row(fits: pd.DataFrame | None, axis: str) -> dict[str, Any] | None:
    if fits is None or "kind" not in fits.columns:
        return None
    rows = fits[fits["kind"].astype(str) == f"steps_to_target_{axis}"]
    return None if rows.empty else rows.iloc[0].to_dict()


def chart_steps_to_target(t: dict[str, pd.DataFrame | None], params: Mapping[str, Any]) -> ChartSpec:
    name, title = "steps_to_target", "Steps and rollouts to reach the target reward: S(B) and E(B)"
    caption = (
        "Steps to target S(B) and rollouts trained on E(B) = B·S(B) against the batch size B = B_problem·n "
        "(log-log), for the prompt axis (n fixed) and the rollout axis (B_problem fixed), with the fitted "
        "S(B) = S_min (1 + B_crit / B) as lines (science §7)"
    )
    st = t["steps_to_target"]
    if st is None:
        missing = absent(t, "steps_to_target", "steps-to-target results")
        return ChartSpec(name, title, caption + ".", missing=missing)
    require_columns(st, "steps_to_target", ["axis", "b", "steps"])
    obs = pd.DataFrame({"axis": st["axis"].astype(str), "b": as_numeric(st["b"]), "S": as_numeric(st["steps"])})
    for col in ("n", "b_problem", "target"):
        obs[col] = as_numeric(st[col]) if col in st else np.nan
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
        nan = math.nan
        s_fit = StepsToTargetFit(s_min=s_min, b_crit=e_min / s_min, e_min=e_min, s_min_se=nan, b_crit_se=nan,
                                 e_min_se=nan, r2=nan, n_points=0, status="ok").predict(grid)
        fit_parts.append(pd.DataFrame({"axis": axis, "b": grid, "S": s_fit, "E": grid * s_fit, "kind": "fit"}))
        b_crit = float(pd.to_numeric(row.get("b_crit"), errors="coerce"))
        b_crit_se = float(pd.to_numeric(row.get("b_crit_se"), errors="coerce"))
        notes.append(f"{axis} axis B_crit = {plus_minus(b_crit, b_crit_se)} rollouts")
    data = pd.concat([obs, *fit_parts], ignore_index=True)
    x = alt.X("b:Q", title="batch size B [rollouts per step]", scale=log_scale(), axis=log_axis())
    axis_colour = alt.Color("axis:N", title="axis",
                            scale=alt.Scale(domain=["prompt", "rollout"], range=["#1f77b4", "#d62728"]))

    def panel(field_: str, y_title: str) -> alt.TopLevelMixin:
        y = alt.Y(f"{field_}:Q", title=y_title, scale=log_scale(), axis=log_axis())
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
            data=inline_records(data),
        ).facet(column=alt.Column("axis:N", title=None, header=alt.Header(labelExpr="datum.value + ' axis'")))

    chart = alt.vconcat(
        panel("S", "S: steps to target [steps]"), panel("E", "E = B·S [rollouts trained on]")
    )
    if notes:
        caption += "; " + "; ".join(notes)
    return ChartSpec(name, title, caption + ".", chart=finish_chart(chart, title))


def chart_crs_prediction(t: dict[str, pd.DataFrame | None], params: Mapping[str, Any]) -> ChartSpec:
    name, title = "crs_prediction", "CRS-predicted against observed best n under a fixed total batch"
    caption = (
        "Each point is one fixed total batch B: the n nearest the measured critical rollout size CRS (science §6.3) "
        "against the n that reached the best validation reward (science §7); points on the dashed y = x line agree"
    )
    cp = t["crs_prediction"]
    if cp is None:
        return ChartSpec(name, title, caption + ".", missing=absent(t, "crs_prediction", "CRS prediction check"))
    require_columns(cp, "crs_prediction", ["b", "predicted_n", "observed_best_n"])
    df = pd.DataFrame(
        {
            "b": as_numeric(cp["b"]),
            "crs": [fmt_value(v) for v in as_numeric(cp["crs"])] if "crs" in cp else "—",
            "predicted_n": as_numeric(cp["predicted_n"]),
            "observed_best_n": as_numeric(cp["observed_best_n"]),
        }
    )
    n_unmeasured = int(df["predicted_n"].isna().sum())
    df = df.dropna(subset=["predicted_n", "observed_best_n"])
    df = df[(df["predicted_n"] > 0) & (df["observed_best_n"] > 0)]
    if df.empty:
        return ChartSpec(name, title, caption + ".",
                         missing="The `crs_prediction` table has no row with both a predicted and an observed best n.")
    df["agree"] = np.where(df["predicted_n"] == df["observed_best_n"], "agree", "disagree")
    df["label"] = [f"B={fmt_value(b)}" for b in df["b"]]
    ticks = log2_ticks(list(df["predicted_n"]) + list(df["observed_best_n"]))
    lo, hi = ticks[0] / 1.5, ticks[-1] * 1.5
    axis_scale = alt.Scale(type="log", base=2, domain=[lo, hi])
    diag = pd.DataFrame({"predicted_n": [lo, hi], "observed_best_n": [lo, hi]})
    line = (
        alt.Chart(inline_records(diag))
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
        alt.Chart(inline_records(df))
        .mark_point(filled=True, size=90, opacity=0.85)
        .encode(
            **pts_enc,
            color=alt.Color("agree:N", title=None,
                            scale=alt.Scale(domain=["agree", "disagree"], range=["#2ca02c", "#ff7f0e"])),
            tooltip=["b:Q", "crs:N", "predicted_n:Q", "observed_best_n:Q", "agree:N"],
        )
    )
    labels = (
        alt.Chart(inline_records(df))
        .mark_text(align="left", dx=8, dy=-6, fontSize=10, color="#333")
        .encode(**pts_enc, text="label:N")
    )
    chart = alt.layer(line, pts, labels).properties(width=CHART_HEIGHT + 60, height=CHART_HEIGHT + 60)
    caption += f" ({int((df['agree'] == 'agree').sum())} of {len(df)} agree"
    if n_unmeasured:
        caption += f"; {n_unmeasured} batch sizes without a measured CRS are left out"
    return ChartSpec(name, title, caption + ").", chart=finish_chart(chart, title))
