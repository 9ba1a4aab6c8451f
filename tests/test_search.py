"""The sweep's search, whatever its method (science §9.4): rungs, legs, state, truncation; the method registry,
its one default and the retired frontier search's one-line refusal."""

from __future__ import annotations

import pandas as pd
import pytest

from rollscale.config import DecisionParams, ParamsError, SearchParams, parse_params
from rollscale.core.search.decisions import decide, search_method
from rollscale.core.search.methods.base import SearchMethod
from rollscale.core.search.state import (
    DECISION_COLUMNS,
    SearchGroup,
    SearchSettings,
    bracket_limits,
    empty_decisions,
    group_state,
    leg_budget,
    plan,
    rung_budgets,
    run_budgets,
    truncate,
)
from rollscale.registry import SEARCH_METHODS, RegistryError
from rollscale.sweep.groups import search_settings

C_MAX = 40_000
EVERY = 5  # evaluation interval in steps


# ---------------------------------------------------------------------------
# bookkeeping


def test_rung_budgets_go_down_from_c_max_by_eta():
    assert rung_budgets(40_000, 2.0, 1 / 16) == (2500, 5000, 10000, 20000, 40000)
    assert rung_budgets(40_000, 2.0, 3000) == (5000, 10000, 20000, 40000)  # rollouts, not a fraction
    assert rung_budgets(40_000, 2.0, 1.0) == (40000,)
    assert rung_budgets(1000, 1.5, 0.3)[-1] == 1000
    with pytest.raises(ValueError, match="eta"):
        SearchSettings(SearchParams(eta=1.0))


def test_a_leg_ends_at_the_first_evaluation_past_the_rung():
    g = SearchGroup("g", "rollout", (4, 16), (0,), C_MAX, fixed=16)
    s = SearchSettings(eval_every=20)
    assert leg_budget(g, 16, 2500, s) == 5120  # 20 steps of B = 256
    assert leg_budget(g, 4, 2500, s) == 2560
    assert leg_budget(g, 16, C_MAX, s) == C_MAX  # every run ends at C_max and evaluates there
    assert leg_budget(g, 16, 2500, SearchSettings()) == 2500  # no interval: at the budget
    assert leg_budget(SearchGroup("r", "rule", ("pods", "uniform"), (0,), C_MAX), "pods", 2500, s) == 2500


def test_bracket_limits_follow_the_axis():
    assert bracket_limits("rollout", 16, 1024) == (2, 64)
    assert bracket_limits("prompt", 8, 1024) == (1, 128)
    assert bracket_limits("iso_batch", 128, 1024) == (2, 128)
    assert bracket_limits("rollout", 16, 1024, key_min=4, key_max=32) == (4, 32)
    assert bracket_limits("rule", None, 1024) == (None, None)
    g = SearchGroup("g", "iso_batch", (4, 8), (0,), C_MAX, fixed=96, key_min=2, key_max=96)
    assert g.allows(2) and not g.allows(64)  # 64 does not divide B = 96


def test_state_and_plan_follow_the_decision_rows():
    g = SearchGroup("g", "rollout", (4, 8), (0, 1), C_MAX, fixed=16, key_min=2, key_max=64)
    s = SearchSettings(eval_every=None)
    todo = plan([g], empty_decisions(), s)
    assert set(zip(todo["key"], todo["seed"])) == {(4, 0), (4, 1), (8, 0), (8, 1)} and (todo["c"] == 2500).all()
    rows = [{"group": "g", "decision": 0, "rung": 1, "c": 2500.0, "key": "8", "seed": sd, "action": "stop",
             "rule": "b", "c_train": 2500.0} for sd in (0, 1)]
    rows += [{"group": "g", "decision": 0, "rung": 1, "c": 2500.0, "key": "2", "seed": sd, "action": "add",
              "rule": "bracket", "c_train": 5000.0} for sd in (0, 1)]
    rows += [{"group": "g", "decision": 0, "rung": 1, "c": 2500.0, "key": "4", "seed": sd, "action": "continue",
              "rule": "none", "c_train": 5000.0} for sd in (0, 1)]
    d = pd.DataFrame(rows).reindex(columns=DECISION_COLUMNS)
    st = group_state(g, d, s)
    assert st.keys == (2, 4, 8) and st.stopped == {8: 2500.0} and st.rung == 2 and st.decision == 1
    budgets = run_budgets([g], d, s)
    assert set(budgets.loc[budgets["stopped"], "key"]) == {8}
    todo = plan([g], d, s)
    assert set(todo["key"]) == {2, 4} and (todo["c"] == 5000).all()
    # the last rung decided with nothing added: done
    last = pd.DataFrame([{"group": "g", "decision": 1, "rung": 5, "c": 40000.0, "key": "4", "seed": 0,
                          "action": "finish", "rule": "budget", "c_train": 40000.0}]).reindex(columns=DECISION_COLUMNS)
    assert plan([g], pd.concat([d, last]), s).empty
    seed = last.assign(action="seed", rule="undecided", seed=2)
    st = group_state(g, pd.concat([d, last, seed]), s)
    assert st.rung == 5 and st.seeds[4] == (0, 1, 2)


