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


# ---------------------------------------------------------------------------
# the decision method's settling


def _decision_table(rows: dict, lead: int) -> pd.DataFrame:
    """A decision read at one budget (the columns :func:`rollscale.core.fit.decision.decide` gives), indexed by key:
    key -> (reward, d_hi); every run reached C* with 2 seeds and 12 evaluations."""
    t = pd.DataFrame([{"key": k, "reward": r, "reward_lo": r - 0.03, "reward_hi": r + 0.03, "d": d_hi - 0.04,
                       "d_lo": d_hi - 0.08, "d_hi": d_hi, "leader": lead, "leader_share": 0.9, "df": 3,
                       "unknown": False, "extrapolated": False, "evals": 12,
                       "settled_by": "tolerance" if k != lead and d_hi <= 0.02 else ""}
                      for k, (r, d_hi) in rows.items()])
    return t.set_index("key", drop=False)


# the group of the decision method's settling tests: n = 2, 4, 8, 2 seeds, C* = 20,000 within the data
DECIDING = SearchGroup("g", "rollout", (2, 4, 8), (0, 1), C_MAX, fixed=16, key_min=2, key_max=8)
DECIDING_SETTINGS = SearchSettings(SearchParams(method="decision", eta=1.41, alpha=0.3, seeds_min=2, seeds_max=3),
                                   DecisionParams(tolerance=0.02, target_budget=20_000))


def _stopped_at_rung_7(key: int) -> pd.DataFrame:
    """The ``search`` rows of a first decision (rung 7, 20,120 rollouts, n = 4 leading) that stopped ``key``."""
    return pd.DataFrame([{"group": "g", "decision": 0, "rung": 7, "c": 20_120.0, "key": str(k), "seed": seed,
                          "leader": "4", "action": "stop" if k == key else "continue",
                          "rule": "epsilon" if k == key else "none", "c_train": 20_120.0 if k == key else 28_369.0}
                         for k in (2, 4, 8) for seed in (0, 1)]).reindex(columns=DECISION_COLUMNS)


@pytest.mark.parametrize("d_hi_2, resumed", [(0.05, True), (-0.05, False)])
def test_the_decision_settles_a_stopped_key_against_the_final_leader_never_transitively(d_hi_2, resumed):
    """Science §11.3. n = 2 was stopped as settled against n = 4, the leader then; now n = 8 leads and n = 4 is
    settled against it. Transitively n = 2 is settled too (it is within epsilon of a key within epsilon of the
    leader); against the final leader its D's upper bound is +0.05 > epsilon: it is resumed and the group is not
    decided. Where its D to n = 8 is below epsilon the answer is n = 8 and n = 2 stays stopped."""
    from rollscale.core.search.methods.decision import decide_group
    from rollscale.core.search.standing import Standing

    g, s, first = DECIDING, DECIDING_SETTINGS, _stopped_at_rung_7(2)
    st = group_state(g, first, s)
    assert st.stopped == {2: 20_120.0} and st.rung == 8
    star = _decision_table({2: (0.55, d_hi_2), 4: (0.58, -0.03), 8: (0.62, 0.0)}, lead=8)
    rung = star.assign(d_hi=[-0.01, -0.01, 0.0])  # A2 at c_r settles nothing
    rows = pd.DataFrame(decide_group(g, st, Standing(star, rung, star, 0.2), s), columns=DECISION_COLUMNS)
    assert set(rows.loc[rows["key"] == "4", "rule"]) == {"epsilon"}
    if resumed:
        assert set(rows.loc[rows["key"] == "2", "action"]) == {"resume"}
        assert "decided" not in set(rows["rule"])
        assert "not settled against the answer 8" in rows.loc[rows["key"] == "2", "note"].iloc[0]
        after = group_state(g, pd.concat([first, rows], ignore_index=True), s)
        assert 2 not in after.stopped and after.rung == 9
    else:
        assert "2" not in set(rows["key"])
        assert set(rows.loc[rows["key"] == "8", "rule"]) == {"decided"}


def test_the_decision_resumes_a_stopped_key_that_leads_at_c_star():
    """Science §11.3: a stopped key never leads; the decision method resumes it, as the forecast's does."""
    from rollscale.core.search.methods.decision import decide_group
    from rollscale.core.search.standing import Standing

    st = group_state(DECIDING, _stopped_at_rung_7(8), DECIDING_SETTINGS)
    star = _decision_table({2: (0.50, -0.10), 4: (0.58, -0.03), 8: (0.62, 0.0)}, lead=8)
    rows = pd.DataFrame(decide_group(DECIDING, st, Standing(star, star, star, 0.2), DECIDING_SETTINGS),
                        columns=DECISION_COLUMNS)
    assert set(rows.loc[rows["key"] == "8", "action"]) == {"resume"} and "decided" not in set(rows["rule"])
