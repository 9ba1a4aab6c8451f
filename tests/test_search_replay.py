"""Replay of a finished grid through the sweep's search (science §9.4), on synthetic sweep tables."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from rollscale.core.fit.analysis import run_evals
from rollscale.core.fit.decision_table import decision_table
from rollscale.core.search.agreement import AGREEMENT_COLUMNS, decision_agreement, truncated
from rollscale.config import SearchParams
from rollscale.core.search.replay import replay
from rollscale.core.search.simulate import grid_tables, make_studies
from rollscale.core.search.simulate_budget import simulate_decision
from rollscale.core.search.state import SearchSettings

DECISION = SearchParams(method="decision")  # science §9.4's search: its bracket and rules are what these tests read
SETTINGS = SearchSettings(DECISION, eval_every=20)


def test_replaying_a_simulated_grid_decides_as_the_simulated_search():
    """The replay and the simulation go through the same dispatch: the same decisions on the same runs."""
    studies = make_studies(1, seed=3, families=("cross", "edge_low"), seeds=(0, 1))  # keys start with 2 seeds
    runs, evals = grid_tables(studies)
    start = {f"n:bucket={s.name}/rule=uniform/b_problem=16": s.keys for s in studies}
    settings = SearchSettings(SearchParams(method="decision", seeds_max=2), eval_every=20)
    res = replay(runs, evals, "n", settings, b_max=256, start_keys=start)
    sim = simulate_decision(studies, settings)
    cols = ["decision", "rung", "key", "seed", "action", "rule", "c_train"]
    for s in studies:
        mine = res.decisions[res.decisions["group"].str.contains(f"bucket={s.name}/")][cols].reset_index(drop=True)
        theirs = sim.decisions[sim.decisions["group"] == s.name][cols].reset_index(drop=True)
        pd.testing.assert_frame_equal(mine, theirs, check_dtype=False)
    # edge_low: the bracket's key is in this grid
    row = res.summary.set_index("group").loc["n:bucket=edge_low-0/rule=uniform/b_problem=16"]
    assert row["adds_in_grid"] == "2" and row["would_add_not_in_grid"] == ""
    assert (res.runs["search_c"] <= res.runs["grid_c"]).all()


def test_a_key_the_grid_lacks_is_reported_and_costs_nothing():
    studies = [s for s in make_studies(1, seed=3) if s.family == "edge_low"]
    runs, evals = grid_tables(studies)
    keep = runs[runs["n"] != 2]  # the grid never trained n = 2: the bracket would add it
    res = replay(keep, evals[evals["run_id"].isin(keep["run_id"])], "n", SETTINGS, b_max=256)
    (row,) = res.summary.to_dict("records")
    assert row["would_add_not_in_grid"] == "2" and row["adds_in_grid"] == ""
    assert set(res.runs["key"]) == {4, 8, 16} and row["search_rollouts"] < row["grid_rollouts"]
    added = res.decisions[res.decisions["key"] == "2"]
    assert (added["action"].isin(["add", "continue", "finish"])).all()  # never stopped: it has no points


def test_replay_of_rules_compares_rules_at_fixed_n_and_b_problem():
    rows, evals = [], []
    for rule, a in (("uniform", 0.7), ("pods", 0.5), ("dynamic", 0.68)):
        for seed in range(3):
            rid = f"np16_nr8_{rule}_s{seed}"
            rows.append({"run_id": rid, "bucket": "easy", "rule": rule, "n": 8, "b_problem": 16, "seed": seed,
                         "c_max": 40_000, "status": "finished"})
            step = np.append(np.arange(0, 313, 5), 313)  # a run evaluates at its last step, C >= C_max
            c = step * 128.0
            y = 0.37 + (a + 0.004 * seed - 0.37) / (1 + (4000 / np.maximum(c, 1e-9)) ** 1.5)
            evals.append(pd.DataFrame({"run_id": rid, "step": step, "c": c, "avg_at_k": y}))
    res = replay(pd.DataFrame(rows), pd.concat(evals), "rule", SearchSettings(DECISION, eval_every=5))
    (row,) = res.summary.to_dict("records")
    assert row["keys"] == "dynamic, pods, uniform" and "pods at C = 40,000 (epsilon)" in row["stops"]
    assert row["would_add_not_in_grid"] == "" and row["search_leader"] == "uniform" and row["search_decided"]


def test_a_grid_truncated_keeps_each_run_to_the_step_that_crosses_the_budget():
    """Issue 28, part 6: a run cut at a budget keeps its evaluations up to it and the one that crosses it
    within one step (the run stops at the first step with C >= budget and evaluates there), never one farther."""
    ev = pd.DataFrame({"run_id": ["a"] * 5 + ["b"] * 4, "seed": 0, "n": [2] * 5 + [16] * 4, "b_problem": 16,
                       "b": [32] * 5 + [256] * 4, "c": [0, 320, 640, 672, 1280, 0, 256, 512, 1536],
                       "avg_at_k": 0.4})
    kept = truncated(ev, 650)
    assert list(kept.columns) == list(ev.columns)
    # a: 672 crosses 650 within its step of 32 rollouts; b: 1536 is past 650 by more than its step of 256
    assert kept.groupby("run_id")["c"].apply(list).to_dict() == {"a": [0, 320, 640, 672], "b": [0, 256, 512]}
    assert truncated(ev, 10_000).equals(ev.reset_index(drop=True))
    with pytest.raises(ValueError, match="budget"):
        truncated(ev, 0)


def test_the_decision_at_c_star_on_a_truncated_grid_against_the_full_grid():
    """Issue 28, part 6 on a simulated grid (one a2 study: n = 2 wins clearly; 3 seeds; evaluations on the shared
    schedule of science §9.1): the full grid agrees with itself; cut at C_max / 2 every key is extrapolated and
    still read (eta 2), the leader the same; cut at C_max / 4 every key is unknown, and with eta 4 read again."""
    studies = make_studies(1, seed=3, families=("a2",), schedule=(625.0, 4))
    runs, evals = grid_tables(studies)
    ev = run_evals(runs, evals)
    same = decision_agreement(ev, ev, 40_000, 0.02, 2.0, resamples=50)
    (row,) = same.to_dict("records")
    assert list(same.columns) == AGREEMENT_COLUMNS and row["leader"] == row["grid_leader"] == 2
    assert row["same_leader"] and row["within_grid"] and row["gap_within"] and row["covers_grid"] and row["grid_gap"] == 0
    assert not row["extrapolated"] and row["decided"] and row["settled"] == "4, 8, 16"
    (half,) = decision_agreement(ev, truncated(ev, 20_000), 40_000, 0.02, 2.0, resamples=50).to_dict("records")
    assert half["extrapolated"] and half["unknown"] == "" and half["same_leader"]
    assert 20_000 <= half["c_seen"] < 20_000 + 16 * 16  # n = 16's run crossed 20,000 within its step of 256
    quarter_ev = truncated(ev, 10_000)
    (quarter,) = decision_agreement(ev, quarter_ev, 40_000, 0.02, 2.0, resamples=50).to_dict("records")
    assert quarter["leader"] is None and quarter["unknown"] == "2, 4, 8, 16"
    assert not (quarter["same_leader"] or quarter["within_grid"] or quarter["gap_within"] or quarter["covers_grid"])
    (far,) = decision_agreement(ev, quarter_ev, 40_000, 0.02, 4.0, resamples=50).to_dict("records")
    assert far["unknown"] == "" and far["extrapolated"] and far["leader"] is not None
    # without the grid's leader's runs another key leads: the grid's D of it is its gap to the grid's leader
    (other,) = decision_agreement(ev, ev[ev["n"] != 2], 40_000, 0.02, 2.0, resamples=50).to_dict("records")
    full = decision_table(ev, 40_000, 0.02, 2.0, 50).set_index("key")
    assert other["leader"] != 2 and other["grid_gap"] == full.loc[other["leader"], "d"] < -0.02
    assert not (other["same_leader"] or other["within_grid"] or other["gap_within"])


def test_replaying_the_decision_search_starts_with_seeds_min_and_keeps_what_it_trained():
    """Issue 29, part 3: the §9.4 search replayed from 2 of the grid's 3 seeds: its answer in the summary, the
    third seed's runs unused unless a seed decision asks for them, and the grid's evaluations the search kept
    (what the fit stage would read) no more than it trained, decided at C* against the grid's."""
    studies = make_studies(1, seed=3, families=("a2",), schedule=(625.0, 4))
    runs, evals = grid_tables(studies)
    settings = SearchSettings(SearchParams(method="decision", seeds_min=2, seeds_max=3))
    res = replay(runs, evals, "n", settings, b_max=256)
    (row,) = res.summary.to_dict("records")
    assert row["search_decided"] and row["search_leader"] == "2" and row["spent"] < 1.0
    asked = set(res.decisions.loc[res.decisions["action"] == "seed", "key"].astype(int))
    third = res.runs[res.runs["seed"] == 2]
    assert ((third["search_c"] > 0) == third["key"].isin(asked)).all()
    kept = res.evals.groupby("run_id")["c"].max()
    trained = res.runs.set_index(res.runs["run_id"].astype(str))["search_c"]
    assert (kept == trained[kept.index]).all() and len(kept) == (trained > 0).sum()
    (agree,) = decision_agreement(run_evals(runs, evals), res.evals, 40_000, 0.02, 2.0, resamples=50).to_dict("records")
    assert agree["grid_leader"] == agree["leader"] == 2 and agree["same_leader"] and agree["gap_within"]
