"""The search with forecasts (science §10.5, rollscale/core/search/methods/forecast.py): settles keys before C_max
at a C* past the data, adds no key beyond an edge that leads only by noise, and resumes to the same decisions.

The simulated studies are rollscale.core.search.simulate's (rollout axis, C_max 40,000, avg@16, the §9.1 schedule);
the search's refits are few (RESAMPLES) so that a whole study runs in seconds; benchmarks/search_budget.py
(--method forecast) measures the method per family with the default's refits (docs/benchmarks.md).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from rollscale.config import DecisionParams, SearchParams
from rollscale.core.search.decisions import decide
from rollscale.core.search.methods.forecast import RULES
from rollscale.core.search.simulate import make_studies
from rollscale.core.search.simulate_budget import simulate_decision
from rollscale.core.search.state import ACTIONS, DECISION_COLUMNS, SearchGroup, SearchSettings, empty_decisions, plan

RESAMPLES = 40
C_MAX = 40_000


def settings(method: str = "forecast", c_star: int = 4 * C_MAX) -> SearchSettings:
    return SearchSettings(SearchParams(method=method, eta=1.41, alpha=0.3, seeds_min=2, seeds_max=3,
                                       bootstrap_resamples=RESAMPLES),
                          DecisionParams(tolerance=0.02, target_budget=c_star), eval_draws=1600)


@pytest.fixture(scope="module")
def cross():
    """One ``cross`` study (n* rises from 2 to 16 by C* = 4 x C_max: n = 2 ends 0.1 below the best)."""
    studies = make_studies(1, seed=0, families=("cross",), seeds=(0, 1), schedule=(625.0, 4), eval_draws=1600)
    return studies, simulate_decision(studies, settings())


@pytest.mark.xfail(strict=True, reason="measured: under the default form (`recent_floor`, science §11.2) this `cross` "
                   "study is answered right but no key stays stopped before C_max (stopped_early 0): the "
                   "search trains every key to C_max, 2 x C* (under `decay` it was answered wrong). Open in issue 52")
def test_a_clearly_losing_key_is_settled_before_c_max_at_c_star_four_times_c_max(cross):
    _, result = cross
    d = result.decisions
    assert list(d.columns) == DECISION_COLUMNS
    assert set(d["action"]) <= set(ACTIONS) and set(d["rule"]) <= set(RULES)
    early = d[(d["action"] == "stop") & (d["c_train"] < C_MAX)]
    assert "2" in set(early["key"]) and set(early["rule"]) <= {"forecast", "cap"}
    assert (early["c_star"] == 4 * C_MAX).all()
    assert (early.loc[early["rule"] == "forecast", "d_hi"] <= 0.02).all()  # the bound behind each stop, in its row
    (row,) = result.studies.to_dict("records")
    assert row["right"] and row["stopped_early"] >= 2
    assert row["search_rollouts"] <= 2 * 4 * C_MAX  # science §10's cost: at most 2 x C*
    # the answer trained to C_max: its runs carry the forecast at C*
    last = d[d["decision"] == d["decision"].max()]
    assert (last.loc[last["key"] == str(row["answer"]), "c_train"] == C_MAX).all()


def test_a_rerun_resumes_to_the_same_decisions(cross):
    """The rows so far are the state (rollscale.core.search.state): cut after any decision, the loop goes on to the
    same rows, the refits seeded by the settings."""
    studies, result = cross
    from rollscale.core.search.simulate import Runs

    runs, groups, full = Runs(studies), [s.group() for s in studies], result.decisions
    legs = result.legs
    points = runs.points(legs)  # every run as far as the whole search trained it: decide reads each to its budget
    cut = int(full["decision"].max()) // 2
    decisions = full[full["decision"] <= cut].reset_index(drop=True)
    while not plan(groups, decisions, settings()).empty:
        decisions = pd.concat([decisions, decide(points, groups, decisions, settings())], ignore_index=True)
    pd.testing.assert_frame_equal(decisions, full.reset_index(drop=True), check_dtype=False)


def _flat_points(rng: np.random.Generator, c_top: float) -> pd.DataFrame:
    """Every key's runs within noise of one flat curve at 0.364 (issue 39: the default's evaluations at 2,561
    rollouts lay within 0.32-0.41), the last key by chance a little above."""
    rows = []
    for n in (2, 4, 8, 16):
        for seed in (0, 1):
            c = np.unique(np.concatenate([[0.0], np.geomspace(160, c_top, 14)]))
            mean = 0.364 + (0.012 if n == 16 else 0.0)
            y = rng.binomial(1600, mean, size=c.size) / 1600
            rows.append(pd.DataFrame({"group": "g", "key": n, "run_id": f"n{n}_s{seed}", "seed": seed, "c": c,
                                      "avg_at_k": y, "b": 16.0 * n}))
    return pd.concat(rows, ignore_index=True)


def test_no_key_is_added_beyond_an_edge_that_leads_only_by_noise():
    """Issue 39: §9.4's bracket added n = 32 at 2,561 rollouts on the default, every key within noise; here it adds
    32 on such points in 2 of 3 draws, the forecast's in none."""
    group = SearchGroup("g", "rollout", (2, 4, 8, 16), (0, 1), C_MAX, fixed=16, key_min=2, key_max=64)
    decision_adds = 0
    for seed in range(3):
        points = _flat_points(np.random.default_rng(seed), 2_561)
        rows = decide(points, [group], empty_decisions(), settings())
        assert not (rows["action"] == "add").any(), rows[["key", "action", "rule", "d_lo", "d_hi", "note"]]
        assert set(rows["action"]) == {"continue"}  # nothing settled on curves that have not left R0
        old = decide(points, [group], empty_decisions(), settings("decision", C_MAX))
        decision_adds += int((old["action"] == "add").any())
    assert decision_adds >= 1


