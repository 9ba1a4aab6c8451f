"""Study-level frontier analysis (science §7) on synthetic sweeps of known structure."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy.optimize import brentq

from rollscale.core.fit import analysis

D = 200  # training problems: epochs = step * B_problem / D (science §1)


def _sigmoid(c, r0, a, c_mid, beta):
    c = np.asarray(c, float)
    with np.errstate(divide="ignore", over="ignore"):
        return r0 + (a - r0) / (1.0 + (c_mid / np.maximum(c, 1e-300)) ** beta)


def _run(run_id, n, b_problem, steps, reward, *, bucket="easy", rule="uniform", seed=0, c_max=None, status="finished"):
    """One run's row of ``runs`` and its ``evals`` rows; reward(step, c) gives the validation avg@k."""
    steps = np.asarray(steps, int)
    c = steps * n * b_problem
    run = {"run_id": run_id, "bucket": bucket, "n": n, "b_problem": b_problem, "m": n, "rule": rule, "seed": seed,
           "c_max": c_max if c_max is not None else int(c[-1]), "status": status, "steps": int(steps[-1]),
           "c": int(c[-1])}
    evals = pd.DataFrame({"run_id": run_id, "step": steps, "c": c, "epochs": steps * b_problem / D,
                          "avg_at_k": np.asarray(reward(steps, c), float), "avg_at_k_se": 0.01})
    return run, evals


def _study(runs_and_evals):
    runs = pd.DataFrame([r for r, _ in runs_and_evals])
    evals = pd.concat([e for _, e in runs_and_evals], ignore_index=True)
    return runs, evals


# rollout axis: B_problem = 8, n in {2, 4, 8}; bigger n starts slower but rises higher
CURVES = {2: (0.1, 0.45, 2_000.0, 2.0), 4: (0.1, 0.6, 6_000.0, 2.0), 8: (0.1, 0.75, 20_000.0, 2.0)}
C_MAX = 400_000


def _rollout_axis_study(seeds=(0,)):
    out = []
    for n, theta in CURVES.items():
        b_problem = 8
        m = C_MAX // (n * b_problem)
        steps = np.unique(np.r_[0, np.geomspace(1, m, 60).astype(int)])
        for seed in seeds:
            out.append(_run(f"nr{n}_s{seed}", n, b_problem, steps, lambda s, c, t=theta: _sigmoid(c, *t), seed=seed,
                            c_max=C_MAX))
    return _study(out)


def _true_best_n(c):
    return max(CURVES, key=lambda n: float(_sigmoid(c, *CURVES[n])))


@pytest.fixture(scope="module")
def rollout_points():
    runs, evals = _rollout_axis_study()
    return analysis.record_points(analysis.run_evals(runs, evals), bin_width=0.01)


# ---------------------------------------------------------------------------
# inputs and record points


def test_run_evals_joins_design_and_keeps_finished_runs():
    runs, evals = _rollout_axis_study()
    runs.loc[runs["run_id"] == "nr8_s0", "status"] = "failed"
    joined = analysis.run_evals(runs, evals)
    assert set(joined["run_id"]) == {"nr2_s0", "nr4_s0"}
    assert (joined["b"] == joined["n"] * joined["b_problem"]).all()
    assert set(analysis.run_evals(runs, evals, statuses=None)["run_id"]) == set(runs["run_id"])
    with pytest.raises(ValueError, match=r"runs: missing columns \['b_problem'\]"):
        analysis.run_evals(runs.drop(columns=["b_problem"]), evals)
    with pytest.raises(ValueError, match=r"runs\.n: expected positive integers"):
        analysis.run_evals(runs.assign(n=0), evals)


def test_record_points_are_first_of_each_new_bin():
    run, evals = _run("r", 4, 8, [0, 1, 2, 3, 4, 5], lambda s, c: np.array([0.1, 0.25, 0.18, 0.31, 0.29, 0.42]))
    pts = analysis.record_points(analysis.run_evals(pd.DataFrame([run]), evals), bin_width=0.1)
    assert pts["is_record"].tolist() == [True, True, False, True, False, True]
    with pytest.raises(ValueError, match="bin_width"):
        analysis.record_points(pts, bin_width=0.0)


