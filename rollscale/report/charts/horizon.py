"""The forecast past the data drawn: "with 2x, 4x, 8x more compute" (science §10.5).

From the fit stage's ``forecast`` table, for each group of the first line's design: the key the surface puts first
at each budget it was read at (C* and 2, 4 and 8 times the runs' budget ``sweep.c_max``), n*(C), and that key's
reward with its 95 % interval, against C on a log axis. A budget whose interval is wider than the forecast's
widest answer is drawn hollow (``unknown``, science §10.2). Rewards and intervals are clipped to [0, 1], the range
of a reward, as every chart of the report.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import altair as alt
import pandas as pd

from rollscale.report.base import (
    group_labels,
    CHART_WIDTH,
    ChartSpec,
    absent,
    as_numeric,
    finish_chart,
    fmt_interval,
    inline_records,
    log2_ticks,
    log_scale,
    require_columns,
)
from rollscale.report.decision_text import first_design, fmt_budget, key_label

__all__ = ["chart_more_compute", "more_compute_rows"]

PANEL_HEIGHT = 190  # pixels of each of the two panels


def more_compute_rows(forecast: pd.DataFrame) -> pd.DataFrame:
    """One row per group of the first design and budget: ``group, c, budget`` (its words: "160,000 (C*)"),
    ``key`` (n*(C), the forecast's leader), ``label``, ``reward, lo, hi`` (clipped to [0, 1]), ``unknown``,
    ``text`` (the reward with its interval as the tables print it); sorted by group and C."""
    require_columns(forecast, "forecast", ["design", "bucket", "rule", "fixed", "target", "key", "trained", "c_star",
                                           "reward", "reward_lo", "reward_hi", "leader", "unknown"])
    fc = first_design(forecast)
    lead = fc[fc["trained"].astype(bool) & (as_numeric(fc["key"]) == as_numeric(fc["leader"]))]
    design = str(fc["design"].iloc[0]) if len(fc) else "n"
    out = pd.DataFrame({
        "group": group_labels(lead),
        "c": as_numeric(lead["c_star"]),
        "budget": [fmt_budget(c) + (" (C*)" if bool(t) else "") for c, t in zip(lead["c_star"], lead["target"],
                                                                               strict=True)],
        "key": as_numeric(lead["key"]),
        "label": [key_label(design, [int(k)]) for k in lead["key"]],
        "reward": as_numeric(lead["reward"]).clip(0, 1), "lo": as_numeric(lead["reward_lo"]).clip(0, 1),
        "hi": as_numeric(lead["reward_hi"]).clip(0, 1),
        "unknown": lead["unknown"].astype(bool).map({True: "wider than an answer", False: "an answer"}),
    })
    out["text"] = [fmt_interval(v, lo, hi, decimals=2) for v, lo, hi in zip(out["reward"], out["lo"], out["hi"],
                                                                           strict=True)]
    return out.sort_values(["group", "c"], ignore_index=True)


def chart_more_compute(t: Mapping[str, pd.DataFrame | None], params: Mapping[str, Any]) -> ChartSpec:
    name, title = "more_compute", "With 2x, 4x, 8x more compute: n*(C) and its reward, forecast past the data"
    caption = ("At the target C* and at 2, 4 and 8 times the runs' budget (sweep.c_max): above, the reward of the key "
               "the forecast's surface puts first, with its 95 % interval (bootstrap refits of the surface, science "
               "§10.2; clipped to [0, 1]); below, that key, n*(C), against C (log axes). Hollow: an interval wider "
               "than the forecast's widest answer (unknown). The backtest beside the answer says whether to trust "
               "it past the data (science §10.3); every key's forecast is in the `forecast` table")
    fc = t.get("forecast")
    if fc is None:
        return ChartSpec(name, title, caption + ".", missing=absent(t, "forecast", "forecast past the data"))
    rows = more_compute_rows(fc) if len(fc) else pd.DataFrame()
    if rows.empty:
        return ChartSpec(name, title, caption + ".", missing="No design group with two ordered keys to forecast over "
                         "(the `backtest` table says why).")
    fcd = first_design(fc)
    design = str(fcd["design"].iloc[0])  # the rows' design
    key_name = "B_problem" if design == "b_problem" else "n"
    several = rows["group"].nunique() > 1
    colour = alt.Color("group:N", title="group") if several else alt.value("#1f77b4")
    seen = float(as_numeric(fcd.loc[fcd["trained"].astype(bool), "c_seen"]).max()) if "c_seen" in fcd else float("nan")
    marks = pd.DataFrame({"c": [seen, float(rows.loc[rows["budget"].str.endswith("(C*)"), "c"].max())],
                          "what": ["the runs' budget", "C*"]}).dropna()
    ticks_c = sorted({*rows["c"].tolist(), *marks["c"].tolist()})
    x = alt.X("c:Q", title="budget C [rollouts] (log)", scale=log_scale(),
              axis=alt.Axis(format=".3~s", values=ticks_c, labelSeparation=6, labelOverlap="greedy"))
    tooltip = [alt.Tooltip("group:N"), alt.Tooltip("budget:N", title="C [rollouts]"),
               alt.Tooltip("label:N", title=f"{key_name}*(C)"), alt.Tooltip("text:N", title="reward [95 % interval]"),
               alt.Tooltip("unknown:N", title="interval")]
    fill = alt.Fill("unknown:N", title="interval", scale=alt.Scale(domain=["an answer", "wider than an answer"],
                                                                  range=["#1f77b4", "white"]))
    base = alt.Chart(inline_records(rows))
    bars = base.mark_rule(strokeWidth=2.5).encode(x=x, y=alt.Y("lo:Q"), y2="hi:Q", color=colour, tooltip=tooltip)
    points = base.mark_point(size=90, opacity=1, strokeWidth=2).encode(
        x=x, y=alt.Y("reward:Q", title="validation reward of n*(C) [0-1]", scale=alt.Scale(zero=False, padding=12)),
        color=colour, fill=fill, tooltip=tooltip)
    labels = base.mark_text(align="left", dx=8, fontSize=11, color="#333").encode(x=x, y="reward:Q", text="label:N")
    # where the data ends and where the question is: the forecast is read from the one to the other
    edges = alt.Chart(inline_records(marks)).mark_rule(strokeDash=[4, 3], color="#7f7f7f").encode(
        x=alt.X("c:Q"), tooltip=["what:N"])
    edge_text = alt.Chart(inline_records(marks)).mark_text(align="left", dx=4, baseline="top", y=2, fontSize=10,
                                                           color="#555").encode(x=alt.X("c:Q"), text="what:N")
    reward = alt.layer(edges, edge_text, bars, points, labels).properties(width=CHART_WIDTH, height=PANEL_HEIGHT)
    ticks = log2_ticks(rows["key"].tolist())
    unit = "prompts per step" if design == "b_problem" else "rollouts per prompt"
    y_key = alt.Y("key:Q", title=f"{key_name}*(C) [{unit}]",
                  scale=alt.Scale(type="log", base=2, nice=False, padding=12), axis=alt.Axis(values=ticks, format="d"))
    line = base.mark_line(point=alt.OverlayMarkDef(size=70, filled=True)).encode(
        x=x, y=y_key, color=colour, detail="group:N", tooltip=tooltip)
    n_star = alt.layer(edges, line).properties(width=CHART_WIDTH, height=PANEL_HEIGHT)
    return ChartSpec(name, title, caption + ".", chart=finish_chart(alt.vconcat(reward, n_star), title))
