"""The decision at C* (science §9.2-9.4): shared R0, intervals that cover, leader / settled / unknown."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from rollscale.core.fit.analysis import run_evals
from rollscale.core.fit.decision import decide, fit_groups, fit_runs, shared_r0
from rollscale.core.search.simulate import grid_tables, make_studies


def _true(curve: tuple, c: float) -> float:
    r0, a, c_mid, beta = curve
    return r0 + (min(a, 1.0) - r0) / (1.0 + (c_mid / c) ** beta)


def _studies(per_family: int, seeds: int, seed: int):
    studies = [replace(s, seeds=tuple(range(seeds))) for s in make_studies(per_family, seed=seed)]
    runs, evals = grid_tables(studies)
    return studies, run_evals(runs, evals, None)


def _coverage(studies, ev, c_star_share: float = 1.0) -> tuple[float, int]:
    """Share of (study, key) whose 95 % interval at C* = C_max covers the key's true reward there."""
    curves = fit_groups(ev[ev["c"] <= ev["c_max"] * c_star_share], "n", "bucket")
    hits = []
    for s in studies:
        out = decide(curves[s.name], s.c_max, 0.02, 2.0, rollout_axis=True)
        known = out[~out["unknown"]]
        assert len(known) == len(out), "every key within eta of C* has an estimate"
        hits += [lo <= _true(s.curves[int(k)], s.c_max) <= hi
                 for k, lo, hi in zip(known["key"], known["reward_lo"], known["reward_hi"], strict=True)]
    return float(np.mean(hits)), len(hits)


@pytest.mark.parametrize("seeds", [2, 3])
def test_intervals_at_c_star_cover_the_true_reward(seeds):
    # the calibration of science §9.3: nominal 95 % intervals cover the truth in >= 90 % of simulated studies
    studies, ev = _studies(8, seeds, seed=11)
    coverage, count = _coverage(studies, ev)
    assert count == 40 * 4
    assert coverage >= 0.90, f"{seeds} seeds: coverage {coverage:.3f}"


def test_extrapolated_intervals_cover_too():
    # runs seen to 55 % of C*: every key extrapolated (within eta = 2), intervals still cover
    studies, ev = _studies(8, 3, seed=12)
    coverage, _ = _coverage(studies, ev, c_star_share=0.55)
    assert coverage >= 0.90, f"coverage {coverage:.3f}"


def test_one_r0_from_every_step0_evaluation():
    c = np.array([0, 100, 0, 100, 0])
    reward = np.array([0.3, 0.5, 0.4, 0.6, 0.5])
    r0, var, runs = shared_r0(c, reward, np.array(["a", "a", "b", "b", "c"]))
    assert (r0, runs) == (pytest.approx(0.4), 3)
    assert var == pytest.approx(0.01 / 3)
    assert math.isnan(shared_r0(c[[1, 3]], reward[[1, 3]], np.array(["a", "b"]))[0])


def test_every_run_fitted_at_the_shared_r0():
    studies, ev = _studies(1, 3, seed=3)
    curves = fit_runs(ev[ev["bucket"] == studies[0].name], "n")
    assert np.all(curves.theta[:, 0] == curves.r0)
    assert np.all(curves.theta[:, 0] + curves.theta[:, 1] <= 1.0 + 1e-12)  # A <= 1 for 0/1 rewards
    pred, _ = curves.predict(studies[0].c_max)
    truth = np.array([_true(studies[0].curves[k], studies[0].c_max) for k in curves.key])
    assert np.all(np.abs(pred - truth) < 0.1)


def test_beyond_eta_is_unknown_and_never_settled():
    studies, ev = _studies(1, 3, seed=5)
    name = studies[0].name
    part = ev[(ev["bucket"] == name) & ~((ev["n"] == 16) & (ev["c"] > 8000))]  # n = 16 seen to 8,000 only
    out = decide(fit_runs(part, "n"), 40_000, 0.02, 2.0).set_index("key")
    assert out.loc[16, "unknown"] and out.loc[16, "status"] == "unknown" and not out.loc[16, "settled"]
    assert math.isnan(out.loc[16, "reward"]) and out.loc[16, "reward_hi"] == 1.0
    assert not out["decided"].any()  # an unknown key cannot be settled: no decision
    assert not out.loc[4, "unknown"] and not out.loc[4, "extrapolated"]


