"""Gradient-noise estimators on a per-rollout gradient Gram matrix (science §6).

Every estimator here takes the Gram matrix ``K_ij = <g_i, g_j>`` of one step's
per-rollout gradients (science §6.1; see :mod:`rollscale.core.gram`) and returns
numbers. No model code lives here, and nothing needs the gradients themselves:
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

import math
from dataclasses import dataclass

import numpy as np
from rollscale.core.noise_ema import EmaNoiseScale
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
# input checks


def _as_gram(gram: np.ndarray, min_size: int = 2, name: str = "gram") -> np.ndarray:
    k = np.asarray(gram, dtype=np.float64)
    if k.ndim != 2 or k.shape[0] != k.shape[1]:
        raise ValueError(f"{name}: expected a square 2-D Gram matrix, got shape {k.shape}")
    if k.shape[0] < min_size:
        raise ValueError(f"{name}: expected at least {min_size} rows, got {k.shape[0]}")
    if not np.all(np.isfinite(k)):
        raise ValueError(f"{name}: expected finite entries, found NaN or inf")
    scale = float(np.max(np.abs(k))) if k.size else 0.0
    # float32 Gram matrices round differently above and below the diagonal
    if not np.allclose(k, k.T, rtol=0.0, atol=1e-5 * scale):
        raise ValueError(f"{name}: expected a symmetric matrix (K_ij = <g_i, g_j>)")
    return k


def _group_order(groups: np.ndarray, n_rows: int, min_n: int = 2) -> tuple[np.ndarray, int, int]:
    """Row order that puts each prompt's rows together: (order, P, n)."""
    labels = np.asarray(groups)
    if labels.ndim != 1 or labels.shape[0] != n_rows:
        raise ValueError(
            f"groups: expected one label per Gram row ({n_rows}), got shape {labels.shape}"
        )
    _, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
    if counts.size < 2:
        raise ValueError(
            f"groups: expected at least 2 prompts, got {counts.size}: with one prompt the "
            "between-prompt signal |G|^2 is not identifiable (science §6.2)"
        )
    if np.any(counts != counts[0]):
        raise ValueError(
            f"groups: expected every prompt to have the same number of rollouts, got sizes "
            f"{sorted(set(counts.tolist()))}"
        )
    n = int(counts[0])
    if n < min_n:
        raise ValueError(f"groups: expected at least {min_n} rollouts per prompt, got {n}")
    order = np.argsort(inverse, kind="stable")
    return order, int(counts.size), n


def _block_means(k: np.ndarray, order: np.ndarray, n_blocks: int, size: int) -> np.ndarray:
    """Gram matrix of block-mean gradients: M_pq = <gbar_p, gbar_q>."""
    kk = k[np.ix_(order, order)].reshape(n_blocks, size, n_blocks, size)
    return kk.mean(axis=(1, 3))


def _ratio(num: float, den: float) -> float:
    return math.inf if den <= 0.0 else num / den


# ---------------------------------------------------------------------------
# §6.2 B_noise from between-prompt pairs


def _block_gram(gram: np.ndarray, groups: np.ndarray, min_n: int = 1) -> tuple[np.ndarray, np.ndarray, int, int]:
    """(K, M, P, n): the checked Gram matrix and the Gram of prompt means ``M_pq``."""
    k = _as_gram(gram)
    order, p, n = _group_order(groups, k.shape[0], min_n)
    return k, _block_means(k, order, p, n), p, n


def _between(m: np.ndarray) -> float:
    p = m.shape[0]
    return float((m.sum() - np.trace(m)) / (p * (p - 1)))


def g_norm2(gram: np.ndarray, groups: np.ndarray) -> float:
    """Signal ``|G|^2_hat = sum_{p != q} M_pq / (P (P - 1))``, between-prompt pairs only (science §6.2).

    Unbiased when prompts are drawn independently, whatever the correlation of
    rollouts within a prompt. Can be negative when the signal is small
    compared with the noise. For independent rollouts pass one label per row
    (``groups = arange(N)``): it is then the all-pairs form.
    """
    _, m, _, _ = _block_gram(gram, groups)
    return _between(m)


def g_norm2_all_pairs(gram: np.ndarray) -> float:
    """All-pairs ``sum_{i != j} K_ij / (N (N - 1))`` — a named comparison only (science §6.2).

    It counts two rollouts of one prompt as independent samples, so it is
    biased upward by the within-prompt covariance.
    """
    k = _as_gram(gram)
    n = k.shape[0]
    return float((k.sum() - np.trace(k)) / (n * (n - 1)))


