"""Allocation rules against uniform GRPO: rollouts and step seconds to a target reward (science §4, §7)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from rollscale.core.fit import analysis
from rollscale.core.fit.bootstrap import Bootstrap
from tests.test_analysis import _run, _study

STEP_SECONDS = ["t_generate", "t_score", "t_train"]


def test_rule_comparison_states_the_ratio_interval_and_when_rules_cannot_be_told_apart():
    rng = np.random.default_rng(9)
    out = []
    steps = np.arange(0, 200, 5)
    # pods reaches the target in half the steps of uniform; dynamic is uniform up to seed noise
    for rule, speed in (("uniform", 1.0), ("pods", 2.0), ("dynamic", 1.0)):
        for seed in range(4):
            rate = speed * 10 ** rng.normal(0, 0.05) / 40.0
            out.append(_run(f"{rule}_s{seed}", 4, 8, steps, lambda s, c, r=rate: 0.1 + 0.5 * (1 - np.exp(-r * s)),
                            rule=rule, seed=seed))
    evals = analysis.run_evals(*_study(out))
    t = analysis.rule_comparison(evals, target=0.4, boot=Bootstrap(200, 0)).set_index("rule")
    assert set(t["kind"]) == {"rollouts_to_target"} and (t["n_reached"] == 4).all()
    assert t.loc["pods", "ratio_to_uniform"] == pytest.approx(0.5, abs=0.1)
    assert t.loc["pods", "ratio_to_uniform_hi"] < 1 and t.loc["pods", "verdict"] == "fewer rollouts than uniform"
    assert t.loc["dynamic", "ratio_to_uniform_lo"] <= 1 <= t.loc["dynamic", "ratio_to_uniform_hi"]
    assert t.loc["dynamic", "verdict"] == "not distinguishable from uniform"
    assert (t["rollouts_lo"] <= t["rollouts"]).all() and (t["rollouts"] <= t["rollouts_hi"]).all()
    one = analysis.rule_comparison(evals[evals["seed"] == 0], target=0.4, boot=Bootstrap(200, 0)).set_index("rule")
    assert one["rollouts_lo"].isna().all() and one.loc["pods", "verdict"].startswith("no interval")


def _timed_study(rng: np.random.Generator) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Uniform and PODS with the same reward curves per seed, PODS's steps taking half the seconds.

    A fourth uniform seed never reaches the target. Evaluations carry a large ``t_eval``, which
    is not step time.
    """
    eval_steps, out, step_rows = np.arange(0, 101, 5), [], []
    rates = [10 ** rng.normal(0, 0.05) / 40.0 for _ in range(3)] + [0.0]
    for rule, cost in (("uniform", 1.0), ("pods", 0.5)):
        for seed, rate in enumerate(rates if rule == "uniform" else rates[:3]):
            run_id = f"{rule}_s{seed}"
            out.append(_run(run_id, 4, 8, eval_steps, lambda s, c, r=rate: 0.1 + 0.5 * (1 - np.exp(-r * s)),
                            rule=rule, seed=seed))
            seconds = cost * 10 ** rng.normal(0, 0.05, size=100)
            step_rows.append(pd.DataFrame({"run_id": run_id, "step": np.arange(1, 101), "t_generate": 0.6 * seconds,
                                           "t_score": 0.1 * seconds, "t_train": 0.3 * seconds}))
    runs, evals = _study(out)
    return analysis.run_evals(runs, evals.assign(t_eval=1e3)), pd.concat(step_rows, ignore_index=True)


def _expected_seconds(evals: pd.DataFrame, steps: pd.DataFrame, rule: str, target: float) -> float:
    """Mean over the runs that reached ``target`` of their step seconds up to the first evaluation there."""
    per_run = []
    for run_id, r in evals[evals["rule"] == rule].groupby("run_id"):
        hit = r.loc[r["avg_at_k"] >= target, "step"]
        if len(hit):
            s = steps[(steps["run_id"] == run_id) & (steps["step"] <= hit.min())]
            per_run.append(s[STEP_SECONDS].to_numpy().sum())
    return float(np.mean(per_run))