def test_an_answer_whose_reward_at_c_star_is_unknown_gets_seeds_up_to_seeds_max(cross, monkeypatch):
    """Every other key settled, but the answer's reward at C* unknown (the default at 160,000: "unknown, in
    [0.48, 0.63]" with 2 seeds a key, 2026-11-27): at C_max the answer gets seeds, as a decision that hangs does, up
    to seeds_max (3 here); then it is the answer still, its reward uncertain (science §11.5): decided."""
    from rollscale.core.search.methods import forecast

    studies, known = cross
    answer = str(known.studies["answer"].iloc[0])
    assert answer not in set(known.decisions.loc[known.decisions["action"] == "seed", "key"])
    monkeypatch.setattr(forecast, "unknown_answer", lambda table, lead: "too wide")
    d = simulate_decision(studies, settings()).decisions
    mine = d[d["key"] == answer]
    seeds = mine[mine["action"] == "seed"]
    assert len(seeds) >= 1 and (seeds["rule"] == "undecided").all() and (seeds["c_train"] == C_MAX).all()
    assert seeds["note"].str.contains(f"the answer {answer}'s reward at C\\* = 160,000 is unknown \\(too wide\\)").all()
    assert set(mine["seed"]) == {0, 1, 2}  # seeds_max
    last = mine[mine["decision"] == mine["decision"].max()]
    assert set(last["action"]) == {"stop"} and set(last["rule"]) == {"decided"}, last[["seed", "action", "rule"]]


@pytest.mark.parametrize("width, seeds, seeded", [(0.153, 2, True), (0.14, 2, False), (0.248, 2, False),
                                                   (0.17, 3, True), (0.153, 1, False)])
def test_the_answer_gets_a_seed_only_where_one_is_expected_to_make_its_reward_known(width, seeds, seeded):
    """Wider than the widest answer (0.15), and narrow enough that one more seed is expected to bring it within
    (width x sqrt(seeds / (seeds + 1))): the default's 0.153 with 2 seeds, yes; simulated `cross` at 4 x C_max,
    0.248, no (its third seed left it 0.257). One seed a key has no spread to read."""
    from rollscale.core.search.methods.forecast import unknown_answer

    table = pd.DataFrame({"answer_width": [width], "seeds": [seeds]}, index=[2])
    assert (unknown_answer(table, 2) is not None) == seeded


