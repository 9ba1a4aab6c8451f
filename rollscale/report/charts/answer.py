"""The answer drawn: each key's reward at C* with its interval, the leader and the ε band around it (science §9.4).

The report's first figure, right under its first line: one row per key of the decision's first design (the
groups the first line speaks of), its reward at C* as a point with its 95 % interval (the pooled seed spread of
science §9.3, clipped to [0, 1]); the leader marked, the band [R_L − ε, R_L + ε] behind it; a key whose C* is
beyond its data drawn as its bounds only. Keys the study trained are circles; keys a forecast adds (science §10,
the ``forecast`` table where the fit stage writes one: same key columns, ``reward``, ``reward_lo``,
``reward_hi`` and ``trained`` false for a key no run trained) are diamonds, told apart in the legend.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import altair as alt
import numpy as np
import pandas as pd

from rollscale.report.base import group_labels, CHART_WIDTH, ChartSpec, absent, as_numeric, finish_chart, fmt_interval, \
    fmt_value, inline_records, require_columns
from rollscale.report.decision_text import first_design, fmt_budget, from_forecast, key_label

__all__ = ["answer_rows", "chart_answer"]

_STATUS_COLOURS = {"leader": "#2ca02c", "within tolerance": "#98df8a", "settled": "#7f7f7f", "open": "#ff7f0e",
                   "unknown": "#bcbd22", "forecast": "#1f77b4"}
ROW_HEIGHT = 40  # pixels a key


def answer_rows(decision: pd.DataFrame, forecast: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per key of the first design's groups: ``group, key, label, reward, lo, hi, status, source``
    (``trained`` / ``forecast``), ``text`` (the reward with its interval as the tables print it), and the group's
    leader reward and tolerance (``band_lo``, ``band_hi``). ``forecast``: the hook for science §10's keys not
    trained (rows with ``trained`` false), drawn beside the trained ones."""
    require_columns(decision, "decision", ["design", "bucket", "rule", "fixed", "key", "status", "reward", "reward_lo",
                                           "reward_hi", "tolerance"])
    d = first_design(decision)
    frames = [d.assign(source="trained")]
    if forecast is not None and len(forecast):
        require_columns(forecast, "forecast", ["design", "bucket", "rule", "fixed", "key", "reward", "reward_lo",
                                               "reward_hi", "trained"])
        at_target = forecast["target"].astype(bool) if "target" in forecast.columns else True  # not 2x, 4x, 8x
        extra = forecast[~forecast["trained"].astype(bool) & at_target]
        extra = extra[extra["design"].astype(str) == str(d["design"].iloc[0])]
        frames.append(extra.assign(status="forecast", source="forecast", tolerance=d["tolerance"].iloc[0]))
    rows = pd.concat(frames, ignore_index=True)
    groups = group_labels(rows)
    design = str(d["design"].iloc[0])
    out = pd.DataFrame({
        "group": groups, "key": as_numeric(rows["key"]),
        "label": [key_label(design, [int(k)]) for k in rows["key"]],
        "reward": as_numeric(rows["reward"]).clip(0, 1), "lo": as_numeric(rows["reward_lo"]).clip(0, 1),
        "hi": as_numeric(rows["reward_hi"]).clip(0, 1), "status": rows["status"].astype(str),
        "source": rows["source"].astype(str),
    })
    out["text"] = [fmt_interval(v, lo, hi, decimals=2) if np.isfinite(v) else
                   f"unknown, in [{fmt_value(lo, 2)}, {fmt_value(hi, 2)}]"
                   for v, lo, hi in zip(out["reward"], out["lo"], out["hi"], strict=True)]
    out["at"] = out["reward"].fillna((out["lo"] + out["hi"]) / 2)  # where the label goes
    lead = out[out["status"] == "leader"].groupby("group")["reward"].first()
    eps = float(as_numeric(d["tolerance"]).iloc[0])
    out["band_lo"] = (out["group"].map(lead) - eps).clip(0, 1)
    out["band_hi"] = (out["group"].map(lead) + eps).clip(0, 1)
    return out.sort_values(["group", "source", "key"], ascending=[True, False, True]).reset_index(drop=True)


def chart_answer(t: Mapping[str, pd.DataFrame | None], params: Mapping[str, Any]) -> ChartSpec:
    name, title = "answer", "The answer: each key's reward at the target budget C*"
    caption = ("Validation reward at C* (study.target_budget) of every key, with its 95 % interval (the seed spread "
               "pooled across keys, science §9.3; clipped to [0, 1]); the leader, and the band of ±ε "
               "(study.tolerance) around its reward within which a key is as good. A key whose runs end before "
               "C* / eta is drawn as its bounds only; keys a forecast adds (science §10) are drawn as diamonds")
    decision = t.get("decision")
    if decision is None:
        return ChartSpec(name, title, caption + ".", missing=absent(t, "decision", "decision at C*"))
    rows = answer_rows(decision, t.get("forecast"))
    c_star, eps = fmt_budget(decision["c_star"].iloc[0]), float(as_numeric(decision["tolerance"]).iloc[0])
    if from_forecast(first_design(decision)):  # C* past the data: every reward drawn is the forecast's
        caption += ("; C* lies past the runs' data, so every reward here is read off the forecast's surface over the "
                    "keys (science §10.2), circles for the keys trained")
    y = alt.Y("label:N", title=None, sort=alt.SortField("key"), axis=alt.Axis(labelFontSize=12))
    x = alt.X("reward:Q", title=f"validation reward at C* = {c_star} rollouts [0-1]", scale=alt.Scale(zero=False, nice=False,
              padding=14))
    shown = [s for s in _STATUS_COLOURS if s in set(rows["status"])]  # the legend names what is drawn
    colour = alt.Color("status:N", title="key", scale=alt.Scale(domain=shown,
                                                               range=[_STATUS_COLOURS[s] for s in shown]))
    shape = alt.Shape("source:N", title="reward from", scale=alt.Scale(domain=["trained", "forecast"],
                                                                       range=["circle", "diamond"]))
    tooltip = ["label:N", "status:N", "source:N", alt.Tooltip("text:N", title="reward [95 % interval]")]
    base = alt.Chart(inline_records(rows))
    band = base.mark_rect(color="#2ca02c", opacity=0.12).encode(
        x=alt.X("band_lo:Q"), x2="band_hi:Q", tooltip=alt.value(f"the leader's reward ± ε = {eps:g}"))
    lead = base.transform_filter(alt.datum.status == "leader").mark_rule(color="#2ca02c", strokeDash=[4, 3]).encode(
        x="reward:Q")
    bars = base.mark_rule(strokeWidth=2.5).encode(x=alt.X("lo:Q"), x2="hi:Q", y=y, color=colour, tooltip=tooltip)
    points = base.transform_filter("isValid(datum.reward)").mark_point(size=110, filled=True, opacity=1).encode(
        x=x, y=y, color=colour, shape=shape, tooltip=tooltip)
    labels = base.mark_text(align="center", dy=-13, fontSize=11, color="#333").encode(x=alt.X("at:Q"), y=y,
                                                                                       text="text:N")
    height = ROW_HEIGHT * max(int(rows.groupby("group").size().max()), 2)
    layered = alt.layer(band, lead, bars, points, labels).properties(width=CHART_WIDTH, height=height)
    if rows["group"].nunique() > 1:
        layered = layered.facet(row=alt.Row("group:N", title=None)).resolve_scale(y="independent")
    return ChartSpec(name, title, caption + ".", chart=finish_chart(layered, title))
