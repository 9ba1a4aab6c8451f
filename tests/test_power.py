"""What a study can resolve (rollscale.core.fit.power), checked against simulation and the run loop."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rollscale.core.fit import power


def loop_evaluations(steps: int, eval_every: int) -> int:
    """The evaluations rollscale.train.run_loop.run makes, replayed step by step."""
    evals, last = 1, 0  # step 0
    for step in range(1, steps + 1):
        if step % eval_every == 0:
            evals, last = evals + 1, step
    return evals + (last != steps)


@pytest.mark.parametrize("steps,every", [(1, 1), (6, 2), (3, 2), (12, 6), (157, 20), (625, 20), (5, 10)])
def test_evaluations_per_run_match_the_run_loop(steps, every):
    assert power.evaluations_per_run(steps, every) == loop_evaluations(steps, every)


def test_steps_per_run_is_the_ceiling_of_the_budget():
    assert power.steps_per_run(40000, 256) == 157  # the default study's n = 16 runs
    assert power.steps_per_run(48, 16) == 3 and power.steps_per_run(49, 16) == 4
    with pytest.raises(ValueError, match="c_max"):
        power.steps_per_run(0, 16)
    with pytest.raises(ValueError, match="rollouts_per_step"):
        power.steps_per_run(10, True)


def test_avg_at_k_se_matches_a_simulated_validation_set():
    rng = np.random.default_rng(0)
    p = rng.uniform(0.3, 0.6, 40)  # 40 fixed Easy validation problems
    k = 4
    sims = rng.binomial(k, p, size=(20000, p.size)).mean(axis=1) / k
    var = float(np.mean(p * (1 - p)))
    assert power.avg_at_k_se(p.size, k, var) == pytest.approx(sims.std(), rel=0.03)
    # two runs with no real difference: a gap above the detectable difference 5 % of the time
    gaps = np.abs(sims[:10000] - sims[10000:])
    assert np.mean(gaps > power.detectable_difference(power.avg_at_k_se(p.size, k, var))) == pytest.approx(0.05, abs=0.01)


def test_pass_variance_is_unbiased_from_k_samples():
    rng = np.random.default_rng(1)
    p = rng.uniform(0, 1, 400)
    k = 4
    estimates = [power.pass_variance(rng.binomial(k, p) / k, k) for _ in range(400)]
    assert np.mean(estimates) == pytest.approx(np.mean(p * (1 - p)), rel=0.02)
    assert power.pass_variance([0.0, 1.0], 16) == 0.0
    with pytest.raises(ValueError, match="avg_at_k"):
        power.pass_variance([1.2], 4)


def test_interval_pass_variance_is_the_worst_case_in_the_bucket():
    assert power.interval_pass_variance(0.3, 0.6) == 0.25
    assert power.interval_pass_variance(0.0, 0.0625) == pytest.approx(0.0625 * 0.9375)
    assert power.interval_pass_variance(0.6, 0.9) == pytest.approx(0.24)


def _profile(rng, lengths, cap, k=16):
    """(mean_len, trunc_rate) per problem, as the profile records them, from full lengths."""
    cut = np.minimum(lengths, cap)
    return cut.mean(axis=1), (lengths >= cap).mean(axis=1)


def test_truncation_tail_of_exponential_lengths_is_recovered():
    rng = np.random.default_rng(2)
    means = rng.uniform(30, 120, 300)[:, None]
    lengths = np.ceil(rng.exponential(means, size=(300, 16)))
    mean_len, rate = _profile(rng, lengths, 48)
    assert rate.mean() > 0.3  # the situation: most rollouts cut at 48 tokens
    for new in (96, 192):
        # per-problem exponential tails: the estimate is close, with the sampling noise of 16 samples
        actual = float(np.mean(lengths >= new))
        got = power.truncated_share_at(mean_len, rate, 48, new)
        assert actual * 0.95 <= got <= actual * 1.5
    need = power.max_new_tokens_for_truncation(mean_len, rate, 48, 0.02)
    assert need % 16 == 0 and np.mean(lengths >= need) <= 0.02
    assert power.truncated_share_at(mean_len, rate, 48, need) <= 0.02 < power.truncated_share_at(mean_len, rate, 48, need - 16)


def test_truncation_estimate_errs_long_for_peaked_lengths():
    rng = np.random.default_rng(3)
    lengths = np.ceil(rng.gamma(4.0, 15.0, size=(200, 16)))  # a mode, as real answers have
    mean_len, rate = _profile(rng, lengths, 48)
    need = power.max_new_tokens_for_truncation(mean_len, rate, 48, 0.02)
    assert np.mean(lengths >= need) < 0.02


def test_truncation_edge_cases():
    assert power.max_new_tokens_for_truncation([10.0, 20.0], [0.0, 0.0], 48, 0.02) == 48
    assert power.max_new_tokens_for_truncation([48.0, 48.0], [1.0, 1.0], 48, 0.02) is None
    assert power.truncated_share_at([48.0], [1.0], 48, 96) == 1.0
    with pytest.raises(ValueError, match="target"):
        power.max_new_tokens_for_truncation([10.0], [0.5], 48, 1.5)
    with pytest.raises(ValueError, match="trunc_rate"):
        power.truncated_share_at([10.0], [2.0], 48, 96)


def test_epochs_and_detectable_difference():
    assert power.epochs_per_run(12, 8, 6) == 16.0  # the runs: 16 epochs in 12 steps
    assert power.detectable_difference(0.1) == pytest.approx(1.959963984540054 * math.sqrt(2) * 0.1)
    with pytest.raises(ValueError, match="pass_var"):
        power.avg_at_k_se(10, 4, 0.3)