def _standing(rows: dict[int, tuple[float, float, float, float, float, float]], lead: int,
              seen: float = C_MAX) -> pd.DataFrame:
    """A forecast at C* = 4 x C_max (key -> reward, lo, hi, d, d_lo, d_hi), every key trained on 2 seeds, 12
    evaluations, seen to ``seen`` rollouts (C_max, where the forecast settles keys)."""
    t = pd.DataFrame([{"key": k, "reward": r, "reward_lo": lo, "reward_hi": hi, "d": d, "d_lo": dl, "d_hi": dh,
                       "leader": lead, "leader_share": 0.9, "c_star": 4.0 * C_MAX, "trained": True, "seeds": 2,
                       "c_seen": seen, "evals": 12} for k, (r, lo, hi, d, dl, dh) in rows.items()])
    return t.set_index("key", drop=False)


NO_CAPS = pd.DataFrame({"key": [], "cannot_catch_up": []}).set_index("key")


def test_a_key_stops_only_below_the_leaders_lower_bound_minus_epsilon_and_a_stopped_key_never_leads():
    """Science §11.3: settled (D's upper bound <= epsilon) is not yet stopped: a key stops when its own upper bound
    at C* is below the leader's lower bound minus epsilon; a stopped key the forecast puts first, or says could beat
    the leader by more than epsilon, is resumed."""
    from rollscale.core.search.methods.forecast import forecast_verdicts

    t = _standing({2: (0.40, 0.36, 0.44, -0.20, -0.25, -0.15), 4: (0.58, 0.52, 0.63, -0.02, -0.06, 0.01),
                   8: (0.60, 0.55, 0.65, 0.0, 0.0, 0.0), 16: (0.62, 0.50, 0.75, 0.02, -0.05, 0.09)}, lead=8)
    reading = forecast_verdicts(t, NO_CAPS, [2, 4, 8], settings(), stopped=[16], c_max=C_MAX)
    assert reading.verdict[2][0] == "forecast"  # 0.44 < 0.55 - 0.02: it stops
    assert reading.verdict[4][0] is None and 4 in reading.held  # settled, but 0.63 is not below 0.53: trains on
    assert [k for k, _ in reading.resumed] == [16]  # stopped, and it could beat n = 8 by 0.09 > epsilon
    # the forecast's leader a stopped key: resumed, never the answer
    first = forecast_verdicts(t.assign(leader=16), NO_CAPS, [2, 4, 8], settings(), stopped=[16], c_max=C_MAX)
    assert [k for k, _ in first.resumed] == [16]


def test_the_forecast_settles_a_key_only_once_the_data_reach_c_max():
    """A forecast from fewer doublings has not seen a late winner rise: read from C* / 8 at C* = 4 x C_max it settled
    simulated `late_flip`'s before it rose, and from C* / 4 at C* = C_max `late`'s
    (docs/journal/2026-11-29-edge-hang.md). The forecast rule settles a key once its data and the leader's reach the
    group's C_max, at any C*."""
    from rollscale.core.search.methods.forecast import forecast_verdicts

    rows = {2: (0.40, 0.36, 0.44, -0.20, -0.25, -0.15), 8: (0.60, 0.55, 0.65, 0.0, 0.0, 0.0)}
    early = forecast_verdicts(_standing(rows, 8, seen=20_120.0), NO_CAPS, [2, 8], settings(), c_max=C_MAX)
    assert early.verdict[2][0] is None and "do not reach C_max" in early.verdict[2][1]
    at_c_max = forecast_verdicts(_standing(rows, 8, seen=C_MAX), NO_CAPS, [2, 8], settings(), c_max=C_MAX)
    assert at_c_max.verdict[2][0] == "forecast"
    # C* = C_max (160,000): the data at C* / 4 settle nothing; at C_max they do
    t = _standing(rows, 8, seen=C_MAX).assign(c_star=float(4 * C_MAX))
    assert forecast_verdicts(t, NO_CAPS, [2, 8], settings(), c_max=4 * C_MAX).verdict[2][0] is None
    assert forecast_verdicts(t.assign(c_seen=float(4 * C_MAX)), NO_CAPS, [2, 8], settings(),
                             c_max=4 * C_MAX).verdict[2][0] == "forecast"
    # a key the cap stopped at 10,000 is read against a leader whose data reach C_max: the forecast says it could
    # beat it by 0.09, so it is resumed (science §11.3; its own data do not grow while it is stopped)
    t = _standing({**rows, 16: (0.62, 0.50, 0.75, 0.02, -0.05, 0.09)}, 8, seen=C_MAX)
    t.loc[16, "c_seen"] = 10_000.0
    assert [k for k, _ in forecast_verdicts(t, NO_CAPS, [2, 8], settings(), stopped=[16],
                                            c_max=C_MAX).resumed] == [16]
    t.loc[8, "c_seen"] = 20_120.0  # the leader's data short of C_max: not read yet
    assert forecast_verdicts(t, NO_CAPS, [2, 8], settings(), stopped=[16], c_max=C_MAX).resumed == []