# ---------------------------------------------------------------------------
# frontier, n*, epochs at transitions


def test_frontier_over_n_picks_the_right_n_at_low_and_high_compute(rollout_points):
    res = analysis.frontier_analysis(rollout_points, "n", grid_points=40)
    fr = res.frontier
    assert (fr["design"] == "n").all() and (fr["fixed"] == "all").all() and len(fr) == 40
    lo, hi = fr.iloc[0], fr.iloc[-1]
    assert lo["best_key"] == _true_best_n(lo["c"]) == 2
    assert hi["best_key"] == _true_best_n(hi["c"]) == 8
    # the per-n sigmoids recover their midpoints (noise-free record points)
    sig = res.fits[res.fits["kind"] == "sigmoid_n"].set_index("key")
    assert list(sig.index) == [2, 4, 8] and (sig["status"] == "ok").all()
    for n, (_, a, c_mid, _) in CURVES.items():
        assert sig.loc[n, "c_mid"] == pytest.approx(c_mid, rel=0.1)
        assert sig.loc[n, "a"] == pytest.approx(a, abs=0.02)
    # n* rises from 2 to 8: the logistic in log10 C is fitted and follows it
    (ns,) = res.fits[res.fits["kind"] == "n_star"].to_dict("records")
    assert ns["status"] == "ok" and ns["hi"] > ns["lo"]
    assert fr["n_star_fit"].iloc[0] < 3 and fr["n_star_fit"].iloc[-1] > 6


def test_epochs_at_transitions_come_from_the_epochs_column(rollout_points):
    res = analysis.frontier_analysis(rollout_points, "n", grid_points=60)
    tr = res.transitions
    assert list(zip(tr["from_key"], tr["to_key"], strict=True)) == [(2, 4), (4, 8)]
    grid = res.frontier["c"].to_numpy()
    for _, row in tr.iterrows():
        # the true crossing of the two curves lies within one grid step before the reported C
        f, t = CURVES[row["from_key"]], CURVES[row["to_key"]]
        cross = brentq(lambda c: float(_sigmoid(c, *t) - _sigmoid(c, *f)), 1e3, 1e6)
        i = int(np.searchsorted(grid, row["c"]))
        assert grid[i - 1] <= cross * 1.03 and cross <= row["c"] * 1.03
        # epochs = step * B_problem / D with step = C / (n B_problem): C / (n D) for the new best run
        assert row["epochs"] == pytest.approx(row["c"] / (row["to_key"] * D), rel=1e-6)


def test_frontier_starts_where_it_has_risen_above_the_base():
    # n = 8 has a slightly higher fitted base reward: at tiny C it "wins" on R0 alone
    out = []
    for n, (r0, a, c_mid, beta) in CURVES.items():
        r0 = r0 + (0.005 if n == 8 else 0.0)
        m = C_MAX // (n * 8)
        steps = np.unique(np.r_[0, np.geomspace(1, m, 60).astype(int)])
        out.append(_run(f"nr{n}", n, 8, steps, lambda s, c, t=(r0, a, c_mid, beta): _sigmoid(c, *t)))
    pts = analysis.record_points(analysis.run_evals(*_study(out)), 0.002)  # fine bins: R0 well determined
    naive = analysis.frontier_analysis(pts, "n", grid_points=60)
    assert naive.frontier["best_key"].iloc[0] == 8 and naive.transitions["from_key"].iloc[0] == 8
    res = analysis.frontier_analysis(pts, "n", grid_points=60, min_gain=0.01)
    fr = res.frontier
    assert fr["c"].iloc[0] > naive.frontier["c"].iloc[0]
    assert fr["frontier_reward"].iloc[0] == pytest.approx(naive.frontier["frontier_reward"].iloc[0] + 0.01, abs=2e-3)
    assert fr["best_key"].iloc[0] == 2 and fr["best_key"].iloc[-1] == 8
    assert list(zip(res.transitions["from_key"], res.transitions["to_key"], strict=True)) == [(2, 4), (4, 8)]
    # a frontier that never rises by min_gain has no n*: the row says so
    flat = analysis.frontier_analysis(pts, "n", grid_points=20, min_gain=0.9)
    (row,) = flat.fits[flat.fits["kind"] == "n_star"].to_dict("records")
    assert row["status"] == "the frontier gains less than 0.9 over the c range: n* not resolved"
    assert flat.transitions.empty and flat.frontier["n_star_fit"].isna().all()
    with pytest.raises(ValueError, match="min_gain"):
        analysis.frontier_analysis(pts, "n", min_gain=-1.0)