def trace_sigma(gram: np.ndarray, groups: np.ndarray) -> float:
    """Per-rollout noise power ``s_hat = mean_i K_ii - |G|^2_hat`` (science §6.2)."""
    k, m, _, _ = _block_gram(gram, groups)
    return float(np.mean(np.diag(k))) - _between(m)


def b_simple(gram: np.ndarray, groups: np.ndarray) -> float:
    """McCandlish's B_simple in rollouts, ``s_hat / |G|^2_hat`` (science §6.2).

    Infinite when ``|G|^2_hat <= 0``. No smoothing here: see :class:`EmaNoiseScale`.
    """
    return _ratio(trace_sigma(gram, groups), g_norm2(gram, groups))


def b_naive(gram: np.ndarray, n_batches: int) -> float:
    """Mini-batch form ``(b / (K - 1)) sum_k |g_k - gbar|^2 / |gbar|^2`` (science §6.2).

    The rows are cut into ``n_batches = K`` mini-batches of ``b = N / K``
    consecutive rows. Kept for comparison with the CBS-in-RLVR README and shown
    only beside the unbiased estimate: its bias has no fixed sign (toward
    ``B / (1 + B / N)`` for independent rollouts, because the plug-in
    ``|gbar|^2`` carries ``tr(Sigma) / N``; upward when mini-batches cut
    across prompt groups). Infinite when ``|gbar|^2 <= 0``.
    """
    k = _as_gram(gram)
    n = k.shape[0]
    if isinstance(n_batches, bool) or not isinstance(n_batches, (int, np.integer)):
        raise ValueError(f"n_batches: expected an int, got {n_batches!r}")
    if n_batches < 2:
        raise ValueError(f"n_batches: expected at least 2 mini-batches, got {n_batches}")
    if n % n_batches != 0:
        raise ValueError(f"n_batches: {n_batches} does not divide the {n} rows of gram")
    b = n // n_batches
    m = _block_means(k, np.arange(n), int(n_batches), b)
    gbar2 = float(m.mean())
    spread = np.diag(m) - 2.0 * m.mean(axis=1) + gbar2  # |g_k - gbar|^2
    return _ratio(b / (n_batches - 1) * float(spread.sum()), gbar2)


def prompt_noise_power(gram: np.ndarray, groups: np.ndarray) -> float:
    """Noise of one prompt's group mean, ``s_P_hat = mean_p M_pp - |G|^2_hat`` (science §6.2)."""
    _, m, _, _ = _block_gram(gram, groups)
    return float(np.mean(np.diag(m))) - _between(m)


def rollout_noise_power(gram: np.ndarray, groups: np.ndarray) -> float:
    """Mean within-group noise ``mean_p w_p``, ``w_p = (sum_{i in p} K_ii - n M_pp) / (n - 1)`` (science §6.2)."""
    k = _as_gram(gram)
    order, p, n = _group_order(groups, k.shape[0], 2)
    m = _block_means(k, order, p, n)
    return float(_within_sums(k, order, p, n, m).mean()) / (n - 1)


def prompt_axis_b_noise(gram: np.ndarray, groups: np.ndarray) -> float:
    """Prompt-axis B_noise ``s_P_hat / |G|^2_hat``, in prompts at this n (science §6.2)."""
    return _ratio(prompt_noise_power(gram, groups), g_norm2(gram, groups))


def rollout_axis_noise(gram: np.ndarray, groups: np.ndarray) -> float:
    """Rollout-axis noise scale ``mean_p w_p / |G|^2_hat`` (science §6.2); inf when ``|G|^2_hat <= 0``."""
    return _ratio(rollout_noise_power(gram, groups), g_norm2(gram, groups))


# ---------------------------------------------------------------------------
# §6.3 within-group correlation


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
    k = _as_gram(gram, min_size=3)
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
    k = _as_gram(gram)
    order, p, n = _group_order(groups, k.shape[0])
    m = _block_means(k, order, p, n)
    within = _within_sums(k, order, p, n, m)
    msw = float(within.sum()) / (p * (n - 1))
    between = np.diag(m) - 2.0 * m.mean(axis=1) + m.mean()  # |gbar_p - gbar|^2
    msb = n * float(between.sum()) / (p - 1)
    tb = (msb - msw) / n
    rho = tb / (tb + msw) if tb > 0.0 else 0.0
    return IccResult(rho=rho, tb=tb, msw=msw, msb=msb, n_prompts=p, n=n)


def _within_sums(
    k: np.ndarray, order: np.ndarray, p: int, n: int, m: np.ndarray
) -> np.ndarray:
    """Per prompt ``sum_i |g_pi - gbar_p|^2 = sum_i K_ii - n |gbar_p|^2``."""
    diag = np.diag(k)[order].reshape(p, n).sum(axis=1)
    return diag - n * np.diag(m)


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