def test_at_c_star_twice_c_max_a_late_winner_is_not_settled_before_c_max():
    """At C* = 2 x C_max the forecast once settled keys from C_max / 2, where a late winner is still convex: the
    search stopped this `late_flip` study's n = 16, the best at C*, at 20,120 and answered n = 8 (0.11 short).
    Settling only at C_max, n = 16 trains to C_max and is the answer."""
    studies = make_studies(24, seed=1, families=("late_flip",), seeds=(0, 1), schedule=(625.0, 4), eval_draws=1600)
    result = simulate_decision([studies[15]], settings(c_star=2 * C_MAX))
    (row,) = result.studies.to_dict("records")
    assert row["answer"] == row["true_best"] == 16 and row["right"] and row["decided"], row
    stops = result.decisions[(result.decisions["action"] == "stop") & (result.decisions["rule"] == "forecast")]
    assert (stops["c_train"] == C_MAX).all(), row["stops"]


def test_a_resumed_key_trains_on_from_where_it_stopped_and_the_group_is_not_decided_meanwhile():
    """The rows of a decision that resumes a stopped key (action resume): no key is decided, the key leaves the
    stopped keys and trains to the next rung; at the last rung the rung is decided again."""
    from rollscale.core.search.methods.decision import group_rows
    from rollscale.core.search.state import group_state, run_budgets

    group = SearchGroup("g", "rollout", (2, 4, 8), (0, 1), C_MAX, fixed=16, key_min=2, key_max=8)
    s = settings()
    first = pd.DataFrame([{"group": "g", "decision": 0, "rung": 1, "c": 5_000.0, "key": str(k), "seed": seed,
                           "action": "stop" if k == 2 else "continue", "rule": "forecast" if k == 2 else "none",
                           "c_train": 5_000.0 if k == 2 else 10_000.0} for k in (2, 4, 8) for seed in (0, 1)],
                         columns=DECISION_COLUMNS)
    st = group_state(group, first, s)
    assert st.stopped == {2: 5_000.0}
    t = _standing({2: (0.62, 0.50, 0.75, 0.02, -0.05, 0.09), 4: (0.58, 0.52, 0.63, -0.02, -0.06, 0.01),
                   8: (0.60, 0.55, 0.65, 0.0, 0.0, 0.0)}, lead=8)
    rows = pd.DataFrame(group_rows(group, st, t, {4: ("forecast", "settled"), 8: (None, "leader at C*")}, [], s,
                                   leader_to_c_max=True, resumed=[(2, "could beat 8")]), columns=DECISION_COLUMNS)
    assert set(rows.loc[rows["key"] == "2", "action"]) == {"resume"}
    assert "decided" not in set(rows["rule"])
    both = pd.concat([first, rows], ignore_index=True)
    after = group_state(group, both, s)
    assert 2 not in after.stopped and after.rung == 3
    todo = run_budgets([group], both, s)
    assert not todo.loc[todo["key"] == 2, "stopped"].any() and (todo.loc[todo["key"] == 2, "c"] > 5_000.0).all()


@pytest.fixture(scope="module")
def late_and_close():
    """Two studies of each family where the best key overtakes late or two keys end close (science §11.1)."""
    studies = make_studies(2, seed=3, families=("late", "close"), seeds=(0, 1), schedule=(625.0, 4), eval_draws=1600)
    return studies, simulate_decision(studies, settings())


