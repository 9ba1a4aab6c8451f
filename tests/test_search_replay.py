"""Replay of a finished grid through the frontier search (science §8), on synthetic sweep tables."""

from __future__ import annotations

import numpy as np
import pandas as pd

from rollscale.core.search.decisions import SearchSettings
from rollscale.core.search.replay import replay
from rollscale.core.search.simulate import grid_tables, make_studies, simulate

SETTINGS = SearchSettings(eval_every=20)


def test_replaying_a_simulated_grid_decides_and_spends_as_the_simulated_search():
    studies = make_studies(1, seed=3)  # one study per family
    runs, evals = grid_tables(studies)
    start = {f"n:bucket={s.name}/rule=uniform/b_problem=16": s.keys for s in studies}
    res = replay(runs, evals, "n", SETTINGS, b_max=256, start_keys=start)
    sim = simulate(studies, SETTINGS)
    spent = res.summary.set_index(res.summary["group"].str.extract(r"bucket=([^/]+)")[0])["spent"]
    np.testing.assert_allclose(spent[sim.studies["group"]].to_numpy(), sim.studies["spent"].to_numpy())
    cols = ["decision", "rung", "key", "seed", "action", "rule", "c_train"]
    for s in studies:
        mine = res.decisions[res.decisions["group"].str.contains(f"bucket={s.name}/")][cols].reset_index(drop=True)
        theirs = sim.decisions[sim.decisions["group"] == s.name][cols].reset_index(drop=True)
        pd.testing.assert_frame_equal(mine, theirs, check_dtype=False)
    # edge families: the bracket's key is in this grid; the answers match where the grid decides
    row = res.summary.set_index("group").loc["n:bucket=edge_low-0/rule=uniform/b_problem=16"]
    assert row["adds_in_grid"] == "2" and row["would_add_not_in_grid"] == ""
    assert (res.summary["agree"].dropna() >= 0.9).all()
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
            step = np.arange(0, 313, 5)
            c = step * 128.0
            y = 0.37 + (a + 0.004 * seed - 0.37) / (1 + (4000 / np.maximum(c, 1e-9)) ** 1.5)
            evals.append(pd.DataFrame({"run_id": rid, "step": step, "c": c, "avg_at_k": y}))
    res = replay(pd.DataFrame(rows), pd.concat(evals), "rule", SearchSettings(eval_every=5))
    (row,) = res.summary.to_dict("records")
    assert row["keys"] == "dynamic, pods, uniform" and "pods at" in row["stops"]
    assert row["would_add_not_in_grid"] == "" and row["spent"] < 1.0
