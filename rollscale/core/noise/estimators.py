"""Gradient-noise estimators on a per-rollout gradient Gram matrix (science §6).

Every estimator takes the Gram matrix ``K_ij = <g_i, g_j>`` of one step's
per-rollout gradients (science §6.1; see :mod:`rollscale.core.noise.gram`) and returns
numbers: the signal and noise powers in :mod:`rollscale.core.noise.signal`
(§6.2), the within-group correlation in :mod:`rollscale.core.noise.correlation`
(§6.3), their smoothing over steps in :mod:`rollscale.core.noise.ema` and
summaries in :mod:`rollscale.core.noise.summary`; all of one step at once is
:func:`decompose` here. No model code lives here, and nothing needs the gradients themselves:
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

from rollscale.core.noise.correlation import crs, icc_components, k_crit
from rollscale.core.noise.signal import (
    as_gram,
    b_naive,
    between_mean,
    block_means,
    g_norm2_all_pairs,
    group_order,
    noise_ratio,
    within_sums,
)

__all__ = ["NoiseDecomposition", "decompose"]


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
    k = as_gram(gram)
    order, p, n = group_order(groups, k.shape[0], 2)
    m = block_means(k, order, p, n)
    g2 = between_mean(m)
    s = float(np.mean(np.diag(k))) - g2
    s_p = float(np.mean(np.diag(m))) - g2
    w = float(within_sums(k, order, p, n, m).mean()) / (n - 1)
    icc = icc_components(k, groups)
    kc = k_crit(icc.rho, max(s, 0.0), g2)
    return NoiseDecomposition(
        n_rollouts=k.shape[0],
        n_prompts=p,
        n=n,
        trace_sigma=s,
        g_norm2=g2,
        g_norm2_all_pairs=g_norm2_all_pairs(k),
        b_simple=noise_ratio(s, g2),
        b_naive=b_naive(k[np.ix_(order, order)], p),
        prompt_noise_power=s_p,
        prompt_noise=noise_ratio(s_p, g2),
        rollout_noise_power=w,
        rollout_noise=noise_ratio(w, g2),
        rho_icc=icc.rho,
        k_sat_icc=icc.k_sat,
        k_crit=kc,
        crs=crs(icc.k_sat, kc),
    )
