"""Tests for the frontier analysis fits (science §7)."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from scipy.optimize import brentq

from rollscale.core.fit.curves import (
    SigmoidFit,
    fit_sigmoid,
    fit_steps_to_target,
    predicted_vs_observed_best_n,
    record_breaking_points,
    record_flags,
    steps_to_target,
)
from rollscale.core.fit.frontier import epochs_at_transitions, fit_n_star, frontier, log_grid

# --------------------------------------------------------------------------
# record-breaking points


def _idx(reward, bin_width=0.1):
    return record_breaking_points(np.arange(len(reward), dtype=float), reward, bin_width)


def test_record_breaking_monotone_each_new_bin():
    assert _idx([0.05, 0.15, 0.25, 0.35]) == [0, 1, 2, 3]


def test_record_breaking_noisy_with_dips():
    # bins 1, 2, 1, 3, 2, 4: dips and returns to an old bin are not records
    assert _idx([0.1, 0.25, 0.18, 0.31, 0.29, 0.42]) == [0, 1, 3, 5]


def test_record_breaking_plateau_within_bin_keeps_first_point():
    assert _idx([0.21, 0.22, 0.29, 0.31, 0.35]) == [0, 3]
    assert _idx([0.5, 0.5, 0.5]) == [0]


def test_record_breaking_jump_over_bins_and_wide_bin():
    assert _idx([0.0, 0.55, 0.56]) == [0, 1]
    assert _idx([0.1, 0.3, 0.6, 0.9], bin_width=0.25) == [0, 1, 2, 3]
    assert _idx([0.1, 0.2, 0.45, 0.49], bin_width=0.25) == [0, 2]


def test_record_breaking_float_bin_edges():
    # 0.3 / 0.1 == 2.9999999999999996 in floats: a naive floor puts 0.3 in bin 2
    assert _idx([0.25, 0.3]) == [0, 1]
    assert _idx([0.2, 0.3, 0.30000000000000004]) == [0, 1]
    assert _idx([0.65, 0.7]) == [0, 1]  # 0.7 / 0.1 == 6.999999999999999
    # just below an edge by more than float noise stays in the lower bin
    assert _idx([0.25, 0.2999]) == [0]


@pytest.mark.parametrize(
    "compute, reward, bin_width, match",
    [
        ([1, 2], [0.1, 0.2], 0.0, "bin_width"),
        ([1, 2], [0.1, 0.2], -0.1, "bin_width"),
        ([1, 2], [0.1, 0.2], float("nan"), "bin_width"),
        ([1, 2, 3], [0.1, 0.2], 0.1, "equal lengths"),
        ([1, 2], [0.1, float("nan")], 0.1, "reward"),
        ([1, float("inf")], [0.1, 0.2], 0.1, "compute"),
        ([2, 1], [0.1, 0.2], 0.1, "non-decreasing"),
    ],
)
def test_record_breaking_rejects_bad_input(compute, reward, bin_width, match):
    with pytest.raises(ValueError, match=match):
        record_breaking_points(compute, reward, bin_width)


# --------------------------------------------------------------------------
# sigmoid

TRUE_SIG = {"r0": 0.2, "a": 0.7, "c_mid": 1e5, "beta": 0.8}
C_SIG = np.logspace(3, 7, 30)


def _sigmoid(c, r0, a, c_mid, beta):
    return r0 + (a - r0) / (1 + (c_mid / c) ** beta)


def _noisy_sigmoid(seed, sd=0.01):
    rng = np.random.default_rng(seed)
    return _sigmoid(C_SIG, **TRUE_SIG) + rng.normal(0, sd, len(C_SIG))


def test_fit_sigmoid_recovers_parameters_within_three_se():
    fit = fit_sigmoid(C_SIG, _noisy_sigmoid(0))
    assert fit.status == "ok" and fit.ok
    assert fit.n_points == 30
    assert fit.r2 > 0.99
    for name in ("r0", "a", "beta"):
        est, se = getattr(fit, name), getattr(fit, f"{name}_se")
        assert 0 < se < 0.1, name
        assert abs(est - TRUE_SIG[name]) <= 3 * se, name
    assert abs(fit.c_mid - TRUE_SIG["c_mid"]) <= 3 * fit.c_mid_se
    assert abs(fit.log10_c_mid - 5.0) <= 3 * fit.log10_c_mid_se
    # c_mid's SE is the delta-method image of log10 c_mid's
    assert fit.c_mid_se == pytest.approx(fit.c_mid * math.log(10) * fit.log10_c_mid_se)
    np.testing.assert_allclose(fit.predict(C_SIG), _sigmoid(C_SIG, **TRUE_SIG), atol=0.01)
    assert isinstance(fit.predict(1e5), float)


def test_fit_sigmoid_standard_errors_are_calibrated():
    # across seeds, the spread of estimates matches the reported SEs
    fits = [fit_sigmoid(C_SIG, _noisy_sigmoid(seed)) for seed in range(40)]
    df = pd.DataFrame([f.to_dict() for f in fits])
    assert (df["status"] == "ok").all()
    for name, true in (("r0", 0.2), ("a", 0.7), ("beta", 0.8), ("log10_c_mid", 5.0)):
        ratio = df[name].std() / df[f"{name}_se"].mean()
        assert 0.7 < ratio < 1.5, (name, ratio)
        covered = (abs(df[name] - true) <= 3 * df[f"{name}_se"]).mean()
        assert covered >= 0.9, (name, covered)


def test_fit_sigmoid_noiseless_is_exact():
    fit = fit_sigmoid(C_SIG, _sigmoid(C_SIG, **TRUE_SIG))
    for name, true in TRUE_SIG.items():
        assert getattr(fit, name) == pytest.approx(true, rel=1e-5)


def test_fit_sigmoid_names_parameters_left_at_a_bound():
    # a reward still rising linearly in log C (no bend within the budget, as on the embedded
    # model at n = 8 and 16) does not identify C_mid: the fit leaves it at its range's edge
    c = np.logspace(3, 4.6, 16)
    rising = 0.45 + 0.15 * np.log10(c / 1e3) + np.random.default_rng(0).normal(0, 0.005, 16)
    fit = fit_sigmoid(c, rising)
    assert fit.ok and "log10_c_mid" in fit.at_bound
    np.testing.assert_allclose(fit.predict(c), rising, atol=0.02)  # still a fair curve on its data
    # a curve that bends within the data leaves every parameter inside its range
    assert fit_sigmoid(C_SIG, _noisy_sigmoid(0)).at_bound == ""


def test_fit_sigmoid_keeps_a_at_least_r0_on_falling_data():
    y = np.linspace(0.6, 0.4, 12) + np.random.default_rng(3).normal(0, 0.01, 12)
    fit = fit_sigmoid(np.logspace(3, 6, 12), y)
    assert fit.ok
    assert fit.a >= fit.r0
    assert fit.beta > 0


def test_fit_sigmoid_too_few_points_is_a_status_not_a_crash():
    fit = fit_sigmoid([1e3, 1e4, 1e5], [0.1, 0.3, 0.5])
    assert fit.status == "too few points (3 < 4)"
    assert not fit.ok
    assert fit.n_points == 3
    for name in ("r0", "a", "c_mid", "beta", "r0_se", "a_se", "c_mid_se", "beta_se", "r2"):
        assert math.isnan(getattr(fit, name)), name
    assert math.isnan(fit.predict(1e4))
    # four points but only two distinct compute values
    fit = fit_sigmoid([1e3, 1e3, 1e4, 1e4], [0.1, 0.2, 0.3, 0.4])
    assert fit.status == "too few distinct compute values (2 < 4)"


def test_fit_sigmoid_to_dict_is_flat_and_json_friendly():
    row = fit_sigmoid(C_SIG, _noisy_sigmoid(1)).to_dict()
    assert {"r0", "a", "c_mid", "beta", "r0_se", "a_se", "c_mid_se", "beta_se", "r2", "n_points", "status"} <= set(row)
    assert all(isinstance(v, (int, float, str)) for v in row.values())
    json.dumps(fit_sigmoid([1.0], [0.1]).to_dict())  # NaNs allowed


@pytest.mark.parametrize(
    "compute, reward, match",
    [
        ([1e3, 1e4], [0.1], "equal lengths"),
        ([0.0, 1e4, 1e5, 1e6], [0.1, 0.2, 0.3, 0.4], "compute: expected positive"),
        ([1e3, 1e4, 1e5, 1e6], [0.1, np.nan, 0.3, 0.4], "reward"),
    ],
)
def test_fit_sigmoid_rejects_bad_input(compute, reward, match):
    with pytest.raises(ValueError, match=match):
        fit_sigmoid(compute, reward)


# --------------------------------------------------------------------------
# frontier, n*(C), epochs at transitions


def _sig(r0, a, c_mid, beta):
    nan = math.nan
    return SigmoidFit(r0, a, c_mid, beta, nan, nan, nan, nan, math.log10(c_mid), nan, nan, 10, "ok")


def test_frontier_picks_the_right_key_on_crossing_sigmoids():
    fast_low = _sig(0.1, 0.5, 1e4, 1.0)  # n = 4: rises early, low ceiling
    slow_high = _sig(0.1, 0.8, 1e5, 1.0)  # n = 16: rises late, high ceiling
    broken = fit_sigmoid([1e3, 1e4], [0.9, 0.95])  # not ok: never chosen
    grid = log_grid(1e2, 1e8, 61)
    df = frontier({64: broken, 4: fast_low, 16: slow_high}, grid)
    assert list(df.columns) == ["c", "frontier_reward", "best_key"]
    np.testing.assert_allclose(df["c"], grid)
    cross = brentq(lambda c: fast_low.predict(c) - slow_high.predict(c), 1e3, 1e7)
    assert (df.loc[df["c"] < cross, "best_key"] == 4).all()
    assert (df.loc[df["c"] > cross, "best_key"] == 16).all()
    np.testing.assert_allclose(
        df["frontier_reward"], np.maximum(fast_low.predict(grid), slow_high.predict(grid))
    )


def test_frontier_with_no_usable_fit():
    df = frontier({4: fit_sigmoid([1.0], [0.1])}, [1e3, 1e4])
    assert df["frontier_reward"].isna().all()
    assert df["best_key"].isna().all()


def test_log_grid():
    g = log_grid(1e3, 1e7, 5)
    np.testing.assert_allclose(g, [1e3, 1e4, 1e5, 1e6, 1e7])
    with pytest.raises(ValueError, match="c_min"):
        log_grid(0, 10, 5)
    with pytest.raises(ValueError, match="c_max"):
        log_grid(10, 10, 5)
    with pytest.raises(ValueError, match="points"):
        log_grid(1, 10, 1)


def test_epochs_at_transitions_hand_case():
    df = pd.DataFrame({"c": [1.0, 10.0, 100.0, 1000.0, 2000.0], "best_key": [4, 4, 16, 64, 64]})
    calls = []

    def lookup(key, c):
        calls.append((key, c))
        return c / (key * 10)

    out = epochs_at_transitions(df, lookup)
    assert list(out.columns) == ["c", "from_key", "to_key", "epochs"]
    assert out.to_dict("records") == [
        {"c": 100.0, "from_key": 4, "to_key": 16, "epochs": 100.0 / 160},
        {"c": 1000.0, "from_key": 16, "to_key": 64, "epochs": 1000.0 / 640},
    ]
    assert calls == [(16, 100.0), (64, 1000.0)]


def test_epochs_at_transitions_skips_missing_keys_and_handles_none():
    df = pd.DataFrame({"c": [1.0, 10.0, 100.0], "best_key": pd.Series([4, None, 8], dtype=object)})
    out = epochs_at_transitions(df, lambda key, c: 2.0)
    assert out[["c", "from_key", "to_key"]].to_dict("records") == [{"c": 100.0, "from_key": 4, "to_key": 8}]
    empty = epochs_at_transitions(pd.DataFrame({"c": [1.0, 2.0], "best_key": [4, 4]}), lambda k, c: 1.0)
    assert empty.empty and list(empty.columns) == ["c", "from_key", "to_key", "epochs"]
    with pytest.raises(ValueError, match="best_key"):
        epochs_at_transitions(pd.DataFrame({"c": [1.0]}), lambda k, c: 1.0)


N_STAR_TRUE = {"lo": 2.0, "hi": 6.0, "k": 3.0, "c0": 5.0}
X_N = np.linspace(3, 7, 40)


def _log2_n_star(x):
    t = N_STAR_TRUE
    return t["lo"] + (t["hi"] - t["lo"]) / (1 + np.exp(-t["k"] * (x - t["c0"])))


def test_fit_n_star_recovers_parameters_within_three_se():
    noisy = _log2_n_star(X_N) + np.random.default_rng(0).normal(0, 0.1, len(X_N))
    fit = fit_n_star(X_N, np.exp2(noisy))
    assert fit.ok and fit.n_points == 40 and fit.r2 > 0.98
    for name, true in N_STAR_TRUE.items():
        se = getattr(fit, f"{name}_se")
        assert 0 < se < 1, name
        assert abs(getattr(fit, name) - true) <= 3 * se, name
    np.testing.assert_allclose(fit.predict_log2(X_N), _log2_n_star(X_N), atol=0.1)
    np.testing.assert_allclose(fit.predict(5.0), 2**4, rtol=0.05)


def test_fit_n_star_on_a_staircase():
    # what the frontier's argmax gives: n* only takes grid values (powers of two)
    staircase = np.exp2(np.round(_log2_n_star(X_N)))
    fit = fit_n_star(X_N, staircase)
    assert fit.ok
    assert fit.c0 == pytest.approx(5.0, abs=0.1)
    assert fit.lo == pytest.approx(2.0, abs=0.3)
    assert fit.hi == pytest.approx(6.0, abs=0.3)
    assert fit.k == pytest.approx(3.0, rel=0.3)


def test_fit_n_star_falling_curve_has_hi_below_lo():
    fit = fit_n_star(X_N, np.exp2(8 - _log2_n_star(X_N)))
    assert fit.ok and fit.k >= 0
    assert fit.lo == pytest.approx(6.0, abs=1e-4) and fit.hi == pytest.approx(2.0, abs=1e-4)


def test_fit_n_star_degenerate_inputs():
    fit = fit_n_star([3.0, 4.0, 5.0], [4, 8, 16])
    assert fit.status == "too few points (3 < 4)" and math.isnan(fit.c0)
    fit = fit_n_star(X_N, np.full(len(X_N), 8.0))
    assert not fit.ok and "constant" in fit.status and math.isnan(fit.k)
    with pytest.raises(ValueError, match="n_star"):
        fit_n_star([3.0, 4.0, 5.0, 6.0], [4, 0, 8, 16])


# --------------------------------------------------------------------------
# steps to target


def test_steps_to_target():
    assert steps_to_target([10, 20, 30], [0.1, 0.5, 0.4], 0.45) == 20
    assert steps_to_target([10, 20, 30], [0.1, 0.5, 0.4], 0.5) == 20  # >= counts
    assert steps_to_target([10, 20, 30], [0.1, 0.5, 0.4], 0.6) is None
    assert steps_to_target([30, 10, 20], [0.7, 0.1, 0.8], 0.6) == 20  # unsorted input
    assert steps_to_target([], [], 0.5) is None
    with pytest.raises(ValueError, match="target"):
        steps_to_target([1], [0.1], float("nan"))
    with pytest.raises(ValueError, match="equal lengths"):
        steps_to_target([1, 2], [0.1], 0.5)


B_GRID = np.array([8, 16, 32, 64, 128, 256, 512], dtype=float)
S_MIN, B_CRIT = 200.0, 64.0


def _steps(b):
    return S_MIN * (1 + B_CRIT / b)


def test_fit_steps_to_target_noiseless_is_exact():
    fit = fit_steps_to_target(B_GRID, _steps(B_GRID))
    assert fit.ok and fit.r2 == pytest.approx(1.0)
    assert fit.s_min == pytest.approx(S_MIN) and fit.b_crit == pytest.approx(B_CRIT)
    assert fit.e_min == pytest.approx(S_MIN * B_CRIT)
    assert fit.predict(32.0) == pytest.approx(_steps(32.0))


def test_fit_steps_to_target_recovers_within_three_se():
    b = np.repeat(B_GRID, 2)  # two seeds per batch size
    s = _steps(b) + np.random.default_rng(0).normal(0, 15, len(b))
    fit = fit_steps_to_target(b, s)
    assert fit.ok and fit.n_points == 14
    assert abs(fit.s_min - S_MIN) <= 3 * fit.s_min_se
    assert abs(fit.b_crit - B_CRIT) <= 3 * fit.b_crit_se
    assert abs(fit.e_min - S_MIN * B_CRIT) <= 3 * fit.e_min_se
    assert fit.e_min == pytest.approx(fit.s_min * fit.b_crit)


def test_fit_steps_to_target_standard_errors_are_calibrated():
    rows = []
    for seed in range(100):
        s = _steps(B_GRID) + np.random.default_rng(seed).normal(0, 15, len(B_GRID))
        rows.append(fit_steps_to_target(B_GRID, s).to_dict())
    df = pd.DataFrame(rows)
    for name, true in (("s_min", S_MIN), ("b_crit", B_CRIT), ("e_min", S_MIN * B_CRIT)):
        ratio = df[name].std() / df[f"{name}_se"].mean()
        assert 0.75 < ratio < 1.35, (name, ratio)
        assert (abs(df[name] - true) <= 3 * df[f"{name}_se"]).mean() >= 0.9, name


def test_fit_steps_to_target_too_few_and_non_physical():
    fit = fit_steps_to_target([16, 16, 32, 32], [300, 310, 250, 260])
    assert fit.status == "too few distinct batch sizes (2 < 3)"
    assert math.isnan(fit.s_min) and math.isnan(fit.b_crit) and fit.n_points == 4
    assert math.isnan(fit.predict(16.0))
    # steps that grow with B: E_min < 0
    fit = fit_steps_to_target([8, 16, 32, 64], [100, 150, 175, 190])
    assert not fit.ok and "E_min" in fit.status
    with pytest.raises(ValueError, match="batch_sizes"):
        fit_steps_to_target([0, 16, 32], [1, 2, 3])


# --------------------------------------------------------------------------
# CRS prediction check


REWARDS = {4: 0.50, 8: 0.60, 16: 0.55, 32: 0.40}


def test_predicted_vs_observed_best_n():
    row = predicted_vs_observed_best_n(10.0, REWARDS)  # log2 10 = 3.32: nearest is 8
    assert (row.predicted_n, row.observed_best_n, row.agree) == (8, 8, True)
    assert row.observed_best_reward == 0.60
    row = predicted_vs_observed_best_n(13.0, REWARDS)  # log2 13 = 3.70: nearest is 16
    assert (row.predicted_n, row.agree) == (16, False)
    assert predicted_vs_observed_best_n(math.inf, REWARDS).predicted_n == 32
    assert predicted_vs_observed_best_n(1.0, REWARDS).predicted_n == 4
    assert predicted_vs_observed_best_n(math.sqrt(32), REWARDS).predicted_n == 4  # tie: smaller n
    row = predicted_vs_observed_best_n(math.nan, REWARDS)
    assert row.predicted_n is None and not row.agree
    json.dumps(row.to_dict())


def test_predicted_vs_observed_best_n_bad_input():
    with pytest.raises(ValueError, match="reward_by_n"):
        predicted_vs_observed_best_n(8.0, {})
    with pytest.raises(ValueError, match="reward_by_n"):
        predicted_vs_observed_best_n(8.0, {4: 0.5, 8: math.nan})
    with pytest.raises(ValueError, match="crs"):
        predicted_vs_observed_best_n(0.0, REWARDS)


def test_fit_sigmoid_bounds_a_by_a_max_only_where_it_binds():
    # science §8, A1: a mean of 0/1 rewards has A <= 1. An unbent curve's free fit runs past 1 ...
    c = np.logspace(3, 4.6, 16)
    rising = 0.45 + 0.15 * np.log10(c / 1e3) + np.random.default_rng(0).normal(0, 0.005, 16)
    free, bound = fit_sigmoid(c, rising), fit_sigmoid(c, rising, a_max=1.0)
    assert free.a > 1.0
    assert bound.ok and bound.a <= 1.0 + 1e-9 and "a" in bound.at_bound and bound.a >= bound.r0
    np.testing.assert_allclose(bound.predict(c), rising, atol=0.02)  # still a fair curve on its data
    assert np.isfinite([bound.a_se, bound.r0_se]).all()
    # ... while a fit already within the bound is the very same fit
    y = _noisy_sigmoid(0)
    assert fit_sigmoid(C_SIG, y, a_max=1.0) == fit_sigmoid(C_SIG, y)


def test_record_flags_many_runs_at_once_match_each_run_alone():
    rng = np.random.default_rng(4)
    rewards = [np.cumsum(rng.normal(0.01, 0.03, 30)) for _ in range(5)]
    runs = np.repeat(np.arange(5), 30)
    flags = record_flags(runs, np.concatenate(rewards), 0.02)
    expected = np.concatenate([np.isin(np.arange(30), record_breaking_points(np.arange(30.0), r, 0.02))
                               for r in rewards])
    assert np.array_equal(flags, expected) and flags.sum() < len(flags)