def test_step_seconds_to_target_show_a_cheaper_step_that_rollouts_do_not():
    evals, steps = _timed_study(np.random.default_rng(4))
    boot = Bootstrap(200, 0)
    t = analysis.rule_comparison(evals, target=0.4, boot=boot, steps=steps).set_index("rule")
    assert t.loc["uniform", "n_seeds"] == 4 and t.loc["uniform", "n_reached"] == 3  # s3 never got there
    for rule in ("uniform", "pods"):
        assert t.loc[rule, "seconds"] == pytest.approx(_expected_seconds(evals, steps, rule, 0.4))
        assert t.loc[rule, "seconds_lo"] <= t.loc[rule, "seconds"] <= t.loc[rule, "seconds_hi"]
    # same curves per seed: the same steps and rollouts to target, at half the step time
    assert t.loc["pods", "ratio_to_uniform"] == pytest.approx(1.0)
    assert t.loc["pods", "verdict"] == "not distinguishable from uniform"
    assert t.loc["pods", "time_ratio_to_uniform"] == pytest.approx(0.5, abs=0.05)
    assert t.loc["pods", "time_ratio_to_uniform_lo"] <= 0.5 <= t.loc["pods", "time_ratio_to_uniform_hi"] < 1
    assert t.loc["pods", "time_verdict"] == "less step time than uniform"
    assert np.isnan(t.loc["uniform", "time_ratio_to_uniform"])
    # adding the time columns leaves the rollout columns and their intervals as they were
    plain = analysis.rule_comparison(evals, target=0.4, boot=boot).set_index("rule")
    rollout_cols = ["steps", "steps_lo", "rollouts", "rollouts_hi", "ratio_to_uniform_lo", "verdict"]
    pd.testing.assert_frame_equal(plain[rollout_cols], t[rollout_cols])
    # without step timings the time columns are there, NaN, and say why
    no_score = analysis.rule_comparison(evals, target=0.4, boot=boot, steps=steps.drop(columns="t_score"))
    untimed = [plain, no_score.set_index("rule")]
    for u in untimed:
        time_cols = ["seconds", "seconds_lo", "seconds_hi", "time_ratio_to_uniform", "time_ratio_to_uniform_lo",
                     "time_ratio_to_uniform_hi"]
        assert u[time_cols].isna().all().all()
        assert u.loc["pods", "time_verdict"].startswith("no step timings")


def test_step_seconds_need_every_step_up_to_the_hit():
    evals, steps = _timed_study(np.random.default_rng(5))
    # pods_s0's step rows stop at step 10 and pods_s1's step 3 has no timing: their seconds are unknown
    steps = steps[~((steps["run_id"] == "pods_s0") & (steps["step"] > 10))].copy()
    steps.loc[(steps["run_id"] == "pods_s1") & (steps["step"] == 3), "t_train"] = np.nan
    t = analysis.rule_comparison(evals, target=0.4, boot=Bootstrap(200, 0), steps=steps).set_index("rule")
    hit = evals[(evals["run_id"] == "pods_s2") & (evals["avg_at_k"] >= 0.4)]["step"].min()
    only = steps[(steps["run_id"] == "pods_s2") & (steps["step"] <= hit)][STEP_SECONDS].to_numpy().sum()
    assert t.loc["pods", "n_reached"] == 3 and t.loc["pods", "seconds"] == pytest.approx(only)
    assert t.loc["pods", "time_ratio_to_uniform"] == pytest.approx(only / t.loc["uniform", "seconds"])
    # a target met at step 0 is reached with 0 rollouts and 0 seconds: ratios 0 / 0, not an error
    zero = analysis.rule_comparison(evals, target=0.0, steps=steps).set_index("rule")
    assert (zero["seconds"] == 0).all() and np.isnan(zero.loc["pods", "time_ratio_to_uniform"])
