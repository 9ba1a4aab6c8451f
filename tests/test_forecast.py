"""The forecast past the data (science §10): the surface, its intervals, the backtest and the cap.

Simulated studies are rollscale.core.search.forecast_sim's (the search's families, 2 seeds, avg@16 on the §9.1
schedule); benchmarks/forecast_sim.py runs many per family (docs/benchmarks.md has the table). Here a few, with
few refits, so the file takes seconds.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
import pytest

from rollscale.core.fit.backtest import backtest, cut_runs
from rollscale.core.fit.climb import climb_caps, steepest_rise
from rollscale.core.fit.forecast import FORECAST_COLUMNS, ForecastSettings, forecast_group, forecast_table
from rollscale.core.search.forecast_sim import forecast_studies, judge_study, study_evals, true_at
from rollscale.core.fit.surface import fit_surface, key_parameters, prepare

R0 = 0.35
# science §10.1's surface: these tests pin its machinery (the default form is tested in test_forecast_forms.py)
FAST = ForecastSettings(resamples=60, eval_draws=1600, form="surface")


def _on_surface(keys=(2, 4, 8, 16), seeds=2, noise=0.0, seed=0) -> tuple[pd.DataFrame, dict]:
    """Evaluations of curves exactly on a surface (A, log10 C_mid, log beta linear in log2 n), every 1/4 doubling
    from 500 to 40,000; ``noise``: a normal sd per evaluation. Returns the evaluations and the true parameters."""
    rng = np.random.default_rng(seed)
    truth = {}
    rows = []
    c = np.concatenate([[0.0], 500 * 2 ** (np.arange(26) / 4)])
    for n in keys:
        x = math.log2(n)
        a, m, b = 0.45 + 0.04 * x, 3.2 + 0.25 * x, math.log(1.5) + 0.05 * x
        truth[n] = (a, m, b)
        for s in range(seeds):
            with np.errstate(divide="ignore"):
                y = R0 + (a - R0) / (1 + (10**m / c) ** math.exp(b))
            y = y + rng.normal(0, noise, y.size) if noise else y
            rows += [{"run_id": f"n{n}_s{s}", "n": n, "seed": s, "c": ci, "avg_at_k": yi} for ci, yi in zip(c, y)]
    return pd.DataFrame(rows), truth


def test_surface_recovers_noise_free_parameters_and_its_line():
    evals, truth = _on_surface(seeds=1, noise=0.0)
    surface = fit_surface(prepare(evals, "n"))
    assert surface.r0 == pytest.approx(R0)
    got = key_parameters(surface, np.array([2, 4, 8, 16, 32]))
    for i, n in enumerate((2, 4, 8, 16)):
        assert got[i] == pytest.approx(truth[n], abs=2e-3)
    # the line carries a key never trained: n = 32 on it
    assert got[4] == pytest.approx((0.45 + 0.2, 3.2 + 1.25, math.log(1.5) + 0.25), abs=5e-3)
    assert surface.line[1, 1] == pytest.approx(0.25, abs=2e-3)


def test_surface_recovers_simulated_truth_at_four_times_the_data():
    studies = forecast_studies(("cross",), 3, seed=11, seeds=(0, 1, 2))
    evals = study_evals(studies)
    errors = []
    for s in studies:
        data = prepare(evals[evals["bucket"] == s.name], "n")
        surface = fit_surface(data)
        params = key_parameters(surface, np.array([2, 4, 8, 16]))
        for (a, m, b), n in zip(params, (2, 4, 8, 16)):
            predicted = surface.r0 + (a - surface.r0) / (1 + (10**m / 160_000) ** math.exp(b))
            errors.append(predicted - true_at(s, n, 160_000))
    assert np.sqrt(np.mean(np.square(errors))) < 0.03
    assert abs(np.mean(errors)) < 0.02


def test_forecast_intervals_cover_the_truth_at_two_and_four_times_c_max():
    studies = forecast_studies(("cross", "edge_high"), 3, seed=5)
    evals = study_evals(studies)
    rows = []
    for s in studies:
        rows += judge_study(s, evals[evals["bucket"] == s.name], FAST, multiples=(2.0, 4.0), with_backtest=False)
    rows = pd.DataFrame(rows)
    coverage = rows["covered"].sum() / rows["keys"].sum()
    # nominal 95 %; measured over more studies in docs/benchmarks.md. 0.85 leaves room for 12 studies x 4 keys
    assert coverage >= 0.85, coverage
    # and not by being wide: 2 seeds of avg@16 give intervals well under 0.15 at 4 x C_max
    assert rows["width"].median() < 0.12
    assert rows["right"].mean() >= 0.8
    assert not rows["cap_stops_best"].any()


def test_the_simulation_judges_the_interval_the_fit_stage_writes():
    """benchmarks/forecast_sim.py --calibrated judges the report's interval (science §11.4): the forecast at the
    answer's multiple, widened by the study's own backtest. Its coverage and width are those of the fit stage's
    forecast table at C* (rollscale.core.fit.horizon.horizon_tables) on the same runs."""
    from rollscale.core.fit.analysis import run_evals
    from rollscale.core.fit.horizon import horizon_tables
    from rollscale.core.search.simulate import grid_tables

    (s,) = forecast_studies(("late",), 1, seed=3)
    settings = ForecastSettings(resamples=20, eval_draws=1600)  # the default form
    (row,) = judge_study(s, study_evals([s]), settings, multiples=(4.0,), with_backtest=False, with_calibrated=True)
    runs, evals = grid_tables([s])
    table = horizon_tables(run_evals(runs, evals, None), 4 * s.c_max, [4 * s.c_max], settings).forecast
    table = table[table["target"] & table["key"].isin(s.curves)]
    truth = np.array([true_at(s, int(k), 4 * s.c_max) for k in table["key"]])
    assert row["covered_cal"] == int(((table["reward_lo"] <= truth) & (truth <= table["reward_hi"])).sum())
    assert row["width_cal"] == pytest.approx(table["width"].median())
    assert row["widen"] > 1.0 and row["width_cal"] > row["width"]  # this study's backtest widens it


def test_simulated_late_key_is_covered_and_the_backtest_flags_a_bend_not_its_straight_twin():
    # science §10 "what it must show", a subsample of benchmarks/forecast_sim.py (docs/benchmarks.md: 24 a family)
    late = forecast_studies(("late",), 4, seed=7)
    evals = study_evals(late)
    rows = pd.DataFrame([r for s in late for r in judge_study(s, evals[evals["bucket"] == s.name], FAST,
                                                              with_backtest=False)])
    # late's n = 16 rises last and 0.1 above the line of n = 2-8, its curve unbent at C_max: tau held at its
    # estimate covered 0.79 of these 48 key forecasts (2x, 4x, 8x C_max); drawn per refit 0.94
    assert rows["covered"].sum() / rows["keys"].sum() >= 0.9
    assert rows["width"].median() < 0.1  # not by giving up: the median key still answers
    # bend-i is cross-i with n = 16 flat past C_max / 2: the same seeds, so the contrast is the bend alone
    z, flagged = {}, {}
    for family in ("bend", "cross"):
        studies = forecast_studies((family,), 4, seed=7)
        evals = study_evals(studies)
        tests = [backtest(evals[evals["bucket"] == s.name], "n", FAST) for s in studies]
        z[family] = [float(t.keys.set_index("key").loc[16, "z"]) for t in tests]
        flagged[family] = sum(t.a4_contradicted for t in tests)
    # the forecast's own interval as the yardstick put the bent key at |z| 0.9-1.8 and flagged none
    assert np.mean(z["bend"]) <= -2.0 and flagged["bend"] >= 2, (z, flagged)
    assert flagged["cross"] == 0 and max(abs(v) for v in z["cross"]) < 1.5, (z, flagged)


def test_forecast_table_columns_bounds_leader_and_untrained_keys():
    evals, _ = _on_surface(seeds=2, noise=0.015, seed=3)
    both = pd.concat([evals.assign(group="g1"), evals.assign(group="g2", avg_at_k=evals["avg_at_k"] * 0.9)])
    table = forecast_table(both, "n", "group", 160_000, settings=FAST)
    assert list(table.columns) == FORECAST_COLUMNS
    assert set(table["group"]) == {"g1", "g2"}
    g1 = table[table["group"] == "g1"].set_index("key")
    assert list(g1.index) == [1, 2, 4, 8, 16, 32]  # trained keys and one power of two beyond each edge
    assert not g1.loc[1, "trained"] and not g1.loc[32, "trained"] and g1.loc[8, "trained"]
    assert (table["reward_lo"] >= 0).all() and (table["reward_hi"] <= 1).all()
    assert (table["reward_lo"] <= table["reward"]).all() and (table["reward"] <= table["reward_hi"]).all()
    lead = int(g1["leader"].iloc[0])
    assert lead == 16 and g1.loc[lead, "d"] == 0.0  # the line rises with n: the largest trained key leads
    assert (g1["d_lo"] <= g1["d"]).all() and (g1["d"] <= g1["d_hi"]).all()
    # a key beyond the data borrows the deviation spread: wider than a trained key its data pin down
    assert g1.loc[32, "width"] > g1.loc[4, "width"] and g1.loc[1, "width"] > g1.loc[2, "width"]
    assert g1["extrapolated"].all() and g1["per_run"].isna().all()
    within = forecast_group(evals, "n", 20_000, np.array([2, 16]), FAST).set_index("key")
    assert within["per_run"].notna().all() and not within["extrapolated"].any()
    assert within.loc[16, "reward"] == pytest.approx(within.loc[16, "per_run"], abs=0.02)


def test_a_forecast_too_wide_is_unknown_and_still_names_its_leader():
    evals, _ = _on_surface(seeds=2, noise=0.015, seed=4)
    wide = forecast_group(evals, "n", 160_000, None, ForecastSettings(resamples=20, eval_draws=1600,
                                                                      max_width=1e-4, form="surface"))
    assert wide["unknown"].all()
    # the leader is read as ever (the group then has no answer at C*: its row is unknown)
    narrow = forecast_group(evals, "n", 160_000, None, ForecastSettings(resamples=20, eval_draws=1600,
                                                                        form="surface"))
    assert wide["leader"].iloc[0] == narrow["leader"].iloc[0] == 16
    assert not narrow.set_index("key").loc[4, "unknown"]


def test_bad_input_names_what_is_wrong():
    evals, _ = _on_surface(seeds=1)
    with pytest.raises(ValueError, match="missing columns"):
        forecast_group(evals.drop(columns="avg_at_k"), "n", 1e5, settings=FAST)
    # no step 0: a reason on every row, never an error (the search and the fit stage show it)
    rows = forecast_group(evals[evals["c"] > 0], "n", 1e5, settings=FAST)
    assert rows["reason"].str.contains("step-0").all() and rows["reward"].isna().all()
    with pytest.raises(ValueError, match="group column"):
        forecast_table(evals, "n", "bucket", 1e5, settings=FAST)
    with pytest.raises(ValueError, match="c_star"):
        forecast_group(evals, "n", 0.0, settings=FAST)


def test_the_order_of_the_rows_changes_nothing():
    evals, _ = _on_surface(seeds=2, noise=0.015, seed=9)
    keys = np.array([2, 16, 32])
    a = forecast_group(evals, "n", 80_000, keys, FAST)
    b = forecast_group(evals.sample(frac=1.0, random_state=0), "n", 80_000, keys, FAST)
    pd.testing.assert_frame_equal(a, b)


def test_cut_runs_keeps_each_run_to_half_its_reach():
    evals, _ = _on_surface(seeds=1)
    cut = cut_runs(evals)
    assert cut.groupby("run_id")["c"].max().max() <= 20_000
    assert (cut["c"] == 0).sum() == (evals["c"] == 0).sum()


def test_backtest_passes_on_the_surface_and_fails_where_a_key_stops_rising():
    evals, _ = _on_surface(seeds=2, noise=0.01, seed=6)
    good = backtest(evals, "n", FAST)
    assert not good.failed and good.coverage >= 0.75, good.note
    assert good.note.startswith("forecast 2x past 1/2 of the data covered") and good.multiple == 2.0
    bent = evals.copy()
    # n = 16 stops rising past C_max / 2 (science §10.3: A4 contradicted by one key)
    late = (bent["n"] == 16) & (bent["c"] > 20_000)
    at_bend = bent.loc[(bent["n"] == 16) & (bent["c"] <= 20_000)].groupby("seed")["avg_at_k"].last()
    bent.loc[late, "avg_at_k"] = bent.loc[late, "seed"].map(at_bend) + np.random.default_rng(1).normal(0, 0.01,
                                                                                                      late.sum())
    bad = backtest(bent, "n", FAST)
    assert bad.failed and bad.a4_contradicted, bad.note
    assert bad.keys.set_index("key").loc[16, "off_surface"]
    assert "A4 contradicted: key 16" in bad.note


def test_steepest_rise_is_a_sigmoids_steepest_slope_per_doubling():
    evals, truth = _on_surface(keys=(4,), seeds=1)
    a, m, b = truth[4]
    steepest = (a - R0) * math.exp(b) * math.log(2) / 4  # d R / d log2 C at C_mid
    assert steepest_rise(evals, "n") == pytest.approx(steepest, rel=0.06)


def test_cap_stops_a_clear_loser_and_never_the_best():
    evals, _ = _on_surface(seeds=2, noise=0.01, seed=8)
    # n = 2 far below: its rise halved and its asymptote low; the others rise as the surface says
    low = evals["n"] == 2
    evals.loc[low, "avg_at_k"] = R0 + (evals.loc[low, "avg_at_k"] - R0) * 0.3
    caps = climb_caps(evals, "n", 80_000, tolerance=0.02).set_index("key")
    assert caps.loc[2, "cannot_catch_up"]
    assert not caps.loc[16, "cannot_catch_up"] and not caps.loc[8, "cannot_catch_up"]
    assert (caps["cap"] >= caps["reward_hi"]).all()
    far = climb_caps(evals, "n", 40_000 * 2**12, tolerance=0.02)
    assert not far["cannot_catch_up"].any()  # twelve doublings: any key could still climb past


def test_the_fit_stage_tables_read_every_ordered_group_at_c_star_and_past_it():
    """The fit stage's ``forecast`` and ``backtest`` tables (science §10, rollscale.core.fit.horizon): every n group
    read at C* and at 2x, 4x, 8x C_max, keys between and beyond the trained ones marked, rewards within [0, 1], and
    one backtest per group; a group of one key is a backtest row saying why, never an error."""
    from dataclasses import replace

    from rollscale.core.fit.analysis import run_evals
    from rollscale.core.fit.horizon import (BACKTEST_TABLE_COLUMNS, FORECAST_TABLE_COLUMNS, forecast_budgets,
                                            horizon_tables)
    from rollscale.core.search.simulate import grid_tables, make_studies

    studies = [replace(s, seeds=(0, 1)) for s in make_studies(1, seed=5)][:2]
    runs, evals = grid_tables(studies)
    ev = run_evals(runs, evals, None)
    c_max = float(studies[0].c_max)
    budgets = forecast_budgets(c_max, c_max)
    assert budgets == [c_max, 2 * c_max, 4 * c_max, 8 * c_max]
    out = horizon_tables(ev, c_max, budgets, ForecastSettings(resamples=30, eval_draws=1600))
    fc, bt = out.forecast, out.backtest
    assert list(fc.columns) == FORECAST_TABLE_COLUMNS and list(bt.columns) == BACKTEST_TABLE_COLUMNS
    assert set(fc["bucket"]) == {s.name for s in studies} and set(fc["design"]) == {"n"}
    assert sorted(fc["c_star"].unique()) == budgets and fc.loc[fc["target"], "c_star"].eq(c_max).all()
    assert (~fc["trained"]).any() and fc["trained"].any()
    assert fc[["reward", "reward_lo", "reward_hi"]].stack().between(0, 1).all()
    assert (fc["reward_lo"] <= fc["reward"]).all() and (fc["reward"] <= fc["reward_hi"]).all()
    assert set(bt["bucket"]) == {s.name for s in studies} and bt["note"].str.contains("forecast 2x past 1/2 of the data").all()
    one_key = ev[ev["n"] == ev["n"].min()]
    alone = horizon_tables(one_key, c_max, budgets, ForecastSettings(resamples=5))
    assert alone.forecast.empty and alone.backtest["note"].str.startswith("no forecast").all()


def test_the_report_shows_the_backtest_and_the_forecast_with_more_compute():
    """The report's table 'with 2x, 4x, 8x more compute' reads n*(C) from the forecast table, one row per budget,
    rewards within [0, 1]; the backtest's sentence is the first group's note."""
    from dataclasses import replace

    from rollscale.core.fit.analysis import run_evals
    from rollscale.core.fit.horizon import forecast_budgets, horizon_tables
    from rollscale.core.search.simulate import grid_tables, make_studies
    from rollscale.report.horizon import backtest_sentence, table_more_compute

    studies = [replace(s, seeds=(0, 1)) for s in make_studies(1, seed=7)][:1]
    runs, evals = grid_tables(studies)
    ev = run_evals(runs, evals, None)
    c_max = float(studies[0].c_max)
    out = horizon_tables(ev, c_max, forecast_budgets(c_max, c_max), ForecastSettings(resamples=30, eval_draws=1600))
    spec = table_more_compute({"forecast": out.forecast, "backtest": out.backtest})
    assert spec.frame is not None and len(spec.frame) == 4 and spec.frame["C"].iloc[0].endswith("(C*)")
    assert spec.frame["best"].str.startswith("n = ").all()
    for text in spec.frame["reward"]:
        values = [float(v) for v in re.findall(r"-?\d+\.\d+", text)]
        assert values and all(0 <= v <= 1 for v in values), text
    sentence = backtest_sentence({"backtest": out.backtest})
    assert sentence.startswith("Forecast past the data (science §10): forecast 2x past 1/2 of the data covered ")
    assert table_more_compute({"forecast": None}).missing and backtest_sentence({"backtest": None}) is None