def test_leader_settled_and_within_tolerance():
    # two identical true curves (tie family): the decision names one and keeps the other within a wide epsilon
    studies, ev = _studies(1, 3, seed=7)
    tie = next(s for s in studies if s.family == "tie")
    curves = fit_runs(ev[ev["bucket"] == tie.name], "n")
    out = decide(curves, tie.c_max, 0.2, 2.0).set_index("key")
    lead = int(out["leader"].iloc[0])
    assert lead in (4, 8) and out.loc[lead, "status"] == "leader" and out.loc[lead, "d"] == 0
    other = 8 if lead == 4 else 4
    assert out.loc[other, "within_tolerance"] and out.loc[other, "d_lo"] >= -0.2
    assert out["decided"].all()  # epsilon 0.2 is wider than every difference here
    narrow = decide(curves, tie.c_max, 1e-4, 2.0).set_index("key")
    assert narrow.loc[other, "status"] == "open" and not narrow["decided"].any()
    assert (narrow["d_hi"] >= narrow["d"]).all() and (narrow["d_lo"] <= narrow["d"]).all()


def test_the_decision_table_names_groups_keys_and_what_would_decide():
    from rollscale.core.fit.decision_table import DECISION_COLUMNS, decision_table

    studies, ev = _studies(1, 2, seed=3)
    table = decision_table(ev, 40_000, 0.02, 2.0)
    assert list(table.columns) == DECISION_COLUMNS and set(table["bucket"]) == {s.name for s in studies}
    assert (table.groupby("bucket")["status"].apply(lambda s: (s == "leader").sum()) == 1).all()
    assert (table["steps"] == np.ceil(40_000 / (table["n"] * 16))).all()
    assert ((table["to_decide"] == "") == table["decided"]).all()
    no_r0 = decision_table(ev[ev["c"] > 0], 40_000, 0.02, 2.0)
    assert no_r0["r0"].isna().all() and no_r0["to_decide"].str.startswith("no run has a step-0 evaluation").all()


def test_an_unknown_key_names_the_runs_that_stopped_short_or_the_budget():
    """The fix for a key beyond eta x its data (science §9.3): where the budget reached C* / eta (a search
    stopped the key's runs early), train those runs on, not a larger c_max the study already has."""
    from rollscale.core.fit.decision_table import to_decide

    rows = pd.DataFrame({"key": [4, 8, 16], "status": ["leader", "unknown", "unknown"], "decided": False,
                         "settled": False, "unknown": [False, True, True], "r0": 0.37,
                         "c_seen": [40_000.0, 10_000.0, 15_000.0]})
    said = to_decide(rows, 40_000, 2.0)
    assert said.startswith("train key 8 (its runs reached C = 10,000), 16 (its runs reached C = 15,000) on to "
                           "C >= 20,000"), said
    assert "sweep.c_max" not in said
    short = rows.assign(c_seen=[10_000.0, 10_000.0, 10_000.0])  # no run reached C* / eta: the budget is short
    assert to_decide(short, 40_000, 2.0).startswith("sweep.c_max >= 20,000 (C* / eta) for every key")