def test_the_searchs_verdict_is_the_reports_first_line_and_no_stopped_key_is_the_answer(late_and_close):
    """Science §11.5: the search, the fit stage and the report read one verdict. Per study the first line is made as
    the fit stage and the report make it (the decision table from the search's runs and its table): "Use n = X"
    exactly where the search decided, X the search's answer; the answer is never a key the search stopped (§11.3).
    benchmarks/verdict_agreement.py measures it per family (docs/journal/2026-11-28-verdict.md)."""
    from rollscale.core.search.simulate_budget import first_lines
    from rollscale.report.decision_text import decision_headline

    studies, result = late_and_close
    lines = first_lines(studies, result, settings(), decision_headline)
    assert lines["agree"].all(), lines[["group", "search_answer", "search_decided", "line"]]
    assert (lines["line_answered"] == lines["search_decided"]).all()
    assert not result.studies["stopped_answer"].any(), result.studies[["group", "answer", "stops"]]
    decided = lines[lines["search_decided"]]
    assert decided["line"].str.match(r"Use n = \d+ \(B_problem 16, M = [\d,]+ steps\) at C\* = 160,000 rollouts").all()


def test_the_search_forecasts_with_the_studys_form(monkeypatch):
    """The search's forecast reads ``study.forecast_form`` through the one constructor of the forecast's settings
    (science §11.5), as the fit stage and track do."""
    import rollscale.core.search.methods.forecast as method
    from rollscale.core.fit.verdict import forecast_settings
    from rollscale.core.search.state import group_state

    seen = []

    def spy(*args, **kwargs):
        seen.append(kwargs["form"])
        return forecast_settings(*args, **kwargs)

    monkeypatch.setattr(method, "forecast_settings", spy)
    group = SearchGroup("g", "rollout", (2, 4), (0, 1), C_MAX, fixed=16, key_min=2, key_max=8)
    s = SearchSettings(SearchParams(method="forecast", seeds_min=2, bootstrap_resamples=4),
                       DecisionParams(target_budget=4 * C_MAX, forecast_form="linear"), eval_draws=1600)
    c = np.array([0.0, 2_000.0, 4_000.0, 8_000.0, 16_000.0])
    points = pd.DataFrame([{"group": "g", "key": k, "seed": sd, "run_id": f"{k}_{sd}", "c": ci,
                            "avg_at_k": 0.3 + 0.05 * np.log2(1 + ci / 1_000) + 0.01 * sd + 0.02 * k / 4}
                           for k in (2, 4) for sd in (0, 1) for ci in c])
    method.forecast_standing(points, group, group_state(group, empty_decisions(), s), s)
    assert seen == ["linear"]


def test_seeds_where_the_decision_hangs_stay_within_spend_max_times_c_star():
    """Science §11's cost, at most 2 x C*: with every key of 2 seeds at C_max (8 runs, 2 x C* at C* = 4 x C_max),
    `spend_max: 2` adds no seed where n = 2 and 4 hang, and says so; 2.25 leaves room for one run (the leader's);
    null adds one each, up to seeds_max."""
    from rollscale.core.search.methods.decision import group_rows
    from rollscale.core.search.state import GroupState, rung_budgets

    group = SearchGroup("g", "rollout", (2, 4, 8, 16), (0, 1), C_MAX, fixed=16, key_min=2, key_max=64)
    budgets = rung_budgets(C_MAX, 1.41, 0.0625)
    st = GroupState((2, 4, 8, 16), {}, {k: (0, 1) for k in (2, 4, 8, 16)}, frozenset(), len(budgets), 8, budgets)
    table = pd.DataFrame({"key": [2, 4, 8, 16], "leader": 4, "leader_share": 0.6, "reward": [0.54, 0.545, 0.5, 0.47],
                          "reward_lo": 0.5, "reward_hi": 0.6, "d": [-0.005, 0, -0.045, -0.075],
                          "d_lo": [-0.03, 0, -0.07, -0.09], "d_hi": [0.029, 0, -0.01, -0.04], "evals": 30})
    verdict = {2: (None, "D's upper bound +0.029 > epsilon"), 4: (None, "leader at C*"), 8: ("forecast", "settled"),
               16: ("forecast", "settled")}

    def rows(spend_max: float | None) -> pd.DataFrame:
        s = SearchSettings(SearchParams(method="forecast", eta=1.41, alpha=0.3, seeds_min=2, seeds_max=4,
                                        spend_max=spend_max), DecisionParams(tolerance=0.02, target_budget=4 * C_MAX))
        return pd.DataFrame(group_rows(group, st, table.set_index("key", drop=False), verdict, [], s,
                                       leader_to_c_max=True))

    from rollscale.core.search.methods.forecast import Forecast

    # what `rollscale check` counts for a search that settles nothing early: 2 seeds each for two keys, or none
    assert [Forecast().seeds_added(group, SearchSettings(SearchParams(seeds_max=4, spend_max=m), DecisionParams(
        target_budget=4 * C_MAX))) for m in (None, 2.0, 2.25)] == [4, 0, 1]
    assert set(rows(None).query("action == 'seed'")["key"]) == {"2", "4"}
    assert list(rows(2.25).query("action == 'seed'")["key"]) == ["4"]
    capped = rows(2.0)
    assert not (capped["action"] == "seed").any()
    hung = capped[capped["key"].isin(["2", "4"])]
    assert set(hung["action"]) == {"finish"} and set(hung["rule"]) == {"undecided"}
    assert hung["note"].str.startswith("not decided at C* = 160,000 within the search's budget (sweep.search."
                                       "spend_max 2 x C* = 320,000 rollouts; a seed of 4 and 2 would pass it)").all()


