"""Noise estimators on Gram matrices of synthetic gradients with known truth (science §6)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from rollscale.core.noise import estimators as nz
from rollscale.core.noise import correlation as cor
from rollscale.core.noise import signal as sig
from rollscale.core.noise import summary as summ
from rollscale.core.noise.ema import EmaNoiseScale


def gaussian_grads(rng, n, g_true, sigma):
    """n i.i.d. gradients g_i = G + sigma * z_i; tr(Sigma) = d sigma^2."""
    return g_true + sigma * rng.standard_normal((n, g_true.size))


def grouped_grads(rng, n_prompts, n, dim, tau, sigma_w, mu):
    """g_pi = mu + u_p + e_pi; tb = dim tau^2, within noise = dim sigma_w^2."""
    u = tau * rng.standard_normal((n_prompts, 1, dim))
    e = sigma_w * rng.standard_normal((n_prompts, n, dim))
    return (mu + u + e).reshape(n_prompts * n, dim)


# ---------------------------------------------------------------------------
# §6.2 pieces and B_simple


def test_pieces_match_direct_formulas():
    rng = np.random.default_rng(0)
    g = rng.standard_normal((6, 5)) + 1.0
    k = g @ g.T
    gbar = g.mean(0)
    var = ((g - gbar) ** 2).sum() / 5
    solo = np.arange(6)  # one rollout per prompt: independent rows
    assert sig.trace_sigma(k, solo) == pytest.approx(var)
    cross = sum(g[i] @ g[j] for i in range(6) for j in range(6) if i != j) / 30
    assert sig.g_norm2(k, solo) == pytest.approx(cross)
    assert sig.g_norm2_all_pairs(k) == pytest.approx(cross)
    assert sig.b_simple(k, solo) == pytest.approx(var / cross)


def test_pieces_unbiased_and_b_simple_recovers_truth():
    rng = np.random.default_rng(1)
    dim, n, sigma = 200, 32, 0.5
    g_true = np.zeros(dim)
    g_true[:4] = 2.5  # |G|^2 = 25; tr(Sigma) = 50; B = 2
    ts, gs, bs = [], [], []
    for _ in range(300):
        g = gaussian_grads(rng, n, g_true, sigma)
        k = g @ g.T
        ts.append(sig.trace_sigma(k, np.arange(n)))
        gs.append(sig.g_norm2(k, np.arange(n)))
        bs.append(sig.b_simple(k, np.arange(n)))
    for vals, truth in ((ts, 50.0), (gs, 25.0), (bs, 2.0)):
        se = np.std(vals, ddof=1) / math.sqrt(len(vals))
        assert abs(np.mean(vals) - truth) < 4 * se + 1e-3 * truth


def test_b_naive_biased_toward_b_over_one_plus_b_over_n():
    """Where B >> N the plug-in |gbar|^2 carries tr(Sigma)/N: B_naive sits near B/(1+B/N)."""
    rng = np.random.default_rng(2)
    dim, n, sigma = 500, 32, 1.0
    g_true = np.zeros(dim)
    g_true[0] = 1.0  # |G|^2 = 1, tr(Sigma) = 500: B = 500
    naive, simple = [], []
    for _ in range(200):
        k = (g := gaussian_grads(rng, n, g_true, sigma)) @ g.T
        naive.append(sig.b_naive(k, 8))
        simple.append(sig.b_simple(k, np.arange(n)))
    assert np.mean(naive) == pytest.approx(500 / (1 + 500 / n), rel=0.05)
    assert np.mean(naive) < 0.1 * 500
    assert np.median(simple) == pytest.approx(500, rel=0.15)


def test_b_naive_matches_direct_formula_and_checks_input():
    rng = np.random.default_rng(3)
    g = rng.standard_normal((12, 7)) + 0.3
    k = g @ g.T
    batches = g.reshape(4, 3, 7).mean(1)
    gbar = g.mean(0)
    direct = 3 / 3 * ((batches - gbar) ** 2).sum() / (gbar @ gbar)
    assert sig.b_naive(k, 4) == pytest.approx(direct)
    with pytest.raises(ValueError, match="divide"):
        sig.b_naive(k, 5)
    with pytest.raises(ValueError, match="at least 2"):
        sig.b_naive(k, 1)


def test_gram_validation():
    with pytest.raises(ValueError, match="square"):
        sig.b_simple(np.ones((2, 3)), [0, 1])
    with pytest.raises(ValueError, match="symmetric"):
        sig.b_simple(np.array([[1.0, 2.0], [0.0, 1.0]]), [0, 1])
    with pytest.raises(ValueError, match="finite"):
        sig.b_simple(np.array([[1.0, np.nan], [np.nan, 1.0]]), [0, 1])
    with pytest.raises(ValueError, match="at least 2"):
        sig.b_simple(np.ones((1, 1)), [0])


def test_one_prompt_is_an_error_not_a_fallback():
    g = np.random.default_rng(0).standard_normal((4, 3))
    for fn in (sig.g_norm2, sig.trace_sigma, sig.b_simple, nz.decompose):
        with pytest.raises(ValueError, match="not identifiable"):
            fn(g @ g.T, [0, 0, 0, 0])


def test_b_simple_infinite_when_signal_estimate_not_positive():
    g = np.array([[1.0, 0.0], [-1.0, 0.0]])  # mean 0: |G|^2_hat = -1
    assert sig.b_simple(g @ g.T, [0, 1]) == math.inf


def test_ema_smooths_pieces_separately():
    ema = EmaNoiseScale(decay=0.5)
    assert math.isnan(ema.value)
    assert ema.update(4.0, 2.0) == pytest.approx(2.0)
    # bias-corrected EMA of each piece, then the ratio (not an EMA of the ratios 2 and 1)
    v = ema.update(3.0, 3.0)
    num = (0.5 * 0.5 * 4.0 + 0.5 * 3.0) / 0.75
    den = (0.5 * 0.5 * 2.0 + 0.5 * 3.0) / 0.75
    assert ema.trace_sigma == pytest.approx(num)
    assert ema.g_norm2 == pytest.approx(den)
    assert v == pytest.approx(1.25)
    assert v != pytest.approx((0.25 * 2.0 + 0.5 * 1.0) / 0.75)
    g = np.random.default_rng(0).standard_normal((5, 3)) + 1.0
    e2 = EmaNoiseScale(0.9)
    k, labels = g @ g.T, np.arange(5)
    assert e2.update(sig.trace_sigma(k, labels), sig.g_norm2(k, labels)) == sig.b_simple(k, labels)  # exact at step one
    with pytest.raises(ValueError, match="decay"):
        EmaNoiseScale(1.0)


# ---------------------------------------------------------------------------
# §6.3 split-half rho and its null


@pytest.mark.parametrize("tau", [0.3, 3.0])  # true within-prompt correlations ~0.08 and ~0.9
@pytest.mark.parametrize("n", [16, 7])
def test_split_half_rho_returns_null_whatever_the_correlation(tau, n):
    rng = np.random.default_rng(4)
    dim, sigma = 400, 1.0
    mu = np.full(dim, 0.2)
    rhos = []
    for _ in range(200):
        g = grouped_grads(rng, 1, n, dim, tau, sigma, mu)
        rhos.append(cor.split_half_rho(g @ g.T, rng))
    null = 1.0 / cor.k_sat_null(n)
    assert cor.k_sat_null(n) == n // 2 + 1
    se = np.std(rhos, ddof=1) / math.sqrt(len(rhos))
    assert abs(np.mean(rhos) - null) < 4 * se + 0.01


def test_split_half_rho_matches_explicit_vectors():
    rng = np.random.default_rng(5)
    g = rng.standard_normal((9, 6))
    perm = np.random.default_rng(11).permutation(9)
    r, q = perm[:4], perm[4:]
    e = g[q] - g[r].mean(0)
    p = (e**2).sum(1).mean()
    inner = e @ e.T
    x = (inner.sum() - np.trace(inner)) / (5 * 4)
    assert cor.split_half_rho(g @ g.T, np.random.default_rng(11)) == pytest.approx(x / p)


def test_split_half_rho_input_checks():
    with pytest.raises(ValueError, match="at least 3"):
        cor.split_half_rho(np.eye(2), np.random.default_rng(0))
    with pytest.raises(ValueError, match="noise power"):
        cor.split_half_rho(np.zeros((4, 4)), np.random.default_rng(0))
    with pytest.raises(ValueError, match="Generator"):
        cor.split_half_rho(np.eye(4), 0)
    with pytest.raises(ValueError, match="n"):
        cor.k_sat_null(2)


def test_k_sat():
    assert cor.k_sat(0.25) == pytest.approx(4.0)
    assert cor.k_sat(0.0) == math.inf
    assert cor.k_sat(-0.1) == math.inf
    with pytest.raises(ValueError):
        cor.k_sat(float("nan"))


# ---------------------------------------------------------------------------
# §6.3 intraclass rho


@pytest.mark.parametrize(("tau", "sigma_w"), [(0.5, 1.0), (1.5, 1.0)])
def test_icc_recovers_between_share(tau, sigma_w):
    rng = np.random.default_rng(6)
    dim, n_prompts, n = 100, 10, 8
    truth = tau**2 / (tau**2 + sigma_w**2)  # 0.2 and 0.69
    mu = rng.standard_normal(dim)
    rhos, tbs, msws = [], [], []
    for _ in range(150):
        g = grouped_grads(rng, n_prompts, n, dim, tau, sigma_w, mu)
        groups = np.repeat(np.arange(n_prompts), n)
        shuffle = rng.permutation(n_prompts * n)  # rows in any order
        g, groups = g[shuffle], groups[shuffle]
        res = cor.icc_components(g @ g.T, groups)
        rhos.append(res.rho)
        tbs.append(res.tb)
        msws.append(res.msw)
    assert np.mean(msws) == pytest.approx(dim * sigma_w**2, rel=0.02)
    se_tb = np.std(tbs, ddof=1) / math.sqrt(len(tbs))
    assert abs(np.mean(tbs) - dim * tau**2) < 4 * se_tb
    assert np.mean(rhos) == pytest.approx(truth, abs=0.01)
    assert cor.icc_rho(g @ g.T, groups) == res.rho
    assert res.k_sat == pytest.approx(1 / res.rho)


def test_icc_zero_when_no_between_component():
    rng = np.random.default_rng(7)
    g = rng.standard_normal((12, 50))  # no prompt effect: tb estimate often <= 0
    groups = np.repeat([0, 1, 2], 4)
    res = cor.icc_components(g @ g.T, groups)
    assert res.rho == (res.tb / (res.tb + res.msw) if res.tb > 0 else 0.0)
    flat = np.tile(rng.standard_normal((4, 50)), (3, 1))  # identical groups: MSB = 0
    res = cor.icc_components(flat @ flat.T, groups)
    assert res.tb < 0 and res.rho == 0.0 and res.k_sat == math.inf


def test_group_checks():
    k = np.eye(6)
    with pytest.raises(ValueError, match="same number"):
        cor.icc_rho(k, [0, 0, 0, 1, 1, 2])
    with pytest.raises(ValueError, match="at least 2 prompts"):
        cor.icc_rho(k, [0] * 6)
    with pytest.raises(ValueError, match="one label per"):
        cor.icc_rho(k, [0, 1])


# ---------------------------------------------------------------------------
# §6.3 K_crit and CRS


def test_k_crit():
    assert cor.k_crit(0.0, 50.0, 25.0) == pytest.approx(2.0)  # B_noise
    assert cor.k_crit(-0.3, 50.0, 25.0) == pytest.approx(2.0)  # negative rho read as 0
    assert cor.k_crit(0.2, 50.0, 25.0) == pytest.approx(0.8 * 50 / (25 - 10))
    assert cor.k_crit(0.5, 50.0, 25.0) == math.inf  # |G|^2 = rho s
    assert cor.k_crit(0.6, 50.0, 25.0) == math.inf
    assert cor.k_crit(0.0, 50.0, -1.0) == math.inf
    # the noise of a K_crit-rollout mean equals the signal
    rho, s, g2 = 0.1, 40.0, 9.0
    kc = cor.k_crit(rho, s, g2)
    assert s * ((1 - rho) / kc + rho) == pytest.approx(g2)
    with pytest.raises(ValueError, match="rho"):
        cor.k_crit(1.5, 1.0, 1.0)
    with pytest.raises(ValueError, match="trace_sigma"):
        cor.k_crit(0.1, -1.0, 1.0)
    assert cor.crs(9.0, 4.0) == 4.0
    assert cor.crs(math.inf, 4.0) == 4.0


# ---------------------------------------------------------------------------
# §6.2 decomposition


def test_decomposition_on_explicit_vectors():
    rng = np.random.default_rng(8)
    n_prompts, n, dim = 4, 5, 30
    g = grouped_grads(rng, n_prompts, n, dim, 0.8, 1.0, np.full(dim, 0.5))
    groups = np.repeat(["a", "b", "c", "d"], n)
    k = g @ g.T
    means = g.reshape(n_prompts, n, dim).mean(1)
    m = means @ means.T
    between = (m.sum() - np.trace(m)) / (n_prompts * (n_prompts - 1))
    assert sig.g_norm2(k, groups) == pytest.approx(between)
    assert sig.prompt_axis_b_noise(k, groups) == pytest.approx((np.trace(m) / n_prompts - between) / between)
    w = ((g.reshape(n_prompts, n, dim) - means[:, None]) ** 2).sum((1, 2)) / (n - 1)
    assert sig.rollout_axis_noise(k, groups) == pytest.approx(w.mean() / between)

    d = nz.decompose(k, groups)
    icc = cor.icc_components(k, groups)
    assert (d.n_rollouts, d.n_prompts, d.n) == (20, 4, 5)
    assert d.b_simple == pytest.approx(sig.b_simple(k, groups))
    assert d.g_norm2_all_pairs == pytest.approx(sig.g_norm2_all_pairs(k))
    assert d.trace_sigma == pytest.approx(icc.tb + icc.msw)  # s_hat = tb + mean within noise
    assert d.prompt_noise_power == pytest.approx(icc.msb / n)
    assert d.b_naive == pytest.approx(sig.b_naive(k, n_prompts))  # rows already group-ordered
    assert d.rho_icc == icc.rho
    assert d.k_crit == pytest.approx(cor.k_crit(icc.rho, icc.tb + icc.msw, sig.g_norm2(k, groups)))
    assert d.crs == min(d.k_sat_icc, d.k_crit)
    # row order does not matter
    perm = rng.permutation(20)
    d2 = nz.decompose(k[np.ix_(perm, perm)], groups[perm])
    assert d2.b_naive == pytest.approx(d.b_naive)
    assert d2.rho_icc == pytest.approx(d.rho_icc)


# ---------------------------------------------------------------------------
# §6.3 outliers and reporting


def test_iqr_filter_on_hand_data():
    v = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 100.0, math.inf])
    # finite quartiles: Q1 = 2.25, Q3 = 4.75, IQR 2.5: fences [-1.5, 8.5]
    assert summ.iqr_filter(v).tolist() == [True] * 5 + [False, False]
    assert summ.iqr_filter(np.array([math.inf, math.inf])).tolist() == [False, False]
    with pytest.raises(ValueError, match="NaN"):
        summ.iqr_filter(np.array([1.0, np.nan]))


def test_summary_stats():
    v = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 100.0, math.inf])
    s = summ.summary_stats(v)
    assert s["count"] == 7 and s["mean"] == math.inf and s["max"] == math.inf
    assert s["median"] == 4.0 and math.isnan(s["std"])
    assert s["count_filtered"] == 5
    assert s["mean_filtered"] == 3.0 and s["median_filtered"] == 3.0
    assert s["std_filtered"] == pytest.approx(np.std([1, 2, 3, 4, 5], ddof=1))
    assert s["max_filtered"] == 5.0


def test_quintile_table():
    pass_rates = np.arange(10) / 10.0  # two prompts per quintile
    k_sats = np.array([2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 14.0, 16.0, 9.0, 1000.0])
    t = summ.quintile_table(pass_rates, k_sats)
    assert isinstance(t, pd.DataFrame) and len(t) == 5
    assert t["count"].tolist() == [2, 2, 2, 2, 1]
    assert t["mean"].tolist() == [3.0, 7.0, 11.0, 15.0, 9.0]
    assert t["median"].tolist() == [3.0, 7.0, 11.0, 15.0, 9.0]
    assert t["n_outliers"].tolist() == [0, 0, 0, 0, 1]
    assert t["std"].iloc[0] == pytest.approx(np.std([2.0, 4.0], ddof=1))
    raw = summ.quintile_table(pass_rates, k_sats, drop_outliers=False)
    assert raw["mean"].iloc[4] == pytest.approx(504.5) and "n_outliers" not in raw
    # tied pass rates merge quintiles; all equal gives one row
    tied = summ.quintile_table(np.array([0.0] * 6 + [1.0] * 4), np.arange(10.0))
    assert tied["count"].sum() == 10 and len(tied) < 5
    one = summ.quintile_table(np.full(4, 0.5), np.array([1.0, 2.0, 3.0, 4.0]))
    assert one["count"].tolist() == [4]
    with pytest.raises(ValueError, match="equal lengths"):
        summ.quintile_table(np.ones(3), np.ones(4))


def test_between_prompt_signal_recovers_truth_where_all_pairs_is_biased():
    """Correlated rollouts (science §6.2): the all-pairs |G|^2 counts same-prompt pairs and is
    >= 10 % high; the between-prompt form is within 3 % on average, and so is K_crit's input."""
    rng = np.random.default_rng(11)
    n_prompts, n, dim, tau = 8, 8, 200, 0.5  # tb = dim tau^2 = 50
    mu = np.zeros(dim)
    mu[:4] = 2.5  # |G|^2 = 25
    groups = np.repeat(np.arange(n_prompts), n)
    between, all_pairs, rollout = [], [], []
    for _ in range(400):
        g = grouped_grads(rng, n_prompts, n, dim, tau, 1.0, mu)
        d = nz.decompose(g @ g.T, groups)
        between.append(d.g_norm2)
        all_pairs.append(d.g_norm2_all_pairs)
        rollout.append(d.rollout_noise_power)
    assert abs(np.mean(between) / 25.0 - 1) < 0.03
    assert np.mean(all_pairs) / 25.0 - 1 >= 0.10
    assert abs(np.mean(rollout) / dim - 1) < 0.03  # within noise dim * sigma_w^2
