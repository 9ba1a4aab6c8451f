"""The sweep's search in the report (science §9.4): its runs' curves, rungs and stops, its cost, its decisions.

The search advances every run in rungs of budget and, after each rung, settles
the keys that cannot beat the leader at C* by more than epsilon and stops them
(rules epsilon, a2, decided of science §9.4). The ``search`` table holds one
row per run per decision; it is empty when the sweep ran as a grid
(``sweep.search.method: grid``), and then nothing here is shown.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import altair as alt
import pandas as pd

from rollscale.config import SearchParams
from rollscale.core.search.decisions import search_method
from rollscale.report.base import (
    CHART_HEIGHT,
    CHART_WIDTH,
    ChartSpec,
    TableSpec,
    absent,
    as_numeric,
    finish_chart,
    fmt_value,
    inline_records,
    log_axis,
    log_scale,
    missing_stage,
    params_dict,
    require_columns,
    stages_not_run,
)
from rollscale.report.charts.curves import evals_with_runs, run_colour
from rollscale.report.reasons import runs_as_ended, runs_reached_text

__all__ = ["chart_search", "search_cost", "search_sentence", "table_search"]

# what each stop rule says (science §9.4)
RULE_WHY = {
    "epsilon": "settled: it cannot beat the leader at C* by more than the tolerance (upper bound of D ≤ ε)",
    "a2": "settled: an n below the leader, beaten by it (A2: it will not overtake at a larger budget)",
    "decided": "the leader at C*, every other key settled: the decision is made",
    "forecast": "settled: its upper bound at C* is below the leader's lower bound minus ε (science §11.3)",
    "cap": "settled: its climb cap at C* is below the best other key's lower bound minus ε (science §10.4)",
}
# the key each design's group varies (its name's prefix, rollscale.core.search.replay.replay_groups)
KEY_NAMES = {"n": "n", "iso_batch": "n", "b_problem": "B_problem", "rule": "rule"}
SPENT_STATUSES = ("finished", "stopped")


def _no_search(t: Mapping[str, pd.DataFrame | None], what: str) -> str:
    """Why there is no search to show: the sweep has not run, or it ran as a grid."""
    if "sweep" in stages_not_run(t):
        return missing_stage("search", "sweep results")
    return (f"The sweep ran as a grid (`sweep.search.method: grid`): {runs_reached_text(_ended_runs(t))}, so "
            f"there is no {what} (science §9.4).")


def _ended_runs(t: Mapping[str, pd.DataFrame | None]) -> pd.DataFrame | None:
    runs = t.get("runs")
    return None if runs is None else runs_as_ended(runs, t.get("steps"))


def _search(t: Mapping[str, pd.DataFrame | None]) -> pd.DataFrame | None:
    """The search table with typed columns, or None for a grid sweep (no rows)."""
    s = t.get("search")
    if s is None or s.empty:
        return None
    require_columns(s, "search", ["group", "decision", "rung", "c", "key", "seed", "action", "rule"])
    s = s.copy()
    for col in ("decision", "rung", "c", "seed"):
        s[col] = as_numeric(s[col])
    for col in ("group", "key", "action", "rule"):
        s[col] = s[col].astype(str)
    s["key_order"] = pd.to_numeric(s["key"], errors="coerce")  # n = 4 before n = 16; rules by name
    return s.sort_values(["group", "decision", "key_order", "key", "seed"], kind="stable").drop(columns="key_order")


def _key_label(group: str, key: str) -> str:
    """``n = 16`` for key "16" of group "n:bucket=easy/...": the key named as its design varies it."""
    name = KEY_NAMES.get(group.split(":", 1)[0], "key")
    return f"{name} = {fmt_value(key)}"


def _keys_text(rows: pd.DataFrame) -> str:
    """The distinct keys of ``rows`` as "n = 16, 8", in the order the search decided on them."""
    labels = list(dict.fromkeys(_key_label(g, k) for g, k in zip(rows["group"], rows["key"], strict=True)))
    by_name: dict[str, list[str]] = {}
    for label in labels:
        name, value = label.split(" = ", 1)
        by_name.setdefault(name, []).append(value)
    return "; ".join(f"{name} = {', '.join(values)}" for name, values in by_name.items())


def _stops_text(s: pd.DataFrame, runs: pd.DataFrame | None) -> str:
    """What the search stopped and why, for a caption (science §9.4); with no stop, what the runs did."""
    stops = s[s["action"] == "stop"]
    if stops.empty:
        return f"the search stopped no key; {runs_reached_text(runs)}"
    parts = []
    for (group, key, rung, rule), g in stops.groupby(["group", "key", "rung", "rule"], sort=False):
        seeds = ", ".join(fmt_value(v) for v in sorted(g["seed"].unique()))
        why = RULE_WHY.get(rule, rule)
        parts.append(f"{_key_label(group, key)} (seed {seeds}) at rung {fmt_value(rung)} "
                     f"(C = {fmt_value(g['c'].iloc[0])}) by rule {rule}, {why}")
    return "the search stopped " + "; ".join(parts)


def _stopped_points(runs: pd.DataFrame | None, ev: pd.DataFrame) -> pd.DataFrame:
    """The last evaluation of each run the search stopped, with its stop rule and end reason."""
    cols = ["run_id", "c", "avg_at_k", "stop_rule", "end_reason"]
    if runs is None or "status" not in runs.columns:
        return pd.DataFrame(columns=cols)
    stopped = runs[runs["status"].astype(str) == "stopped"].copy()
    stopped["run_id"] = stopped["run_id"].astype(str)
    last = ev[ev["run_id"].isin(stopped["run_id"])].sort_values("c").groupby("run_id").tail(1)
    info = stopped.set_index("run_id")
    last = last.copy()
    for col, default in (("stop_rule", "?"), ("end_reason", "stopped")):
        last[col] = last["run_id"].map(info[col]).fillna(default).astype(str) if col in info else default
    return last[cols + [c for c in ("n",) if c in last.columns]].sort_values("run_id")


def chart_search(t: Mapping[str, pd.DataFrame | None], params: Mapping[str, Any]) -> ChartSpec:
    """Every run's validation curve against C with the search's rungs and where its stopped runs ended (§9.4)."""
    name = "search"
    title = "The search (science §9.4, §10.5): every run's curve to where it stopped, the rungs, and why"
    caption = (
        "Validation avg@k against compute C in rollouts (log scale) for every run coloured by n, with a dashed "
        "rule at each rung's budget and a marker (shaped by the stop rule) at the last evaluation of each run "
        "the search stopped (science §9.4; §10.5 where it reads the forecast)"
    )
    s = _search(t)
    if s is None:
        return ChartSpec(name, title, caption + ".", missing=_no_search(t, "search to draw"))
    if t.get("evals") is None:
        return ChartSpec(name, title, caption + ".", missing=absent(t, "evals", "sweep results"))
    ev, has_runs = evals_with_runs(dict(t), ["avg_at_k"])
    ev = ev[(ev["c"] > 0) & ev["avg_at_k"].notna()].sort_values(["run_id", "c"])
    if ev.empty:
        return ChartSpec(name, title, caption + ".", missing="The `evals` table has no evaluation at C > 0 to plot.")
    x = alt.X("c:Q", title="compute C [rollouts generated]", scale=log_scale(), axis=log_axis())
    y = alt.Y("avg_at_k:Q", title="validation reward avg@k [fraction correct]")
    cols = [c for c in ("run_id", "c", "avg_at_k", "n", "b_problem", "bucket") if c in ev.columns]
    enc: dict[str, Any] = {"x": x, "y": y, "color": run_colour(has_runs), "detail": "run_id:N",
                           "tooltip": ["run_id:N", alt.Tooltip("c:Q", format=",.0f"),
                                       alt.Tooltip("avg_at_k:Q", format=".3f")]}
    if ev["bucket"].nunique() > 1:  # one panel: the buckets told apart by dash
        enc["strokeDash"] = alt.StrokeDash("bucket:N", title="training bucket")
    lines = alt.Chart(inline_records(ev[cols])).mark_line(strokeWidth=1.4, opacity=0.85).encode(**enc)
    rungs = s.drop_duplicates("c")[["rung", "c"]].dropna()
    layers = [
        alt.Chart(inline_records(rungs)).mark_rule(color="#888", strokeDash=[4, 3]).encode(
            x=x, tooltip=[alt.Tooltip("rung:Q", title="rung"), alt.Tooltip("c:Q", title="rung budget", format=",.0f")]
        ),
        lines,
    ]
    stopped = _stopped_points(t.get("runs"), ev)
    if not stopped.empty:
        layers.append(
            alt.Chart(inline_records(stopped)).mark_point(filled=True, size=110, color="#d62728", stroke="black",
                                                          strokeWidth=0.6).encode(
                x=x, y="avg_at_k:Q", shape=alt.Shape("stop_rule:N", title="stopped by rule"),
                tooltip=["run_id:N", "end_reason:N", alt.Tooltip("c:Q", format=",.0f"),
                         alt.Tooltip("avg_at_k:Q", format=".3f")],
            )
        )
    sized = [lyr.properties(width=CHART_WIDTH, height=CHART_HEIGHT) for lyr in layers]
    chart = alt.layer(*sized)
    caption += ": " + _stops_text(s, _ended_runs(t))
    if not has_runs:
        caption += "; the runs table is missing, so runs are coloured by run id and stopped runs are not marked"
    return ChartSpec(name, title, caption + ".", chart=finish_chart(chart, title))


def _seeds_max(params: Mapping[str, Any] | None) -> int | None:
    """``sweep.search.seeds_max`` (null: as many as ``sweep.seeds``) from the params; None when they do not say."""
    sweep = params_dict(params).get("sweep") or {}
    cap = (sweep.get("search") or {}).get("seeds_max")
    return int(cap) if cap is not None else (len(set(sweep["seeds"])) if sweep.get("seeds") else None)


def search_cost(t: Mapping[str, pd.DataFrame | None], params: Mapping[str, Any] | None = None,
                ) -> dict[str, Any] | None:
    """Rollouts the search spent against the grid's (science §9.4).

    ``spent`` is what the search trained each run to (its rows' largest ``c_train``: a
    run reused from an earlier sweep counts only as far as the search needed
    it), ``grid`` every key in play with ``sweep.search.seeds_max`` seeds (from
    ``params``; else the most any key reached) to C_max. ``share`` = spent /
    grid; ``c_star``: the target budget C* the search decided at (NaN where its rows carry none), against which
    the sentence states the spend (science §11's cost); ``stopped`` / ``added``: the keys stopped and added, as
    text ("n = 16, 8"; "" for none). None for a grid sweep (no search rows) or when no run has finished.
    """
    s, runs = _search(t), t.get("runs")
    if s is None or runs is None:
        return None
    require_columns(runs, "runs", ["status", "c", "c_max"])
    require_columns(s, "search", ["c_train"])
    done = runs[runs["status"].astype(str).isin(SPENT_STATUSES)]
    if done.empty or float(as_numeric(done["c_max"]).sum()) <= 0:
        return None
    spent = float(as_numeric(s["c_train"]).groupby([s["group"], s["key"], s["seed"]]).max().sum())
    seeds = _seeds_max(params) or int(s.groupby(["group", "key"])["seed"].nunique().max())
    grid = float(s.groupby("group")["key"].nunique().sum() * seeds * as_numeric(done["c_max"]).max())
    method = ((params_dict(params).get("sweep") or {}).get("search") or {}).get("method")
    # science §11's cost: the rollouts in all against the production run's C* (every row carries its C*)
    c_star = float(as_numeric(s["c_star"]).max()) if "c_star" in s.columns and len(s) else math.nan
    return {"spent": spent, "grid": grid, "share": spent / grid, "runs": len(done), "method": method,
            "c_star": c_star if math.isfinite(c_star) and c_star > 0 else math.nan,
            # the leader stops too when the decision is made (rule "decided"): it was not settled
            "stopped": _keys_text(s[(s["action"] == "stop") & (s["rule"] != "decided")]),
            "added": _keys_text(s[s["action"] == "add"])}


def search_sentence(cost: Mapping[str, Any]) -> str:
    """The headline's sentence on the search's cost, from :func:`search_cost`."""
    # the method's own words; no method in the params: the schema's default
    method = search_method(cost.get("method") or SearchParams.model_fields["method"].default)
    c_star = cost.get("c_star", math.nan)
    times = f" ({cost['spent'] / c_star:.2f} x C*)" if math.isfinite(c_star) else ""
    text = (f"The {method.words} spent {cost['spent']:,.0f} "
            f"rollouts{times}, {cost['share']:.0%} of the {cost['grid']:,.0f} of a grid of every key it tried with "
            f"seeds_max seeds to C_max; it settled {cost['stopped'] or 'no key'}")
    return text + (f" and added {cost['added']}." if cost["added"] else ".")


def _fold(values: pd.Series) -> str:
    """One cell for several seeds' rows: their distinct values, formatted, in order."""
    return ", ".join(dict.fromkeys(fmt_value(v) for v in values))


def table_search(t: Mapping[str, pd.DataFrame | None]) -> TableSpec:
    """The search's decisions, one row per group, decision and key with its seeds listed (science §9.4)."""
    name, title = "search", "The search's decisions"
    caption = ("Each decision of the search (science §9.4), one row per key with its seeds: the rung and its "
               "budget C, the action (continue, stop, add, seed, finish, resume), the rule behind it (epsilon, a2, "
               "forecast, cap, decided: stops; bracket: a key added at the grid's edge; undecided: a seed added; "
               "resume: a stopped key the revised forecast says could win, science §11.3), the leader, the "
               "evaluations behind the key's fit, its reward at C* and the upper bound of its difference D to the "
               "leader, and why in words.")
    s = _search(t)
    if s is None:
        return TableSpec(name, title, caption, missing=_no_search(t, "search decision to list"))
    rows = []
    for (group, _, key), g in s.groupby(["group", "decision", "key"], sort=False):
        row = {"group": group, "rung": _fold(g["rung"]), "C": _fold(g["c"]), "key": key,
               "seeds": _fold(g["seed"].sort_values())}
        for col in ("action", "rule", "leader", "n_points", "note"):
            row[col] = _fold(g[col]) if col in g.columns else "—"
        for col, label in (("r_star", "R at C*"), ("d_hi", "D upper bound")):
            if col in s.columns and as_numeric(s[col]).notna().any():
                row[label] = _fold(as_numeric(g[col]).round(3))
        rows.append(row)
    return TableSpec(name, title, caption, frame=pd.DataFrame(rows))
