"""The search of science §9.4 (rollscale/core/search/methods/decision.py): per simulated family, the key it names at C*
against the true curves, and the rollouts it spends against the grid's (every key, seeds_max seeds, to C_max).

The simulation (rollscale.core.search.simulate_budget) runs every study through the same plan / decide loop
as the sweep, method "decision", eta 1.41, alpha 0.3, epsilon 0.02, 4 seeds at most, evaluations on the sweep's
§9.1 schedule: with 1 seed a key to start (the embedded default, params.yaml) at avg@16, with 2 at avg@4. 40
studies per family take minutes on this 2-core machine, so the test runs a fixed subsample (PER_FAMILY per
family); benchmarks/search_budget.py runs 40 per family (docs/benchmarks.md has the per-family tables).

Two validation noises. With avg@16 over 100 problems (the embedded default's `sweep.eval_k: 16`) the issue's
targets hold in every A2 family: right in >= 95 % of studies (40 per family: 95-100 %), median spent <= 50 %.
With avg@4 (the old default) no search can meet them: the grid the search saves (every key, 4 seeds, to C_max)
is itself right in only 90-95 % of `edge_low` and `cross` studies, its runs' fitted rewards at C* being off by
as much as the seeds differ; there the test asks the search to be right as often as that grid, give or take
one study per family.
"""

from __future__ import annotations

import pandas as pd
import pytest

from rollscale.config import DecisionParams, SearchParams, parse_params
from rollscale.core.search.methods.decision import RULES
from rollscale.core.search.state import ACTIONS, DECISION_COLUMNS, SearchSettings
from rollscale.core.search.simulate import FAMILIES, MORE_FAMILIES, grid_tables, make_studies
from rollscale.core.search.simulate_budget import simulate_decision, summarise_decision
from rollscale.sweep.groups import search_plan, search_settings

PER_FAMILY = 8
ALL = tuple(FAMILIES) + tuple(MORE_FAMILIES)
SETTINGS = SearchSettings(SearchParams(method="decision", eta=1.41, alpha=0.3, seeds_max=4), DecisionParams(tolerance=0.02))
AVG16, AVG4 = 1600, 400  # samples behind one evaluation: avg@16 (the default's eval_k) or avg@4 over 100 problems


@pytest.fixture(scope="module")
def studies():
    # one seed a key to start (the embedded default's seeds_min 1); seeds go where the decision hangs
    return make_studies(PER_FAMILY, seed=0, families=ALL, seeds=(0,), schedule=(625.0, 4), eval_draws=AVG16)


@pytest.fixture(scope="module")
def result(studies):
    return simulate_decision(studies, SETTINGS, grid=True)


@pytest.fixture(scope="module")
def studies_avg4():
    # two seeds a key to start: the rungs' stops (A2, epsilon) have a seed spread to read from the first rung
    return make_studies(PER_FAMILY, seed=0, families=ALL, seeds=(0, 1), schedule=(625.0, 4), eval_draws=AVG4)


@pytest.fixture(scope="module")
def result_avg4(studies_avg4):
    return simulate_decision(studies_avg4, SETTINGS, grid=True)


def test_every_study_ends_decided_or_says_why_not_with_every_row_in_the_search_tables_words(result):
    d = result.decisions
    assert list(d.columns) == DECISION_COLUMNS
    assert set(d["action"]) <= set(ACTIONS) and set(d["rule"]) <= set(RULES)
    for group, rows in d.groupby("group"):
        last = rows[rows["decision"] == rows["decision"].max()]
        # done: every key stopped (the leader as decided), or the last rung finished not decided at the seed cap
        assert (last["action"] == "stop").all() or (last["rule"] == "undecided").all(), group
        stops = rows[rows["action"] == "stop"]
        assert (stops["c_star"] == 40_000).all() and stops["leader"].notna().all()
        eps = stops[stops["rule"] == "epsilon"]
        assert (eps["d_hi"] <= SETTINGS.tolerance).all()  # the bound behind each stop is in its row


