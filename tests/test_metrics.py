"""Tests of the evaluation metrics (science §5)."""

import math

import numpy as np
import pytest

from rollscale.core.metrics import avg_at_k, best_at_k, standard_error, worst_at_k


def test_best_and_worst_match_exact_binomials_on_a_grid():
    for n in range(1, 13):
        for c in range(0, n + 1):
            for k in range(1, n + 1):
                best = 1 - math.comb(n - c, k) / math.comb(n, k)
                worst = math.comb(c, k) / math.comb(n, k)
                assert best_at_k(n, c, k) == pytest.approx(best, abs=1e-12)
                assert worst_at_k(n, c, k) == pytest.approx(worst, abs=1e-12)


def test_edge_cases():
    assert best_at_k(8, 0, 4) == 0.0
    assert worst_at_k(8, 0, 4) == 0.0
    assert best_at_k(8, 8, 4) == 1.0
    assert worst_at_k(8, 8, 4) == 1.0
    # k = N: best is "any correct", worst is "all correct"
    assert best_at_k(4, 1, 4) == 1.0
    assert worst_at_k(4, 3, 4) == 0.0
    assert worst_at_k(4, 4, 4) == 1.0
    # k = 1 reduces to the mean
    assert best_at_k(10, 3, 1) == pytest.approx(0.3)
    assert worst_at_k(10, 3, 1) == pytest.approx(0.3)
    # N - c < k: certainly at least one correct
    assert best_at_k(5, 3, 3) == 1.0


def test_large_n_is_stable():
    # C(1000, 500) overflows floats; the product form does not
    val = best_at_k(1000, 1, 500)
    assert val == pytest.approx(0.5, abs=1e-12)
    assert worst_at_k(1000, 999, 500) == pytest.approx(0.5, abs=1e-12)


def test_vectorized_matches_scalar():
    n = np.array([4, 8, 16, 16, 5])
    c = np.array([0, 3, 16, 7, 2])
    k = 4
    best = best_at_k(n, c, k)
    worst = worst_at_k(n, c, k)
    assert isinstance(best, np.ndarray) and best.shape == (5,)
    for i in range(5):
        assert best[i] == pytest.approx(best_at_k(int(n[i]), int(c[i]), k), abs=1e-15)
        assert worst[i] == pytest.approx(worst_at_k(int(n[i]), int(c[i]), k), abs=1e-15)
    # per-element k broadcasts too
    ks = np.array([1, 2, 3, 4, 5])
    np.testing.assert_allclose(best_at_k(n, c, ks), [best_at_k(int(a), int(b), int(kk)) for a, b, kk in zip(n, c, ks)])
    # 2-D input
    assert best_at_k(np.full((2, 3), 8), np.arange(6).reshape(2, 3), 2).shape == (2, 3)
    np.testing.assert_allclose(avg_at_k(c, n), c / n)
    assert isinstance(avg_at_k(3, 4), float) and avg_at_k(3, 4) == 0.75


def test_best_at_k_is_unbiased_monte_carlo():
    # The estimator from N samples, averaged over draws of k of them, equals the empirical
    # probability that a random k-subset contains a correct sample.
    rng = np.random.default_rng(0)
    n, c, k = 10, 3, 4
    samples = np.array([1] * c + [0] * (n - c))
    trials = 40_000
    hits = sum(samples[rng.choice(n, size=k, replace=False)].any() for _ in range(trials))
    est = hits / trials
    se = math.sqrt(est * (1 - est) / trials)
    assert abs(est - best_at_k(n, c, k)) < 4 * se
    all_hits = sum(samples[rng.choice(n, size=2, replace=False)].all() for _ in range(trials))
    p = worst_at_k(n, c, 2)
    assert abs(all_hits / trials - p) < 4 * math.sqrt(p * (1 - p) / trials)


def test_best_at_k_unbiased_for_true_pass_rate():
    # Draw N Bernoulli(p) samples per problem; the mean of best@k over many problems
    # estimates 1 - (1 - p)^k without bias.
    rng = np.random.default_rng(1)
    p, n, k = 0.2, 8, 3
    correct = rng.binomial(n, p, size=60_000)
    vals = best_at_k(np.full_like(correct, n), correct, k)
    truth = 1 - (1 - p) ** k
    assert abs(vals.mean() - truth) < 4 * vals.std() / math.sqrt(vals.size)


@pytest.mark.parametrize(
    "args",
    [(3, 1, 4), (4, 5, 2), (4, -1, 2), (4, 1, 0), (4.5, 1, 2), (4, 1, 2.5), (np.array([4, 2]), np.array([1, 1]), 3),
     (True, 1, 1)],
)
def test_validation(args):
    with pytest.raises(ValueError):
        best_at_k(*args)
    with pytest.raises(ValueError):
        worst_at_k(*args)


def test_avg_at_k_validation():
    with pytest.raises(ValueError):
        avg_at_k(5, 4)
    with pytest.raises(ValueError):
        avg_at_k(0, 0)


def test_standard_error():
    assert standard_error([1.0, 0.0, 1.0, 0.0]) == pytest.approx(math.sqrt(1 / 3) / 2)
    assert standard_error(np.array([0.5, 0.5, 0.5])) == 0.0
    with pytest.raises(ValueError):
        standard_error([1.0])
    with pytest.raises(ValueError):
        standard_error([1.0, float("nan")])
    with pytest.raises(ValueError):
        standard_error([[1.0, 2.0]])
