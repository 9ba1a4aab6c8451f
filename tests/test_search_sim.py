"""Proof of the frontier search by simulation (science §8): 200 whole studies, as a grid and as a search.

Both go through rollscale.core.search.decisions (rollscale.core.search.simulate), with the default settings
(eta 2, alpha 0.3: docs/benchmarks.md, "Frontier search against the grid"). Worth its time
(about 10 s of CPU on this 2-core machine): it is the only check that the search's rules, run
together over many noisy studies, keep the grid's answer. Measured here (2026-11-24): 98.2 %
agreement where A2 holds, median spent 87.8 % of the grid's rollouts (mean 82.8 %); the issue's
50 % is not reached by a rule that keeps the answer (docs/benchmarks.md has the trade-off).
"""

from __future__ import annotations

import pytest

from rollscale.core.search.decisions import SearchSettings
from rollscale.core.search.simulate import FAMILIES, make_studies, simulate, summarise

HOLDS = tuple(f for f in FAMILIES if f != "a2")


@pytest.fixture(scope="module")
def result():
    studies = make_studies(40, seed=0)
    assert len(studies) == 200
    return simulate(studies, SearchSettings())


def test_the_search_names_the_grids_best_key_wherever_the_grid_decides(result):
    s = summarise(result, families=HOLDS)
    assert s["decided_budgets"] >= 1500
    assert s["agree"] >= 0.95, s
    # A2 violated: the search may stop a small n too early, and still mostly agrees
    assert summarise(result, families=("a2",))["agree"] >= 0.9


def test_the_search_spends_fewer_rollouts_than_the_grid(result):
    s = summarise(result)
    assert s["median_spent"] <= 0.9 and s["mean_spent"] <= 0.85, s
    spent = result.studies.groupby("family")["spent"]
    assert (spent.median() < 0.9).all() and (spent.max() <= 1.0 + 1e-9).all()
    stops = result.decisions[result.decisions["action"] == "stop"]
    assert set(stops["rule"]) == {"a", "b", "c"} and stops["n_points"].min() >= 8


def test_the_bracket_adds_the_key_beyond_a_winning_edge(result):
    added = result.studies.set_index("family")["added"]
    assert (added["edge_low"] == "2").mean() >= 0.9
    assert (added["edge_high"] == "16").mean() >= 0.75
    assert (added[["cross", "tie", "a2"]] == "").all()  # their grids already span the limits 2..16


def test_the_a2_warning_fires_where_a2_is_violated(result):
    violated = summarise(result, families=("a2",))
    assert violated["a2_warns_grid"] >= 0.85 and violated["a2_warns_search"] >= 0.85, violated
    holds = summarise(result, families=HOLDS)
    assert holds["a2_warns_grid"] <= 0.05 and holds["a2_warns_search"] <= 0.1, holds