def test_runs_that_did_not_learn_keep_their_evaluation_noise_in_the_interval():
    """Issue 32's --hours 1 SmolLM2 study: no run learned, every run fitted flat at the shared R0, so the seeds'
    spread at C* was 0 and n = 2's reward read 0.56 [0.56, 0.57] on avg@4 over 4 problems (SE 0.125), D [-0.01,
    0.01], and the search settled n = 4 by epsilon. The runs' own evaluation noise is a floor (science §9.3)."""
    rng = np.random.default_rng(0)
    rows = []
    for key in (2, 4):
        for seed in (0, 1):
            c = np.concatenate([[0.0], np.geomspace(4, 100, 20)])
            y = rng.binomial(16, 0.45, size=c.size) / 16  # avg@4 over 4 problems: no run rises above R0
            y[0] = 0.5625  # one base model: the same step-0 evaluation for every run
            rows.append(pd.DataFrame({"run_id": f"n{key}_s{seed}", "n": key, "c": c, "avg_at_k": y}))
    curves = fit_runs(pd.concat(rows, ignore_index=True), "n")
    out = decide(curves, 100.0, 0.02, 1.41, rollout_axis=True).set_index("key")
    floor = 0.12 / math.sqrt(20 * 2)  # about the noise of a level read from 20 evaluations of 2 seeds
    assert (out["reward_hi"] - out["reward_lo"] > 2 * floor).all(), out[["reward", "reward_lo", "reward_hi"]]
    other = out.index[out["status"] != "leader"][0]
    assert not out.loc[other, "settled"] and out.loc[other, "d_hi"] > 0.02


def test_the_searchs_bounds_stand_beside_this_tables_d_only_where_they_hold_it():
    """Issue 43: a key the search settled on its forecast (a flat surface: D in [0, 0]) while this table's own D
    was 0.27 showed "D = 0.27 [0.00, 0.00]". Bounds that exclude the point are not shown with it: the table keeps
    its own, and the search's verdict stays in settled_by."""
    from rollscale.core.fit.decision_table import SearchVerdict, with_search

    rows = pd.DataFrame({"key": [2, 4, 8], "leader": 2, "d": [0.0, 0.27, -0.01], "d_lo": [0.0, -0.3, -0.05],
                         "d_hi": [0.0, 0.8, 0.03], "settled": False, "settled_by": "", "within_tolerance": False,
                         "unknown": False, "decided": False, "status": "open"})
    verdict = SearchVerdict(2, {4: ("forecast", 71.0, 0.0, 0.0), 8: ("forecast", 71.0, -0.04, 0.01)})
    out = with_search(rows, verdict, 0.02).set_index("key")
    assert out.loc[4, ["d", "d_lo", "d_hi"]].tolist() == [0.27, -0.3, 0.8]  # its own: the search's exclude 0.27
    assert out.loc[8, ["d_lo", "d_hi"]].tolist() == [-0.04, 0.01]  # the search's hold -0.01: shown
    assert out.loc[4, "settled_by"] == "search: forecast" and bool(out["decided"].iloc[0])


def test_d_stays_within_what_a_difference_of_rewards_can_be():
    """Issue 43: two seeds a key that disagree wholly (one flat at 0.2, one climbing to 0.95) gave the SmolLM2 hour
    study "D = 0.27 [-1.13, 1.67]"; a difference of two rewards in [0, 1] lies in [-1, 1], and so do its bounds."""
    c = np.array([0.0, 8, 16, 24, 32, 48, 64, 80, 100])
    rows = []
    for n, climb in ((2, (0.2, 0.2)), (4, (0.2, 0.95))):
        for seed, top in enumerate(climb):
            reward = 0.2 + (top - 0.2) * c / c.max()
            rows += [{"run_id": f"n{n}s{seed}", "bucket": "easy", "rule": "uniform", "seed": seed, "c_max": 100,
                      "n": n, "b_problem": 2, "b": 2 * n, "step": int(ci // (2 * n)), "c": ci, "epochs": 0.0,
                      "avg_at_k": r} for ci, r in zip(c, reward, strict=True)]
    out = decide(fit_runs(pd.DataFrame(rows), "n"), 100, 0.02, 2.0)
    assert (out["d_lo"] >= -1.0).all() and (out["d_hi"] <= 1.0).all(), out[["key", "d", "d_lo", "d_hi"]]
    assert (out["d_hi"] - out["d_lo"]).max() > 1.0  # wide: the clip, not a narrow interval, keeps it in range