def test_truncate_keeps_a_run_up_to_its_budget_and_the_step_that_crosses_it():
    pts = pd.DataFrame({"group": "g", "key": 4, "run_id": "r", "seed": 0, "c": [0.0, 640, 1280, 1920, 2560, 3200],
                        "avg_at_k": 0.5, "b": 64.0})
    budget = pd.DataFrame({"group": ["g"], "key": [4], "seed": [0], "c": [2500.0]})
    assert truncate(pts, budget)["c"].tolist() == [0, 640, 1280, 1920, 2560]  # 2560 is the step crossing 2500
    assert truncate(pts.assign(b=32.0), budget)["c"].tolist() == [0, 640, 1280, 1920]  # further than one step
    assert truncate(pts.drop(columns="b"), budget)["c"].tolist() == [0, 640, 1280, 1920, 2560]
    assert truncate(pts, budget.assign(seed=1)).empty



# ---------------------------------------------------------------------------
# the methods: one registry, one default


def test_the_methods_are_registered_one_module_each_and_the_default_is_the_pydantic_fields():
    assert SEARCH_METHODS.plugins == ("rollscale.core.search.methods",) and SEARCH_METHODS.lazy
    assert set(SEARCH_METHODS.names()) >= {"grid", "decision", "forecast"}
    default = SearchParams.model_fields["method"].default
    assert default == "forecast" == parse_params({}).sweep.search.method == SearchSettings().method
    assert isinstance(search_method(default), SearchMethod) and search_method(default).searches
    assert not search_method("grid").searches
    with pytest.raises(RegistryError, match="did you mean 'grid'"):
        search_method("grd")


def test_the_settings_hold_the_sections_so_each_default_is_in_one_place():
    s = search_settings(parse_params({}).sweep)
    assert s.search == SearchParams() and s.study == DecisionParams()
    assert (s.eta, s.alpha, s.resamples, s.tolerance) == (SearchParams().eta, SearchParams().alpha,
                                                          SearchParams().bootstrap_resamples, DecisionParams().tolerance)
    assert s.seeds_max == 3  # null sweep.search.seeds_max: the sweep's seeds
    assert SearchSettings(SearchParams(seeds_max=5), sweep_seeds=3).seeds_max == 5


@pytest.mark.parametrize("search, says", [
    ({"method": "frontier"}, "sweep.search.method: Value error, the frontier search (science §8) is retired: use "
                             "sweep.search.method: decision"),
    ({"grid_points": 50}, "sweep.search.grid_points was the retired frontier search's budget grid"),
    ({"method": "nope"}, "unknown search method 'nope'"),
])
def test_a_retired_or_unknown_method_is_one_line_naming_the_key(search, says):
    with pytest.raises(ParamsError) as err:
        parse_params({"sweep": {"search": search}})
    lines = str(err.value).splitlines()
    assert len(lines) == 2 and says in lines[1], lines


def test_the_dispatch_asks_the_method_named_and_a_grid_decides_nothing():
    g = SearchGroup("g", "rollout", (4, 8), (0,), C_MAX, fixed=16, key_min=2, key_max=64)
    pts = pd.DataFrame(columns=["group", "key", "run_id", "seed", "c", "avg_at_k"])  # no evaluations yet
    with pytest.raises(NotImplementedError, match="grid"):
        decide(pts, [g], empty_decisions(), SearchSettings(SearchParams(method="grid")))
    rows = decide(pts, [g], empty_decisions(), SearchSettings())
    assert list(rows.columns) == DECISION_COLUMNS and set(rows["action"]) == {"continue"}
