"""Frontier search (science §8): rungs, state, stop rules, bracket, seeds, determinism, on synthetic runs."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from rollscale.core.fit import curves as fit
from rollscale.core.fit.bootstrap import Bootstrap
from rollscale.core.fit.curve_bank import fit_curves
from rollscale.core.search.decisions import (
    DECISION_COLUMNS,
    SearchGroup,
    SearchSettings,
    a2_contradicted,
    bracket_limits,
    decide,
    empty_decisions,
    frontier_answer,
    group_state,
    leg_budget,
    plan,
    rung_budgets,
    run_budgets,
    truncate,
)

C_MAX = 40_000
EVERY = 5  # evaluation interval in steps


def _curve(c, r0, a, c_mid, beta):
    with np.errstate(divide="ignore"):
        return r0 + (a - r0) / (1 + (c_mid / np.maximum(c, 1e-9)) ** beta)


class Study:
    """Runs of one group whose true curves are ``curves[key]``; each seed shifts A a little, evaluations are
    a little noisy; a run trained to budget c has its evaluations every EVERY steps and at its last step."""

    def __init__(self, curves, fixed=16, seeds=(0, 1, 2), noise=0.004, axis="rollout"):
        self.curves, self.fixed, self.seeds, self.noise, self.axis = curves, fixed, seeds, noise, axis
        self.legs: dict[tuple, int] = {}

    def b(self, key):
        return key * self.fixed

    def train(self, todo):
        for key, seed, c in zip(todo["key"], todo["seed"], todo["c"], strict=True):
            steps = math.ceil(c / self.b(key) - 1e-9)
            self.legs[(key, seed)] = max(self.legs.get((key, seed), 0), steps)

    def points(self, group="g"):
        frames = []
        for (key, seed), last in sorted(self.legs.items()):
            rng = np.random.default_rng([key, seed])
            steps = np.arange(0, math.ceil(C_MAX / self.b(key)) + 1)
            c = steps * self.b(key)
            r0, a, c_mid, beta = self.curves[key]
            y = _curve(c, r0, a + 0.004 * (seed - 1), c_mid, beta) + rng.normal(0, self.noise, c.size)
            keep = np.union1d(np.arange(0, last + 1, EVERY), [last])
            frames.append(pd.DataFrame({"group": group, "key": key, "run_id": f"k{key}_s{seed}", "seed": seed,
                                        "c": c[keep].astype(float), "avg_at_k": y[keep], "b": float(self.b(key))}))
        return pd.concat(frames, ignore_index=True)


def _run(study, group, settings, cache=None):
    decisions = empty_decisions()
    while not (todo := plan([group], decisions, settings)).empty:
        study.train(todo)
        decisions = pd.concat([decisions, decide(study.points(), [group], decisions, settings, cache)],
                              ignore_index=True)
    return decisions


SETTINGS = SearchSettings(eta=2.0, alpha=0.4, resamples=60, eval_every=EVERY)


def _stops(decisions):
    s = decisions[decisions["action"] == "stop"].drop_duplicates("key")
    return dict(zip(s["key"], s["rule"], strict=True))


# ---------------------------------------------------------------------------
# bookkeeping


def test_rung_budgets_go_down_from_c_max_by_eta():
    assert rung_budgets(40_000, 2.0, 1 / 16) == (2500, 5000, 10000, 20000, 40000)
    assert rung_budgets(40_000, 2.0, 3000) == (5000, 10000, 20000, 40000)  # rollouts, not a fraction
    assert rung_budgets(40_000, 2.0, 1.0) == (40000,)
    assert rung_budgets(1000, 1.5, 0.3)[-1] == 1000
    with pytest.raises(ValueError, match="eta"):
        SearchSettings(eta=1.0)


def test_a_leg_ends_at_the_first_evaluation_past_the_rung():
    g = SearchGroup("g", "rollout", (4, 16), (0,), C_MAX, fixed=16)
    s = SearchSettings(eval_every=20)
    assert leg_budget(g, 16, 2500, s) == 5120  # 20 steps of B = 256
    assert leg_budget(g, 4, 2500, s) == 2560
    assert leg_budget(g, 16, C_MAX, s) == C_MAX  # every run ends at C_max and evaluates there
    assert leg_budget(g, 16, 2500, SearchSettings()) == 2500
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
# the batched fits are the fit stage's fits


def test_curve_bank_point_fits_match_fit_sigmoid():
    rng = np.random.default_rng(0)
    frames = []
    for i, (a, c_mid) in enumerate([(0.6, 5e3), (0.7, 2e4), (0.95, 3e5), (0.5, 2e3)]):  # one unbent
        for seed in range(3):
            c = np.arange(0, 40_001, 640.0)
            y = _curve(c, 0.37, a, c_mid, 1.5) + rng.normal(0, 0.02, c.size)
            frames.append(pd.DataFrame({"group": "g", "key": i, "run_id": f"{i}_{seed}", "seed": seed, "c": c,
                                        "avg_at_k": y}))
    pts = pd.concat(frames, ignore_index=True)
    bank = fit_curves(pts, 0.02, Bootstrap(30, 0), a_max=1.0)
    for i in range(4):
        g = pts[pts["key"] == i].sort_values(["run_id", "c"])
        rec = g[fit.record_flags(g["run_id"].to_numpy(), g["avg_at_k"].to_numpy(), 0.02) & (g["c"] > 0)]
        f = fit.fit_sigmoid(rec["c"].to_numpy(), rec["avg_at_k"].to_numpy(), a_max=1.0)
        x, y = np.log10(rec["c"].to_numpy()), rec["avg_at_k"].to_numpy()
        sse = lambda t: float(np.sum((fit.sigmoid_model(np.asarray(t), x) - y) ** 2))  # noqa: E731
        assert sse(bank.theta[i]) <= sse([f.r0, f.a - f.r0, f.log10_c_mid, f.beta]) * (1 + 1e-4)
        assert bank.curves["n_points"].iloc[i] == len(rec) and bank.curves["status"].iloc[i] == "ok"
        a = bank.refits[i, :, 0] + bank.refits[i, :, 1]  # a resample on too few distinct C has no refit: NaN
        assert np.isfinite(a).mean() > 0.5 and (a[np.isfinite(a)] <= 1 + 1e-9).all()
    # the cache hands back the same numbers
    cache: dict = {}
    first = fit_curves(pts, 0.02, Bootstrap(30, 0), a_max=1.0, cache=cache)
    again = fit_curves(pts, 0.02, Bootstrap(30, 0), a_max=1.0, cache=cache)
    assert np.array_equal(first.refits, bank.refits, equal_nan=True) and np.array_equal(again.theta, bank.theta)
    few = fit_curves(pts[pts["c"] <= 1280], 0.02, Bootstrap(5, 0))
    assert (few.curves["status"] != "ok").all() and np.isnan(few.theta).all()


# ---------------------------------------------------------------------------
# the rules


def test_rule_a_stops_n_below_the_leader_on_the_rollout_axis_only():
    curves = {2: (0.37, 0.45, 3000, 1.5), 4: (0.37, 0.55, 4000, 1.5), 8: (0.37, 0.75, 5000, 1.5)}
    g = SearchGroup("g", "rollout", (2, 4, 8), (0, 1, 2), C_MAX, fixed=16)
    d = _run(Study(curves), g, SETTINGS)
    stops = _stops(d)
    assert stops.get("2") == "a" and stops.get("4") == "a" and "8" not in stops
    row = d[(d["key"] == "2") & (d["action"] == "stop")].iloc[0]
    assert row["leader"] == "8" and row["margin_lo"] > 0 and row["c_train"] < C_MAX and row["n_points"] >= 8
    assert set(d["action"]) <= {"continue", "stop", "finish"} and list(d.columns) == DECISION_COLUMNS
    # the same curves along the prompt axis: no A2, so rule (a) never applies
    p = SearchGroup("g", "prompt", (2, 4, 8), (0, 1, 2), C_MAX, fixed=16)
    assert "a" not in set(_run(Study(curves), p, SETTINGS)["rule"])


def test_rule_b_stops_a_key_whose_asymptote_is_below_the_leader():
    # n = 16 bends early at a low asymptote while n = 4 climbs past it
    curves = {4: (0.37, 0.75, 4000, 1.5), 16: (0.37, 0.47, 1500, 2.0)}
    g = SearchGroup("g", "rollout", (4, 16), (0, 1, 2), C_MAX, fixed=16)
    d = _run(Study(curves), g, SETTINGS)
    assert _stops(d) == {"16": "b"}
    row = d[(d["key"] == "16") & (d["action"] == "stop")].iloc[0]
    assert row["a_hi"] < row["leader_lo"] and row["c"] < C_MAX / 2


def test_rule_c_stops_an_unbent_key_below_the_leader_where_the_fits_reach():
    # key 8 is still rising (A unidentified, up to 1) but stays far below key 4 up to C_max
    curves = {4: (0.37, 0.75, 4000, 1.5), 8: (0.37, 0.95, 1e5, 1.2)}
    g = SearchGroup("g", "prompt", (4, 8), (0, 1, 2), C_MAX, fixed=4)
    d = _run(Study(curves, fixed=4), g, SETTINGS)
    assert _stops(d) == {"8": "c"}
    row = d[(d["key"] == "8") & (d["action"] == "stop")].iloc[0]
    assert row["c"] == C_MAX / 2 and row["a_hi"] == pytest.approx(1.0)


def test_a_key_without_a_fit_is_never_stopped():
    g = SearchGroup("g", "rollout", (4, 8), (0, 1, 2), C_MAX, fixed=16)
    study = Study({4: (0.37, 0.75, 4000, 1.5), 8: (0.37, 0.4, 4000, 1.5)})
    d = decide(study.points() if study.legs else pd.DataFrame(columns=["group", "key", "run_id", "seed", "c",
                                                                        "avg_at_k"]), [g], empty_decisions(),
               SETTINGS)
    assert (d["action"] == "continue").all() and d["note"].str.contains("no fit").all()


def test_bracket_adds_the_key_beyond_a_winning_edge_within_its_limits():
    curves = {2: (0.37, 0.80, 3000, 1.5), 4: (0.37, 0.70, 4000, 1.5), 8: (0.37, 0.60, 6000, 1.5)}
    g = SearchGroup("g", "rollout", (4, 8), (0, 1, 2), C_MAX, fixed=16, key_min=2, key_max=64)
    d = _run(Study(curves), g, SETTINGS)
    add = d[d["action"] == "add"]
    assert set(add["key"]) == {"2"} and set(add["seed"]) == {0, 1, 2} and add["best_share"].ge(0.5).all()
    assert (d[(d["key"] == "2")]["action"] == "finish").any()  # it caught up and ran to C_max
    # at its lower limit nothing is added; rules have no bracket
    g = SearchGroup("g", "rollout", (4, 8), (0, 1, 2), C_MAX, fixed=16, key_min=4, key_max=64)
    assert not (_run(Study(curves), g, SETTINGS)["action"] == "add").any()


def test_undecided_last_rung_adds_a_seed_to_each_contender_up_to_the_cap():
    curves = {4: (0.37, 0.65, 4000, 1.5), 8: (0.37, 0.65, 4000, 1.5)}  # one true curve
    g = SearchGroup("g", "prompt", (4, 8), (0, 1, 2), C_MAX, fixed=4)
    study = Study(curves, fixed=4, noise=0.01)
    d = _run(study, g, SearchSettings(eta=2.0, alpha=0.4, resamples=60, eval_every=EVERY, extra_seeds=1))
    seeds = d[d["action"] == "seed"]
    assert set(seeds["key"]) == {"4", "8"} and set(seeds["seed"]) == {3} and (seeds["rule"] == "undecided").all()
    stopped = dict(zip(*(d.loc[d["action"] == "stop", c] for c in ("key", "c_train")), strict=False))
    # a new seed trains as far as its key did: C_max, or where the key stopped
    assert all(c == stopped.get(k, C_MAX) for k, c in zip(seeds["key"], seeds["c_train"], strict=True))
    assert {(4, 3), (8, 3)} <= set(study.legs)
    assert not (_run(Study(curves, fixed=4, noise=0.01), g, SETTINGS)["action"] == "seed").any()


def test_decisions_are_deterministic_and_a_rerun_resumes_to_the_same_rows():
    curves = {2: (0.37, 0.5, 3000, 1.5), 4: (0.37, 0.6, 4000, 1.5), 8: (0.37, 0.7, 8000, 1.5)}
    g = SearchGroup("g", "rollout", (2, 4, 8), (0, 1, 2), C_MAX, fixed=16)
    study = Study(curves)
    d = _run(study, g, SETTINGS)
    assert _run(Study(curves), g, SETTINGS, cache={}).equals(d)
    # a rerun on the stored runs (every run already at or past its budget) decides the same
    again = empty_decisions()
    while not plan([g], again, SETTINGS).empty:
        again = pd.concat([again, decide(study.points(), [g], again, SETTINGS)], ignore_index=True)
    assert again.equals(d)


def test_rules_axis_searches_over_rules_without_a_bracket():
    g = SearchGroup("r", "rule", ("pods", "uniform"), (0, 1, 2), C_MAX)
    frames = []
    for key, a in (("pods", 0.5), ("uniform", 0.7)):
        for seed in range(3):
            c = np.arange(0, 40_001, 320.0)
            frames.append(pd.DataFrame({"group": "r", "key": key, "run_id": f"{key}{seed}", "seed": seed, "c": c,
                                        "avg_at_k": _curve(c, 0.37, a + 0.004 * seed, 3000, 1.5)}))
    pts = pd.concat(frames, ignore_index=True)
    d = empty_decisions()
    while not plan([g], d, SETTINGS).empty:
        d = pd.concat([d, decide(pts, [g], d, SETTINGS)], ignore_index=True)
    assert _stops(d) == {"pods": "b"} and not (d["action"] == "add").any()
    answer = frontier_answer(pts, [g], SETTINGS)
    assert (answer["best_key"] == "uniform").all() and answer["a2_holds"].isna().all()


def test_a2_contradicted_flags_an_answer_below_a_rule_a_leader():
    d = pd.DataFrame([{"group": "g", "action": "stop", "rule": "a", "key": "2", "c": 5000.0, "leader": "8"}])
    assert a2_contradicted([3000, 20000], [8, 8], d, "g") is None
    msg = a2_contradicted([3000, 20000, 40000], [8, 8, 2], d, "g")
    assert msg is not None and "n = 2 was stopped at C = 5,000" in msg and "C = 40,000" in msg
    assert a2_contradicted([3000, 40000], [8, 2], d, "other") is None
