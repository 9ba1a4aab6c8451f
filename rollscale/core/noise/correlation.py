"""Within-group correlation of rollout gradients and the rollout counts it sets (science §6.3).

The split-half rho of one prompt's group and its null, the intraclass rho over
prompts (one-way ANOVA from the Gram matrix), K_sat = 1 / rho, the critical
rollout count K_crit of the correlated CBS form, and CRS = min(K_sat, K_crit).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from rollscale.core.noise.signal import as_gram, block_means, group_order, within_sums


def split_half_rho(gram: np.ndarray, rng: np.random.Generator) -> float:
    """The essay's split-half rho for one prompt's group, exactly (science §6.3).

    Permute the ``n`` rollouts with ``rng``; R = first ``n // 2`` of them,
    Q = the rest (for odd n, Q gets the extra rollout; |R| = n // 2 is what
    :func:`k_sat_null` assumes). With ``e_i = g_i - mean_R g`` for i in Q:
    ``P = mean_{i in Q} |e_i|^2``, ``X = mean_{i != j in Q} <e_i, e_j>``,
    ``rho = X / P``. All from Gram entries:
    ``<e_i, e_j> = K_ij - mean_r K_ir - mean_r K_jr + mean_{r,r'} K_rr'``.

    Needs n >= 3 (|R| >= 1, |Q| >= 2). Raises if P = 0 (all gradients equal,
    e.g. a zero-variance group whose advantages are all 0): rho is undefined.
    For exchangeable rollouts E[X] / E[P] = 1 / (|R| + 1) whatever the data,
    so compare with :func:`k_sat_null`.
    """
    k = as_gram(gram, min_size=3)
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"rng: expected a numpy.random.Generator, got {type(rng).__name__}")
    n = k.shape[0]
    perm = rng.permutation(n)
    r_idx, q_idx = perm[: n // 2], perm[n // 2 :]
    k_qq = k[np.ix_(q_idx, q_idx)]
    to_ref = k[np.ix_(q_idx, r_idx)].mean(axis=1)  # <g_i, mean_R g>
    ref2 = k[np.ix_(r_idx, r_idx)].mean()  # |mean_R g|^2
    e = k_qq - to_ref[:, None] - to_ref[None, :] + ref2
    q = len(q_idx)
    power = float(np.trace(e)) / q
    if power <= 0.0:
        raise ValueError(
            "gram: the noise power P is 0 (all gradients in the group are equal, e.g. "
            "every advantage is 0); split-half rho is undefined"
        )
    cross = float(e.sum() - np.trace(e)) / (q * (q - 1))
    return cross / power


def k_sat(rho: float) -> float:
    """Saturation rollout count ``K_sat = 1 / rho``, infinite when rho <= 0 (science §6.3)."""
    if math.isnan(rho) or rho > 1.0 + 1e-9:
        raise ValueError(f"rho: expected a correlation <= 1, got {rho!r}")
    return math.inf if rho <= 0.0 else 1.0 / float(rho)


def k_sat_null(n: int) -> float:
    """Null value of the split-half K_sat: ``|R| + 1`` with ``|R| = n // 2`` (science §6.3).

    For exchangeable rollouts with nothing shared beyond the prompt mean,
    E[X] / E[P] = 1 / (|R| + 1), so :func:`split_half_rho` gives K_sat near
    this value whatever the data (9 for n = 16). For odd n the reference set
    is the smaller half, |R| = floor(n / 2), matching :func:`split_half_rho`.
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 3:
        raise ValueError(f"n: expected an int group size >= 3, got {n!r}")
    return float(n // 2 + 1)


@dataclass(frozen=True)
class IccResult:
    """One-way ANOVA pieces of the intraclass rho (science §6.3).

    ``tb`` is the between-prompt variance (may be negative: it is the raw
    unbiased estimate), ``msw`` the within mean square, ``msb`` the between
    mean square; ``rho = tb / (tb + msw)`` or 0 when tb <= 0.
    """

    rho: float
    tb: float
    msw: float
    msb: float
    n_prompts: int
    n: int

    @property
    def k_sat(self) -> float:
        """``K_sat_icc = 1 / rho_icc`` (infinite when rho_icc = 0)."""
        return k_sat(self.rho)


def icc_components(gram: np.ndarray, groups: np.ndarray) -> IccResult:
    """One-way ANOVA over prompts from the Gram matrix (science §6.3).

    ``MSW = sum_p sum_i |g_pi - gbar_p|^2 / (P (n - 1))``,
    ``MSB = n sum_p |gbar_p - gbar|^2 / (P - 1)``, ``tb = (MSB - MSW) / n``,
    ``rho_icc = tb / (tb + MSW)`` (0 when tb <= 0). Needs P >= 2 prompts of
    equal size n >= 2.
    """
    k = as_gram(gram)
    order, p, n = group_order(groups, k.shape[0])
    m = block_means(k, order, p, n)
    within = within_sums(k, order, p, n, m)
    msw = float(within.sum()) / (p * (n - 1))
    between = np.diag(m) - 2.0 * m.mean(axis=1) + m.mean()  # |gbar_p - gbar|^2
    msb = n * float(between.sum()) / (p - 1)
    tb = (msb - msw) / n
    rho = tb / (tb + msw) if tb > 0.0 else 0.0
    return IccResult(rho=rho, tb=tb, msw=msw, msb=msb, n_prompts=p, n=n)


def icc_rho(gram: np.ndarray, groups: np.ndarray) -> float:
    """Intraclass rho over prompts, ``tb / (tb + MSW)`` (science §6.3)."""
    return icc_components(gram, groups).rho


def k_crit(rho: float, trace_sigma: float, g_norm2: float) -> float:
    """Critical rollout count of the correlated CBS form (science §6.3).

    Solves ``s ((1 - rho) / K + rho) = |G|^2`` for K:
    ``K_crit = (1 - rho) s / (|G|^2 - rho s)`` when ``|G|^2 > rho s``, else
    infinite. With rho = 0 it is ``s / |G|^2``, i.e. B_noise. A negative rho
    (an estimate below 0) is read as 0, as :func:`icc_components` does with
    tb <= 0: an equicorrelation below 0 is not a valid covariance for large K.
    """
    for name, v in (("rho", rho), ("trace_sigma", trace_sigma), ("g_norm2", g_norm2)):
        if not math.isfinite(v):
            raise ValueError(f"{name}: expected a finite number, got {v!r}")
    if rho > 1.0 + 1e-9:
        raise ValueError(f"rho: expected a correlation <= 1, got {rho!r}")
    if trace_sigma < 0.0:
        raise ValueError(f"trace_sigma: expected a non-negative noise power, got {trace_sigma!r}")
    r = min(max(float(rho), 0.0), 1.0)
    den = g_norm2 - r * trace_sigma
    return (1.0 - r) * trace_sigma / den if den > 0.0 else math.inf


def crs(k_sat: float, k_crit: float) -> float:
    """Critical rollout size ``CRS = min(K_sat, K_crit)`` (science §6.3)."""
    if math.isnan(k_sat) or math.isnan(k_crit):
        raise ValueError("k_sat, k_crit: expected numbers, got NaN")
    return min(float(k_sat), float(k_crit))