def test_where_a2_holds_the_answer_is_within_epsilon_of_the_true_best_at_c_star(result):
    table = summarise_decision(result)
    holds = table.drop(index="all")
    holds = holds[holds["a2_holds"].astype(bool)]
    assert set(holds.index) == set(ALL) - {"a2"}
    # the target, 95 % in every A2 family, is measured on 40 studies per family (95-100 %,
    # docs/benchmarks.md); 8 studies resolve it only to one study: at most one miss a family (this subsample:
    # 7 of 8 in edge_high, 8 of 8 elsewhere), and >= 95 % over the 56 studies of the A2 families
    s = result.studies
    assert (holds["right"] >= 1 - 1 / PER_FAMILY - 1e-9).all(), holds[["right", "grid_right", "mean_regret"]]
    assert s.loc[s["family"].isin(list(holds.index)), "right"].mean() >= 0.95
    assert table.loc["a2", "right"] >= 0.95  # one seed a key stops nothing at a rung: no A2 stop to go wrong


def test_with_one_seed_a_key_nothing_is_stopped_before_the_seeds_that_give_a_spread(result):
    """Science §9.3-9.4 with seeds_min 1: no seed spread, so no bound and no stop at a rung; at C_max the seeds go
    to the leader and the key closest to it, and their spread, pooled, settles the keys of one seed too."""
    d = result.decisions
    for group, rows in d.groupby("group"):
        first_seed = rows.loc[rows["action"] == "seed", "decision"].min()
        assert (rows.loc[rows["action"] == "seed", "c"] == 40_000).all(), group
        stops = rows[rows["action"] == "stop"]
        assert (stops["decision"] > first_seed).all(), group  # every stop read the added seeds' spread
        firsts = rows[rows["decision"] == first_seed]
        assert (firsts.loc[firsts["action"] == "seed", "rule"] == "undecided").sum() == 2, group
    assert summarise_decision(result).loc["all", "median_spent"] <= 0.40  # issue 29's target for the default


def test_with_two_seeds_the_rungs_a2_stops_drop_the_small_n_that_wins_where_a2_fails(result_avg4):
    # A2 violated (n* falls): the rung's A2 stops drop the small n that wins later; the test says so (one seed a
    # key stops nothing at a rung, so the default is right there: the test above). Where the stopped n then leads at
    # C* it is resumed (a stopped key never leads, science §11.3); where the answer beats it where both ran, A2
    # settles it against that answer, and A2 is what fails here
    table = summarise_decision(result_avg4)
    assert table.loc["a2", "right"] < 0.5 <= table.loc["a2", "grid_right"]
    d = result_avg4.decisions
    assert (d.loc[d["group"].str.startswith("a2-"), "action"] == "resume").any()


def test_with_avg4_evaluations_the_search_is_right_as_often_as_the_grid_it_saves(result_avg4):
    table = summarise_decision(result_avg4).drop(index="all")
    holds = table[table["a2_holds"].astype(bool)]
    # one study per family of slack: the grid of 4 seeds misses too (40 per family: 90 % in edge_low)
    assert (holds["right"] >= holds["grid_right"] - 1 / PER_FAMILY - 1e-9).all(), holds[["right", "grid_right"]]
    assert holds["right"].mean() >= 0.95


@pytest.mark.parametrize("which", ["result", "result_avg4"])
def test_the_search_spends_at_most_half_the_grids_rollouts_and_three_quarters_in_every_family(which, request):
    result = request.getfixturevalue(which)
    table = summarise_decision(result)
    assert table.loc["all", "median_spent"] <= 0.5, table["median_spent"]
    assert (table["median_spent"] <= 0.75).all(), table["median_spent"]
    assert (result.studies["spent"] <= 1.0 + 1e-9).all()


def test_the_bracket_adds_the_key_beyond_a_winning_edge(result):
    added = result.studies.set_index("family")["added"]
    assert (added["edge_low"] == "2").mean() >= 0.75 and (added["edge_high"] == "16").mean() >= 0.75