def test_a_decision_that_hangs_with_its_leader_at_the_edge_tries_the_key_beyond_it_before_any_seed():
    """An optimum past the edge of the keys in play is what no seed of them can show. In this simulated
    `edge_high` study (C* = 4 x C_max) n = 8, the last key in play, led while n = 4 stayed open with 3 seeds, and the
    search ended undecided; n = 16, 0.08 better at C*, was never trained. Hanging at C_max with its leader at the
    edge, the search adds the key beyond it first (rule bracket), and answers it. Within sweep.search.spend_max only:
    where the key's seeds would pass it, nothing is added and the decision hangs, as it says."""
    from rollscale.core.search.methods.decision import group_rows
    from rollscale.core.search.state import GroupState, rung_budgets

    studies = make_studies(24, seed=1, families=("edge_high",), seeds=(0, 1), schedule=(625.0, 4), eval_draws=1600)
    result = simulate_decision([studies[16]], settings())
    (row,) = result.studies.to_dict("records")
    assert row["answer"] == row["true_best"] == 16 and row["right"] and row["decided"], row
    added = result.decisions.query("action == 'add' and key == '16'")
    assert not added.empty and added["note"].str.contains("the leader of a decision that hangs at C_max").all()

    budgets = rung_budgets(C_MAX, 1.41, 0.0625)
    table = pd.DataFrame({"key": [2, 4, 8], "leader": 8, "leader_share": 0.6, "reward": [0.50, 0.565, 0.57],
                          "reward_lo": 0.5, "reward_hi": 0.6, "d": [-0.07, -0.005, 0], "d_lo": [-0.1, -0.03, 0],
                          "d_hi": [-0.04, 0.025, 0], "evals": 30}).set_index("key", drop=False)
    verdict = {2: ("forecast", "settled"), 4: (None, "D's upper bound +0.025 > epsilon"), 8: (None, "leader at C*")}

    def rows(spend_max: float | None, key_max: int = 64, seeds: tuple[int, ...] = (0, 1)) -> pd.DataFrame:
        g = SearchGroup("g", "rollout", (2, 4, 8), seeds, C_MAX, fixed=16, key_min=2, key_max=key_max)
        st = GroupState((2, 4, 8), {}, {k: seeds for k in (2, 4, 8)}, frozenset(), len(budgets), 8, budgets)
        s = SearchSettings(SearchParams(method="forecast", eta=1.41, alpha=0.3, seeds_min=len(seeds), seeds_max=4,
                                        spend_max=spend_max), DecisionParams(tolerance=0.02, target_budget=4 * C_MAX))
        return pd.DataFrame(group_rows(g, st, table, verdict, [], s, leader_to_c_max=True,
                                       edge_answer=True))

    free = rows(None)
    assert list(free.query("action == 'add'")["key"].unique()) == ["16"]
    assert not (free["action"] == "seed").any() and "decided" not in set(free["rule"])
    assert set(rows(None, key_max=8).query("action == 'seed'")["key"]) == {"4", "8"}  # no key beyond: seeds
    assert list(rows(None, seeds=(0, 1, 2)).query("action == 'add'")["key"].unique()) == ["16"]  # three seeds too
    capped = rows(1.5)  # 6 runs to C_max are 1.5 x C*: no room for n = 16's two
    assert not capped["action"].isin(["add", "seed"]).any()
    assert set(capped.loc[capped["key"].isin(["4", "8"]), "rule"]) == {"undecided"}