def test_b_problem_design_with_n_fixed():
    out = []
    for b_problem, theta in ((4, (0.1, 0.5, 3e3, 2.0)), (16, (0.1, 0.6, 2e4, 2.0)), (64, (0.1, 0.7, 1e5, 2.0))):
        m = 2_000_000 // (4 * b_problem)
        steps = np.unique(np.r_[0, np.geomspace(1, m, 60).astype(int)])
        out.append(_run(f"np{b_problem}", 4, b_problem, steps, lambda s, c, t=theta: _sigmoid(c, *t)))
    runs, evals = _study(out)
    pts = analysis.record_points(analysis.run_evals(runs, evals), 0.01)
    res = analysis.frontier_analysis(pts, "b_problem", grid_points=30)
    assert (res.frontier["fixed"] == "n=4").all()
    assert res.frontier["best_key"].iloc[0] == 4 and res.frontier["best_key"].iloc[-1] == 64
    assert set(res.fits["kind"]) == {"sigmoid_b_problem", "n_star_b_problem"}
    # one n only: the n design says why instead of fitting
    (row,) = analysis.frontier_analysis(pts, "n").fits.to_dict("records")
    assert row["kind"] == "n_star" and row["status"].startswith("only one n (4)")


def test_iso_batch_frontier_is_in_optimizer_steps():
    out = []
    b_total = 64
    for n, theta in ((2, (0.1, 0.5, 30.0, 2.0)), (8, (0.1, 0.65, 120.0, 2.0)), (32, (0.1, 0.8, 500.0, 2.0))):
        steps = np.arange(0, 3001, 5)
        out.append(_run(f"iso_n{n}", n, b_total // n, steps, lambda s, c, t=theta: _sigmoid(s, *t)))
    runs, evals = _study(out)
    pts = analysis.record_points(analysis.run_evals(runs, evals), 0.01)
    res = analysis.frontier_analysis(pts, "iso_batch", grid_points=30)
    fr = res.frontier
    assert (fr["fixed"] == "B=64").all()
    np.testing.assert_allclose(fr["c"], fr["m"] * b_total)
    assert fr["best_key"].iloc[0] == 2 and fr["best_key"].iloc[-1] == 32
    (ns,) = res.fits[res.fits["kind"] == "n_star_iso_batch"].to_dict("records")
    assert ns["status"] == "ok"
    # epochs at an iso-batch transition: M * B_problem / D of the new best n
    assert list(zip(res.transitions["from_key"], res.transitions["to_key"], strict=True)) == [(2, 8), (8, 32)]
    for _, row in res.transitions.iterrows():
        assert row["epochs"] == pytest.approx(row["m"] * (b_total // row["to_key"]) / D, rel=1e-6)


def test_too_few_runs_or_points_give_status_rows_not_errors():
    # one run: no frontier in any design, no S(B) fit, no CRS comparison
    run, evals = _run("only", 4, 8, [0, 10, 20], lambda s, c: 0.1 + s / 100)
    ev = analysis.run_evals(pd.DataFrame([run]), evals)
    pts = analysis.record_points(ev, 0.01)
    for design in analysis.DESIGNS:
        res = analysis.frontier_analysis(pts, design)
        assert res.frontier.empty and res.transitions.empty
        (row,) = res.fits.to_dict("records")
        assert row["kind"].startswith("n_star") and row["status"] != "ok" and row["n_points"] == 0
    st = analysis.steps_to_target_analysis(ev, target=0.2)
    assert st.steps_to_target.empty and set(st.fits["kind"]) == {"steps_to_target_prompt", "steps_to_target_rollout"}
    assert (st.fits["status"] != "ok").all()
    (crs,) = analysis.crs_prediction(ev, None).to_dict("records")
    assert "no runs with two or more n" in crs["status"]

    # two n with only 3 evaluations each: the sigmoids are "too few points", the n* row names them
    out = [_run(f"n{n}", n, 8, [0, 10, 20], lambda s, c: 0.1 + s / 100) for n in (2, 4)]
    pts = analysis.record_points(analysis.run_evals(*_study(out)), 0.01)
    fits = analysis.frontier_analysis(pts, "n").fits
    assert (fits.loc[fits["kind"] == "sigmoid_n", "status"] == "too few points (2 < 4)").all()
    (ns,) = fits[fits["kind"] == "n_star"].to_dict("records")
    assert ns["status"].startswith("no usable sigmoid fit (n=2: too few points")

    # nothing left after the status filter
    empty = analysis.run_evals(pd.DataFrame([run]).assign(status="failed"), evals)
    assert empty.empty
    assert analysis.frontier_analysis(analysis.record_points(empty, 0.01), "n").fits["status"].tolist() == [
        "no evaluations of finished runs"
    ]
    assert analysis.crs_prediction(empty, None)["status"].tolist() == ["no evaluations of finished runs"]


# ---------------------------------------------------------------------------
# steps to target


def _cbs_runs(axis, s_min, b_crit, batches, target=0.5, base=0.2):
    """Runs whose reward rises linearly to the target exactly at S(B) = S_min (1 + B_crit / B)."""
    out = []
    for b in batches:
        # prompt axis: n = 4; rollout axis: B_problem = 2 (no run lies on both)
        n, b_problem = (4, b // 4) if axis == "prompt" else (b // 2, 2)
        s_true = s_min * (1 + b_crit / b)
        steps = np.arange(0, int(s_true * 1.2) + 2)
        out.append(_run(f"{axis}_{b}", n, b_problem, steps,
                        lambda s, c, st=s_true: base + (target - base) * s / st, c_max=10**9))
    return out


def test_steps_to_target_recovers_s_min_and_b_crit_on_both_axes():
    prompt = _cbs_runs("prompt", 500.0, 64.0, (16, 32, 64, 128, 256))
    rollout = _cbs_runs("rollout", 300.0, 32.0, (16, 32, 64, 128, 256))
    ev = analysis.run_evals(*_study(prompt + rollout))
    res = analysis.steps_to_target_analysis(ev, target=0.5)
    fits = res.fits.set_index("kind")
    for axis, s_min, b_crit in (("prompt", 500.0, 64.0), ("rollout", 300.0, 32.0)):
        row = fits.loc[f"steps_to_target_{axis}"]
        assert row["status"] == "ok" and row["target_source"] == "params"
        assert row["s_min"] == pytest.approx(s_min, rel=0.01)
        assert row["b_crit"] == pytest.approx(b_crit, rel=0.02)
        assert row["e_min"] == pytest.approx(s_min * b_crit, rel=0.02)
    st = res.steps_to_target
    assert set(st["axis"]) == {"prompt", "rollout"} and st["reached"].all()
    np.testing.assert_allclose(st["e"], st["b"] * st["steps"])
    assert (st.loc[st["axis"] == "prompt", "n"] == 4).all()
    assert (st.loc[st["axis"] == "rollout", "b_problem"] == 2).all()
    # S is the first evaluated step at or above the target
    r = st[st["run_id"] == "prompt_64"].iloc[0]
    assert r["steps"] == math.ceil(500 * (1 + 64 / 64) - 1e-9)


def test_steps_to_target_default_target_and_runs_that_never_reach_it():
    runs = _cbs_runs("prompt", 100.0, 64.0, (16, 64, 256))
    ev = analysis.run_evals(*_study(runs))
    value, source = analysis.target_reward(ev)
    # base 0.2 at step 0, best reached 0.2 + 0.3 * 1.2 (runs go on to 1.2 S): half the gain on top of base
    best = ev["avg_at_k"].max()
    assert value == pytest.approx(0.2 + 0.5 * (best - 0.2))
    assert source.startswith("default: step-0 base 0.2 + 0.5")
    res = analysis.steps_to_target_analysis(ev)
    assert (res.steps_to_target["target_source"] == source).all()
    # a target above every run: none reaches it, the fit row says so
    res = analysis.steps_to_target_analysis(ev, target=0.99)
    assert not res.steps_to_target["reached"].any() and res.steps_to_target["steps"].isna().all()
    (row,) = res.fits[res.fits["kind"] == "steps_to_target_prompt"].to_dict("records")
    assert "3 never reached the target 0.99" in row["status"] and row["n_not_reached"] == 3
    with pytest.raises(ValueError, match="target"):
        analysis.target_reward(ev, target=1.5)


# ---------------------------------------------------------------------------
# CRS prediction check


def _final_reward_runs(b_problem_of, rewards, c_max=40_000):
    out = []
    for n, final in rewards.items():
        out.append(_run(f"n{n}", n, b_problem_of(n), [0, 10, 20], lambda s, c, f=final: 0.1 + (f - 0.1) * s / 20,
                        c_max=c_max))
    return out


def test_crs_prediction_iso_batch_with_measured_crs():
    runs = _final_reward_runs(lambda n: 64 // n, {2: 0.40, 4: 0.55, 8: 0.50, 16: 0.45})
    ev = analysis.run_evals(*_study(runs))
    noise_steps = pd.DataFrame({"step": [0, 10, 20, 0, 10, 20], "n": [8, 8, 8, 16, 16, 16],
                                "crs": [40.0, 40.0, 40.0, 3.0, 5.0, math.inf]})
    assert analysis.measured_crs(noise_steps) == (5.0, 16, "ok")
    (row,) = analysis.crs_prediction(ev, noise_steps).to_dict("records")
    assert row["basis"] == "iso-batch: B = 64" and row["b"] == 64
    assert row["crs"] == 5.0 and row["crs_n"] == 16
    assert row["predicted_n"] == 4 and row["observed_best_n"] == 4 and row["agree"] is True
    assert row["observed_best_reward"] == pytest.approx(0.55)
    assert row["status"] == "ok"


def test_crs_prediction_without_measurement_or_shared_batch():
    # rollout axis (B_problem fixed, B varies with n): falls back to same B_problem and C_max
    runs = _final_reward_runs(lambda n: 8, {2: 0.40, 4: 0.55, 8: 0.60})
    ev = analysis.run_evals(*_study(runs))
    (row,) = analysis.crs_prediction(ev, None).to_dict("records")
    assert row["basis"].startswith("same B_problem = 8 and C_max = 40000")
    assert math.isnan(row["b"]) and row["b_problem"] == 8
    assert row["observed_best_n"] == 8 and pd.isna(row["predicted_n"]) and pd.isna(row["agree"])
    assert "not measured" in row["status"]


# ---------------------------------------------------------------------------
# bootstrap intervals over seeds (science §7, "Uncertainty, honestly")


def _noisy_seeds_study(seeds):
    rng = np.random.default_rng(5)
    out = []
    for n, (r0, a, c_mid, beta) in CURVES.items():
        m = C_MAX // (n * 8)
        steps = np.unique(np.r_[0, np.geomspace(1, m, 40).astype(int)])
        for seed in seeds:
            theta = (r0, a + rng.normal(0, 0.02), c_mid * 10 ** rng.normal(0, 0.05), beta)
            out.append(_run(f"nr{n}_s{seed}", n, 8, steps, lambda s, c, t=theta: _sigmoid(c, *t), seed=seed,
                            c_max=C_MAX))
    return analysis.record_points(analysis.run_evals(*_study(out)), bin_width=0.01)


def test_frontier_intervals_from_seeds_and_none_from_one_seed():
    from rollscale.core.fit.bootstrap import ONE_SEED, Bootstrap

    boot = Bootstrap(100, 0)
    t = analysis.frontier_analysis(_noisy_seeds_study((0, 1, 2, 3)), "n", grid_points=20, boot=boot)
    sig = t.fits[t.fits["kind"] == "sigmoid_n"].set_index("key")
    for n, (_, a, c_mid, _) in CURVES.items():
        assert sig.loc[n, "a_lo"] <= sig.loc[n, "a"] <= sig.loc[n, "a_hi"]
        assert sig.loc[n, "a_lo"] - 0.03 <= a <= sig.loc[n, "a_hi"] + 0.03
        assert sig.loc[n, "c_mid_lo"] < sig.loc[n, "c_mid_hi"] and sig.loc[n, "n_seeds"] == 4
    fr = t.frontier
    assert fr["best_key_share"].between(0, 1).all() and (fr["best_key_share"] > 0.5).mean() > 0.8
    assert (fr["best_key_lo"] <= fr["best_key"].astype(float)).all()
    assert (fr["frontier_reward_lo"] <= fr["frontier_reward_hi"]).all()
    # the same study twice with the same seed gives the same intervals
    again = analysis.frontier_analysis(_noisy_seeds_study((0, 1, 2, 3)), "n", grid_points=20, boot=boot)
    pd.testing.assert_frame_equal(t.frontier, again.frontier)

    one = analysis.frontier_analysis(_noisy_seeds_study((0,)), "n", grid_points=20, boot=boot)
    sig1 = one.fits[one.fits["kind"] == "sigmoid_n"]
    assert sig1["a_lo"].isna().all() and (sig1["interval"] == ONE_SEED).all()
    assert one.frontier["best_key_share"].isna().all()


def test_steps_to_target_intervals_from_seeds():
    from rollscale.core.fit.bootstrap import Bootstrap

    rng = np.random.default_rng(3)
    out = []
    for seed in range(4):
        for b in (16, 32, 64, 128, 256):
            s_true = 400.0 * 10 ** rng.normal(0, 0.03) * (1 + 48.0 / b)
            steps = np.arange(0, int(s_true * 1.2) + 2)
            out.append(_run(f"p{b}_s{seed}", 4, b // 4, steps, lambda s, c, st=s_true: 0.2 + 0.3 * s / st,
                            seed=seed, c_max=10**9))
    ev = analysis.run_evals(*_study(out))
    row = analysis.steps_to_target_analysis(ev, target=0.5, boot=Bootstrap(200, 1)).fits.set_index("kind").loc[
        "steps_to_target_prompt"]
    assert row["n_seeds"] == 4
    for q, truth in (("s_min", 400.0), ("b_crit", 48.0), ("e_min", 400.0 * 48)):
        assert row[f"{q}_lo"] < row[q] < row[f"{q}_hi"]
        assert row[f"{q}_lo"] * 0.9 < truth < row[f"{q}_hi"] * 1.1


# ---------------------------------------------------------------------------
# what the fit saw (science §8, A1-A3)


def _truncated(points, n, c_stop):
    """The study as a search that stopped n's runs at C = c_stop left it."""
    keep = (points["n"] != n) | (points["c"] <= c_stop)
    return analysis.record_points(points[keep].drop(columns="is_record"), bin_width=0.01)


def test_a_grid_study_is_not_touched_by_the_reach_and_says_so():
    from rollscale.core.fit.bootstrap import Bootstrap

    pts = _noisy_seeds_study((0, 1, 2))
    near = analysis.frontier_analysis(pts, "n", grid_points=30, boot=Bootstrap(50, 0), reach_factor=1.0)
    far = analysis.frontier_analysis(pts, "n", grid_points=30, boot=Bootstrap(50, 0), reach_factor=100.0)
    pd.testing.assert_frame_equal(near.frontier, far.frontier)
    assert not near.frontier["extrapolated"].any() and (near.frontier["extrapolated_keys"] == "").all()
    ns = near.fits.set_index("kind").loc["n_star"]
    assert math.isnan(ns["extrapolated_from"])
    (a2,) = near.fits[near.fits["kind"] == "a2_check"].to_dict("records")
    assert a2["a2_holds"] is True and a2["status"].startswith("A2 holds")


def test_a_stopped_key_is_used_within_its_reach_and_beyond_only_where_it_could_still_win():
    from rollscale.core.fit.bootstrap import Bootstrap

    pts = _noisy_seeds_study((0, 1, 2))
    boot = Bootstrap(50, 0)
    # n = 8 wins late but was stopped at 30,000 before it bent: beyond 60,000 only its A bound (up to 1) speaks
    t = analysis.frontier_analysis(_truncated(pts, 8, 30_000), "n", grid_points=30, boot=boot)
    fr = t.frontier
    beyond = fr["c"] > 60_000 * 1.0001
    assert fr.loc[beyond, "extrapolated"].all() and (fr.loc[beyond, "extrapolated_keys"] == "8").all()
    assert not fr.loc[~beyond, "extrapolated"].any()
    ns = t.fits.set_index("kind").loc["n_star"]
    assert ns["extrapolated_from"] == pytest.approx(fr.loc[beyond, "c"].min())
    # n = 2 bent early at a low asymptote: beyond its reach it cannot win, so it leaves the max unmarked
    t2 = analysis.frontier_analysis(_truncated(pts, 2, 20_000), "n", grid_points=30, boot=boot)
    assert not t2.frontier["extrapolated"].any()
    assert set(t2.frontier.loc[t2.frontier["c"] > 40_000, "best_key"].astype(int)) <= {4, 8}


def test_asymptotes_of_mean_rewards_are_bounded_by_one():
    # curves that have not bent within the data: a free fit runs A past 1, a mean of 0/1 rewards cannot
    runs = [_run(f"nr{n}", n, 8, np.unique(np.geomspace(1000 / (8 * n), 40_000 / (8 * n), 30).astype(int)),
                 lambda s, c, k=k, n=n: 0.45 + k * np.log10(c / 1000.0)
                 + np.random.default_rng(n).normal(0, 0.003, len(c))) for n, k in ((2, 0.15), (4, 0.13))]
    pts = analysis.record_points(analysis.run_evals(*_study(runs)), bin_width=0.01)
    sig = analysis.frontier_analysis(pts, "n").fits.set_index("kind").loc["sigmoid_n"]
    assert (sig["a"] <= 1.0 + 1e-9).all() and sig["at_bound"].str.contains("a").any()
    scaled = pts.assign(avg_at_k=pts["avg_at_k"] * 3)  # a reward that is no mean of 0/1 rewards: no bound
    assert (analysis.frontier_analysis(scaled, "n").fits.set_index("kind").loc["sigmoid_n", "a"] > 3.0).any()


def test_a_falling_n_star_fails_the_a2_check():
    falling = {2: (0.1, 0.75, 20_000.0, 2.0), 4: (0.1, 0.6, 6_000.0, 2.0), 8: (0.1, 0.45, 2_000.0, 2.0)}
    rng = np.random.default_rng(1)
    out = []
    for n, (r0, a, c_mid, beta) in falling.items():
        steps = np.unique(np.r_[0, np.geomspace(1, C_MAX // (n * 8), 40).astype(int)])
        for seed in range(3):
            theta = (r0, a + rng.normal(0, 0.01), c_mid, beta)
            out.append(_run(f"nr{n}_s{seed}", n, 8, steps, lambda s, c, t=theta: _sigmoid(c, *t), seed=seed,
                            c_max=C_MAX))
    pts = analysis.record_points(analysis.run_evals(*_study(out)), bin_width=0.01)
    from rollscale.core.fit.bootstrap import Bootstrap

    (row,) = analysis.frontier_analysis(pts, "n", boot=Bootstrap(50, 0)).fits.query("kind == 'a2_check'").to_dict(
        "records")
    assert row["a2_holds"] is False and row["status"].startswith("A2 violated: n* falls from 8")
