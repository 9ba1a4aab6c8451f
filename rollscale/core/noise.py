"""Gradient-noise estimators on a per-rollout gradient Gram matrix (science §6).

Every estimator takes the Gram matrix ``K_ij = <g_i, g_j>`` of one step's
per-rollout gradients (science §6.1; see :mod:`rollscale.core.gram`) and returns
numbers: the signal and noise powers in :mod:`rollscale.core.noise_signal`
(§6.2), the within-group correlation in :mod:`rollscale.core.noise_correlation`
(§6.3), all of one step at once in :func:`decompose` here; this module is the
public face and re-exports them. No model code lives here, and nothing needs the gradients themselves:
all inner products between sums of gradients are sums of entries of ``K``.

Conventions used throughout:

* ``gram`` is a symmetric ``N x N`` array of finite numbers, ``N >= 2``.
* ``groups`` gives the prompt of each row (any hashable labels); every prompt
  must own the same number ``n`` of rows, in any order, and there must be at
  least two prompts: the signal comes from between-prompt pairs only, because
  two rollouts of one prompt share the prompt's component (science §6.2).
* A signal estimate ``|G|^2_hat <= 0`` (noise swamps signal) makes a
  noise-to-signal ratio infinite rather than negative.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rollscale.core.noise_correlation import (
    IccResult,
    crs,
    icc_components,
    icc_rho,
    k_crit,
    k_sat,
    k_sat_null,
    split_half_rho,
)
from rollscale.core.noise_ema import EmaNoiseScale
from rollscale.core.noise_signal import (
    _as_gram,
    _between,
    _block_means,
    _group_order,
    _ratio,
    _within_sums,
    b_naive,
    b_simple,
    g_norm2,
    g_norm2_all_pairs,
    prompt_axis_b_noise,
    prompt_noise_power,
    rollout_axis_noise,
    rollout_noise_power,
    trace_sigma,
)
from rollscale.core.noise_summary import iqr_filter, quintile_table, summary_stats

__all__ = [
    "EmaNoiseScale",
    "IccResult",
    "NoiseDecomposition",
    "b_naive",
    "b_simple",
    "crs",
    "decompose",
    "g_norm2",
    "g_norm2_all_pairs",
    "icc_components",
    "icc_rho",
    "iqr_filter",
    "k_crit",
    "k_sat",
    "k_sat_null",
    "prompt_axis_b_noise",
    "prompt_noise_power",
    "quintile_table",
    "rollout_axis_noise",
    "rollout_noise_power",
    "split_half_rho",
    "summary_stats",
    "trace_sigma",
]


# ---------------------------------------------------------------------------
# one measurement step


@dataclass(frozen=True)
class NoiseDecomposition:
    """Step-level noise summary (science §6.2, §6.3); fields of the noise_steps table.

    ``g_norm2`` is the between-prompt signal; ``g_norm2_all_pairs`` the biased
    all-pairs form, kept as a named comparison. ``trace_sigma`` is the
    per-rollout noise power ``s_hat``; ``b_naive`` is shown beside
    ``b_simple``, never alone.
    """

    n_rollouts: int
    n_prompts: int
    n: int
    trace_sigma: float
    g_norm2: float
    g_norm2_all_pairs: float
    b_simple: float
    b_naive: float
    prompt_noise_power: float
    prompt_noise: float
    rollout_noise_power: float
    rollout_noise: float
    rho_icc: float
    k_sat_icc: float
    k_crit: float
    crs: float


def decompose(gram: np.ndarray, groups: np.ndarray) -> NoiseDecomposition:
    """All step-level noise numbers of one measurement step (science §6.2, §6.3).

    Needs P >= 2 prompts of equal size n >= 2 (with one prompt the signal is
    not identifiable: a ValueError says so). The pieces are consistent:
    ``s_hat = tb + mean_p w_p`` and ``s_P_hat = MSB / n``, so ``K_crit`` uses
    ``rho_icc``, ``s = s_hat`` and the between-prompt ``|G|^2_hat`` (it is
    B_simple where rho_icc = 0); ``crs = min(k_sat_icc, k_crit)``.
    ``b_naive`` takes the prompt groups as its mini-batches (K = P batches of
    b = n), the layout of a GRPO batch stored group by group.
    """
    k = _as_gram(gram)
    order, p, n = _group_order(groups, k.shape[0], 2)
    m = _block_means(k, order, p, n)
    g2 = _between(m)
    s = float(np.mean(np.diag(k))) - g2
    s_p = float(np.mean(np.diag(m))) - g2
    w = float(_within_sums(k, order, p, n, m).mean()) / (n - 1)
    icc = icc_components(k, groups)
    kc = k_crit(icc.rho, max(s, 0.0), g2)
    return NoiseDecomposition(
        n_rollouts=k.shape[0],
        n_prompts=p,
        n=n,
        trace_sigma=s,
        g_norm2=g2,
        g_norm2_all_pairs=g_norm2_all_pairs(k),
        b_simple=_ratio(s, g2),
        b_naive=b_naive(k[np.ix_(order, order)], p),
        prompt_noise_power=s_p,
        prompt_noise=_ratio(s_p, g2),
        rollout_noise_power=w,
        rollout_noise=_ratio(w, g2),
        rho_icc=icc.rho,
        k_sat_icc=icc.k_sat,
        k_crit=kc,
        crs=crs(icc.k_sat, kc),
    )