def test_sweep_search_method_decision_starts_keys_with_seeds_min_and_shares_epsilon_with_the_study():
    params = parse_params({"sweep": {"design": "rollout_axis", "n": [2, 4, 8], "seeds": [0, 1, 2, 3],
                                     "search": {"method": "decision", "seeds_min": 2}},
                           "study": {"tolerance": 0.03, "target_budget": 30_000}})
    (g,) = search_plan(params.sweep).groups
    s = search_settings(params.sweep, params.study)
    assert g.seeds == (0, 1) and (s.method, s.seeds_max, s.tolerance, s.target_budget) == ("decision", 4, 0.03,
                                                                                             30_000)
    grid = parse_params({"sweep": {"search": {"method": "grid"}}}).sweep
    assert search_settings(grid).method == "grid" and search_plan(grid).groups[0].seeds == (0, 1, 2)


def test_the_same_runs_give_the_same_decisions_so_a_rerun_resumes_to_them():
    studies = make_studies(1, seed=3, families=("cross", "edge_low"), seeds=(0, 1), schedule=(625.0, 4),
                           eval_draws=AVG4)
    first, again = simulate_decision(studies, SETTINGS), simulate_decision(studies, SETTINGS)
    assert len(first.decisions) and first.decisions.equals(again.decisions)


def test_the_fit_stages_decision_agrees_with_the_search_on_the_runs_it_trained(studies_avg4, result_avg4):
    """One decision (science §9.4): the fit stage reads the search's runs, each to where it stopped, with the search
    table; a key the search settled at a rung is settled there too (with that rung's budget), though its runs stop
    short of C* / eta, and a group the search decided has the search's answer as its leader, decided."""
    from rollscale.core.fit.analysis import run_evals
    from rollscale.core.fit.decision_table import decision_table

    # two seeds a key, so that keys stop at rungs short of C*; 4 per family: 32 studies' runs, twice, in seconds
    studies, result = studies_avg4[::2], result_avg4
    names = {s.name for s in studies}
    runs, evals = grid_tables(studies, {run: ends for run, ends in result.legs.items() if run[0] in names})
    # the sweep names a rollout-axis group by what it holds fixed (rollscale.core.search.replay.DESIGNS)
    name = {s.name: f"n:bucket={s.name}/rule=uniform/b_problem={s.b_problem}" for s in studies}
    search = result.decisions.assign(group=result.decisions["group"].map(name)).dropna(subset=["group"])
    table = decision_table(run_evals(runs, evals, None), 40_000, SETTINGS.tolerance, SETTINGS.eta, search=search)
    unsearched = decision_table(run_evals(runs, evals, None), 40_000, SETTINGS.tolerance, SETTINGS.eta)
    checked = 0
    for s in studies:
        rows = table[table["bucket"] == s.name].set_index("key")
        mine = result.decisions[result.decisions["group"] == s.name]
        last = mine[mine["decision"] == mine["decision"].max()]
        stops = mine[(mine["action"] == "stop") & mine["rule"].isin(["epsilon", "a2"])]
        stops = stops.drop_duplicates("key", keep="last")
        answer = last["leader"].dropna().iloc[0]  # the search's answer leads the fit's table too
        assert (rows["leader"] == int(answer)).all(), (s.name, rows[["status", "leader"]])
        for key, c in zip(stops["key"], stops["c"], strict=True):
            # a key A2 settled at a rung that leads at C* at the end (a tie) is the answer, not settled
            if key != answer and (mine.loc[mine["key"] == key, "decision"].max()
                                  == stops.loc[stops["key"] == key, "decision"]).all():
                assert rows.loc[int(key), "settled"] and rows.loc[int(key), "settled_at"] == c, (s.name, key)
        if (last["rule"] == "decided").any():
            answer = int(last.loc[last["rule"] == "decided", "key"].iloc[0])
            assert rows["decided"].all() and (rows["leader"] == answer).all(), (s.name, rows[["status", "leader"]])
            assert rows.loc[answer, "status"] == "leader"
            checked += 1
    assert checked >= 0.9 * len(studies)
    # without the search's table the same runs leave keys stopped short unknown: the disagreement this fixes
    assert (unsearched["status"] == "unknown").sum() > (table["status"] == "unknown").sum()
    # a search made at another C* (the target changed after the sweep) says nothing about this one
    moved = decision_table(run_evals(runs, evals, None), 40_000, SETTINGS.tolerance, SETTINGS.eta,
                           search=search.assign(c_star=30_000.0))
    pd.testing.assert_frame_equal(moved.drop(columns="settled_at"), unsearched.drop(columns="settled_at"))
