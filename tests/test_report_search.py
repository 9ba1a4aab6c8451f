"""The report shows the sweep's search (science §9.4): its chart, its cost in the headline, its decisions table."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from rollscale.core.search.state import DECISION_COLUMNS
from rollscale.report import build_charts, study_answer, summary_tables, write_report
from rollscale.report.base import StageNotRun
from rollscale.config import parse_params
from rollscale.report.charts.search import chart_search, search_cost, table_search

GROUP = "n:bucket=easy/rule=uniform/b_problem=4"
C_MAX = 25600.0
SENTENCE = ("The search with forecasts to the decision at C* (science §10.5) spent 76,800 rollouts (3.00 x C*), 75% "
            "of the 102,400 of a grid of every key it tried with seeds_max seeds to C_max; it settled n = 16.")


def _decision(decision: int, c: float, key: int, seed: int, action: str, rule: str, note: str) -> dict:
    return {"group": GROUP, "decision": decision, "rung": decision, "c": c, "key": str(key), "seed": seed,
            "action": action, "rule": rule, "c_train": c if action == "stop" else C_MAX, "leader": "8",
            "leader_lo": 0.5, "key_hi": math.nan, "best_share": math.nan, "at_c": math.nan,
            "n_points": 8 * decision, "note": note, "c_star": C_MAX, "r_star": math.nan, "d_lo": math.nan,
            "d_hi": math.nan}


def _search_tables() -> dict[str, pd.DataFrame]:
    """n = 8 and n = 16, seeds 0 and 1; n = 16 stopped at rung 1 (C = 12,800) by rule epsilon."""
    search = pd.DataFrame(
        [_decision(1, 12800.0, 8, s, "continue", "none", "leads") for s in (0, 1)]
        + [_decision(1, 12800.0, 16, s, "stop", "epsilon", "D's upper bound -0.2 <= epsilon") for s in (0, 1)]
        + [_decision(2, C_MAX, 8, s, "finish", "budget", "reached C_max") for s in (0, 1)],
        columns=DECISION_COLUMNS,
    )
    runs, evals = [], []
    for n in (8, 16):
        for seed in (0, 1):
            run_id = f"np4_nr{n}_uniform_s{seed}"
            stopped = n == 16
            c_end = 12800.0 if stopped else C_MAX
            runs.append({"run_id": run_id, "bucket": "easy", "n": n, "b_problem": 4, "rule": "uniform",
                         "seed": seed, "c_max": C_MAX, "status": "stopped" if stopped else "finished",
                         "steps": int(c_end // (4 * n)), "c": c_end,
                         "end_reason": "stopped at rung 1 by rule epsilon" if stopped else "budget reached",
                         "stop_rung": 1 if stopped else None, "stop_rule": "epsilon" if stopped else None})
            for c in np.arange(0.0, c_end + 1, 1600.0):
                mean = 0.1 + (0.7 if n == 8 else 0.4) * c / (c + 4000.0)
                evals.append({"run_id": run_id, "step": int(c // (4 * n)), "c": c, "avg_at_k": mean,
                              "avg_at_k_se": 0.02, "best_at_k": min(1.0, mean + 0.2),
                              "worst_at_k": max(0.0, mean - 0.2)})
    runs_df = pd.DataFrame(runs).astype({"stop_rung": "Int64", "stop_rule": "string"})
    return {"runs": runs_df, "evals": pd.DataFrame(evals), "search": search}


@pytest.fixture(scope="module")
def tables() -> dict[str, pd.DataFrame]:
    return _search_tables()


def _layer_values(chart, i: int) -> list[dict]:
    spec = chart.to_dict()
    data = spec["layer"][i]["data"]
    return data["values"] if "values" in data else spec["datasets"][data["name"]]


def test_chart_marks_the_stopped_runs_and_the_rungs(tables):
    spec = chart_search(tables, {})
    assert spec.drawn, spec.missing
    rungs = _layer_values(spec.chart, 0)
    assert sorted(r["c"] for r in rungs) == [12800.0, C_MAX]
    assert len(_layer_values(spec.chart, 1)) == len(tables["evals"][tables["evals"]["c"] > 0])
    stopped = _layer_values(spec.chart, 2)
    assert [(r["run_id"], r["c"], r["stop_rule"]) for r in stopped] == [
        ("np4_nr16_uniform_s0", 12800.0, "epsilon"), ("np4_nr16_uniform_s1", 12800.0, "epsilon")]
    assert all(r["end_reason"] == "stopped at rung 1 by rule epsilon" for r in stopped)
    assert "stopped n = 16 (seed 0, 1) at rung 1 (C = 12,800) by rule epsilon, settled" in spec.caption
    assert spec.caption.endswith(".") and "science §9.4" in spec.caption and "frontier" not in spec.caption
    assert "[rollouts generated]" in str(spec.chart.to_dict())


def test_search_cost_against_the_grid(tables):
    cost = search_cost(tables)
    assert cost == {"spent": 76800.0, "grid": 102400.0, "share": 0.75, "runs": 4, "stopped": "n = 16", "added": "",
                    "method": None, "c_star": C_MAX}  # no params: the sentence names the default method's search
    # science §11's cost in the sentence: the rollouts in all against C*, only where the rows carry a C*
    from rollscale.report.charts.search import search_sentence

    assert "spent 76,800 rollouts, 75%" in search_sentence({**cost, "c_star": math.nan})
    added = pd.concat([tables["search"], pd.DataFrame([_decision(1, 12800.0, 4, 0, "add", "bracket", "edge")])])
    assert search_cost(dict(tables, search=added))["added"] == "n = 4"
    assert study_answer(dict(tables, search=added)).headline.endswith("it settled n = 16 and added n = 4.")


def test_table_has_one_row_per_key_and_decision_with_its_seeds(tables):
    frame = table_search(tables).frame
    assert list(frame.columns) == ["group", "rung", "C", "key", "seeds", "action", "rule", "leader", "n_points",
                                   "note"]
    assert frame[["rung", "C", "key", "seeds", "action", "rule"]].values.tolist() == [
        ["1", "12,800", "8", "0, 1", "continue", "none"],
        ["1", "12,800", "16", "0, 1", "stop", "epsilon"],
        ["2", "25,600", "8", "0, 1", "finish", "budget"],
    ]
    assert (frame["group"] == GROUP).all() and frame["n_points"].tolist() == ["8", "8", "16"]
    assert [s.name for s in summary_tables(tables)][-3:] == ["runs", "search", "more_compute"]


def test_headline_says_what_the_search_spent(tables):
    answer = study_answer(tables)  # no fit yet: no answer, and the search's cost after it
    assert answer.headline == "No answer yet: the study has not run as far as the fit. " + SENTENCE


def test_a_grid_sweep_shows_nothing_of_a_search(tables):
    grid = dict(tables, search=pd.DataFrame(columns=DECISION_COLUMNS),
                runs=tables["runs"].assign(status="finished", c=C_MAX))
    charts = {c.name: c for c in build_charts(grid)}
    chart = charts["search"]
    assert not chart.drawn and "`sweep.search.method: grid`" in chart.missing
    assert not isinstance(chart.missing, StageNotRun)  # the sweep ran: not "missing", just nothing to show
    assert charts["reward_vs_compute"].drawn
    table = {s.name: s for s in summary_tables(grid)}["search"]
    assert table.frame is None and "sweep.search.method: grid" in table.missing
    assert search_cost(grid) is None
    assert "search" not in study_answer(grid).headline
    # no sweep at all: the stage to run
    none = {name: None for name in ("runs", "evals", "search")}
    assert chart_search(none, {}).missing == "No sweep results yet: run the `sweep` stage (dvc repro sweep)."
    assert isinstance(table_search(none).missing, StageNotRun)


def test_the_written_report_shows_the_search(tables, tmp_path):
    paths = write_report(tables, tmp_path)
    page, md = paths.html.read_text(encoding="utf-8"), paths.summary.read_text(encoding="utf-8")
    assert 'id="chart-search"' in page and "search" in paths.pngs and "search" not in paths.missing
    assert "The search (science §9.4, §10.5): every run" in page and "## The search's decisions" in md
    assert paths.headline.endswith(SENTENCE) and "75% of the 102,400" in page


def test_a_decision_search_counts_what_it_trained_each_run_to_against_seeds_max_seeds(tables):
    """Science §9.4's search: spent = each run's largest c_train in the search table (a run
    reused at C_max counts only as far as the search trained it), the grid every key with seeds_max seeds."""
    search = tables["search"]
    reused = dict(tables, search=search, runs=tables["runs"].assign(c=C_MAX))  # runs an earlier grid trained
    cost = search_cost(reused, {"sweep": {"seeds": [0, 1, 2], "search": {"seeds_max": 4}}})
    assert cost["spent"] == 2 * 12800.0 + 2 * C_MAX
    assert cost["grid"] == 2 * 4 * C_MAX and cost["share"] == pytest.approx(76800 / 204800)
    assert search_cost(reused, {"sweep": {"seeds": [0, 1, 2]}})["grid"] == 2 * 3 * C_MAX  # null: len(seeds)
    # the report stage passes the validated params tree, not a mapping
    validated = parse_params({"sweep": {"seeds": [0, 1, 2], "search": {"seeds_max": 4}}})
    assert search_cost(reused, validated)["grid"] == 2 * 4 * C_MAX
    decision = {"sweep": {"seeds": [0, 1], "search": {"seeds_max": 3, "method": "decision"}}}
    headline = study_answer(reused, decision).headline
    assert "The search to the decision at C* (science §9.4) spent 76,800 rollouts (3.00 x C*), 50% of" in headline
    forecast = {"sweep": {"seeds": [0, 1], "search": {"seeds_max": 3}}}  # the default method
    assert "The search with forecasts to the decision at C* (science §10.5) spent 76,800 rollouts" \
        in study_answer(reused, forecast).headline
    assert "frontier search" not in headline and headline.endswith("it settled n = 16.")
    # the leader's own stop when the decision is made is no settlement
    leader_stop = search.assign(rule=search["rule"].where(search["action"] != "stop", "decided"))
    assert search_cost(dict(reused, search=leader_stop), validated)["stopped"] == ""
    chart = chart_search(reused, {})  # each run's curve to where it stopped, which key was settled at which rung
    assert chart.title.startswith("The search (science §9.4, §10.5)") and "frontier" not in chart.caption
    assert "the search stopped n = 16 (seed 0, 1) at rung 1 (C = 12,800) by rule epsilon, settled" \
        in chart.caption
