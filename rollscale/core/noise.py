"""Gradient-noise estimators on a per-rollout gradient Gram matrix (science §6).

Every estimator here takes the Gram matrix ``K_ij = <g_i, g_j>`` of one step's
per-rollout gradients (science §6.1; see :mod:`rollscale.core.gram`) and returns
numbers. No model code lives here, and nothing needs the gradients themselves:
all inner products between sums of gradients are sums of entries of ``K``.

Conventions used throughout:

* ``gram`` is a symmetric ``N x N`` array of finite numbers, ``N >= 2``.
* ``groups`` gives the prompt of each row (any hashable labels); every prompt
  must own the same number ``n`` of rows, in any order.
* A signal estimate ``|G|^2_hat <= 0`` (noise swamps signal) makes a
  noise-to-signal ratio infinite rather than negative.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

__all__ = [
    "EmaNoiseScale",
    "IccResult",
    "NoiseDecomposition",
    "b_naive",
    "b_simple",
    "crs",
    "decompose",
    "g_norm2",
    "icc_components",
    "icc_rho",
    "iqr_filter",
    "k_crit",
    "k_sat",
    "k_sat_null",
    "prompt_axis_b_noise",
    "quintile_table",
    "rollout_axis_noise",
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


def _group_order(groups: np.ndarray, n_rows: int) -> tuple[np.ndarray, int, int]:
    """Row order that puts each prompt's rows together: (order, P, n)."""
    labels = np.asarray(groups)
    if labels.ndim != 1 or labels.shape[0] != n_rows:
        raise ValueError(
            f"groups: expected one label per Gram row ({n_rows}), got shape {labels.shape}"
        )
    _, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
    if counts.size < 2:
        raise ValueError(f"groups: expected at least 2 prompts, got {counts.size}")
    if np.any(counts != counts[0]):
        raise ValueError(
            f"groups: expected every prompt to have the same number of rollouts, got sizes "
            f"{sorted(set(counts.tolist()))}"
        )
    n = int(counts[0])
    if n < 2:
        raise ValueError("groups: expected at least 2 rollouts per prompt")
    order = np.argsort(inverse, kind="stable")
    return order, int(counts.size), n


def _block_means(k: np.ndarray, order: np.ndarray, n_blocks: int, size: int) -> np.ndarray:
    """Gram matrix of block-mean gradients: M_pq = <gbar_p, gbar_q>."""
    kk = k[np.ix_(order, order)].reshape(n_blocks, size, n_blocks, size)
    return kk.mean(axis=(1, 3))


def _ratio(num: float, den: float) -> float:
    return math.inf if den <= 0.0 else num / den


# ---------------------------------------------------------------------------
# §6.2 B_noise


def g_norm2(gram: np.ndarray) -> float:
    """Unbiased |G|^2 from N independent per-rollout gradients (science §6.2).

    ``|G|^2_hat = sum_{i != j} K_ij / (N (N - 1))``; it can be negative when
    the true signal is small compared with the noise.
    """
    k = _as_gram(gram)
    n = k.shape[0]
    return float((k.sum() - np.trace(k)) / (n * (n - 1)))


def trace_sigma(gram: np.ndarray) -> float:
    """Unbiased tr(Sigma) of one per-rollout gradient (science §6.2).

    ``tr(Sigma)_hat = (sum_i K_ii - sum_ij K_ij / N) / (N - 1)``, the sample
    variance of the g_i summed over coordinates.
    """
    k = _as_gram(gram)
    n = k.shape[0]
    return float((np.trace(k) - k.sum() / n) / (n - 1))


def b_simple(gram: np.ndarray) -> float:
    """McCandlish's simple noise scale ``tr(Sigma)_hat / |G|^2_hat`` (science §6.2).

    Both pieces are unbiased for N independent samples; the ratio is
    consistent, not unbiased. No smoothing here: see :class:`EmaNoiseScale`.
    Infinite when ``|G|^2_hat <= 0``.
    """
    return _ratio(trace_sigma(gram), g_norm2(gram))


def b_naive(gram: np.ndarray, n_batches: int) -> float:
    """Mini-batch form ``(b / (K - 1)) sum_k |g_k - gbar|^2 / |gbar|^2`` (science §6.2).

    The rows are cut into ``n_batches = K`` mini-batches of ``b = N / K``
    consecutive rows. The numerator is unbiased for tr(Sigma), but the
    denominator is the plug-in ``|gbar|^2`` with ``E|gbar|^2 = |G|^2 +
    tr(Sigma) / N``, so where ``|gbar|^2`` concentrates (many coordinates)
    the estimate sits near ``B / (1 + B / N)``, below the true B and never
    far above N. (science §6.2 calls this bias "upward"; measured, it is
    downward in that regime. Where |gbar|^2 itself is very noisy, e.g. few
    coordinates and tiny |G|, 1/|gbar|^2 has a heavy right tail instead.)
    Kept for comparison with the CBS-in-RLVR README. Infinite when
    ``|gbar|^2 <= 0``.
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


class EmaNoiseScale:
    """EMA-smoothed B_simple: numerator and denominator smoothed apart (science §6.2).

    McCandlish et al. advise averaging tr(Sigma)_hat and |G|^2_hat over steps
    before dividing, because the ratio of noisy pieces is unstable. Uses
    Adam-style bias correction so early values are not pulled toward 0 (the
    correction cancels in the ratio but makes the smoothed pieces readable).

    >>> ema = EmaNoiseScale(decay=0.9)
    >>> ema.update(trace_sigma=4.0, g_norm2=2.0)
    2.0
    """

    def __init__(self, decay: float) -> None:
        if not (0.0 <= decay < 1.0):
            raise ValueError(f"decay: expected a number in [0, 1), got {decay!r}")
        self.decay = float(decay)
        self._num = 0.0
        self._den = 0.0
        self._weight = 0.0  # 1 - decay**steps, the bias correction
        self.steps = 0

    def update(self, trace_sigma: float, g_norm2: float) -> float:
        """Fold in one step's unbiased pieces; return the smoothed ratio."""
        if not (math.isfinite(trace_sigma) and math.isfinite(g_norm2)):
            raise ValueError("trace_sigma, g_norm2: expected finite numbers")
        d = self.decay
        self._num = d * self._num + (1.0 - d) * float(trace_sigma)
        self._den = d * self._den + (1.0 - d) * float(g_norm2)
        self._weight = d * self._weight + (1.0 - d)
        self.steps += 1
        return self.value

    def update_gram(self, gram: np.ndarray) -> float:
        """:meth:`update` with the pieces estimated from one step's Gram matrix."""
        return self.update(trace_sigma(gram), g_norm2(gram))

    @property
    def trace_sigma(self) -> float:
        """Smoothed tr(Sigma) (NaN before the first update)."""
        return self._num / self._weight if self.steps else math.nan

    @property
    def g_norm2(self) -> float:
        """Smoothed |G|^2 (NaN before the first update)."""
        return self._den / self._weight if self.steps else math.nan

    @property
    def value(self) -> float:
        """Smoothed B_simple; NaN before the first update, inf if |G|^2 <= 0."""
        if not self.steps:
            return math.nan
        return _ratio(self.trace_sigma, self.g_norm2)


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
# §6.2 decomposition along the prompt and rollout axes


def prompt_axis_b_noise(gram: np.ndarray, groups: np.ndarray) -> float:
    """Prompt-axis B_noise: B_simple on the Gram of group means (science §6.2).

    Each prompt's mean gradient ``gbar_p`` is one sample of the prompt axis;
    their Gram matrix is the block means of K.
    """
    k = _as_gram(gram)
    order, p, n = _group_order(groups, k.shape[0])
    return b_simple(_block_means(k, order, p, n))


def rollout_axis_noise(gram: np.ndarray, groups: np.ndarray) -> float:
    """Rollout-axis noise scale ``mean_p w_p / |G|^2_hat`` (science §6.2).

    ``w_p = (sum_{i in p} K_ii - n |gbar_p|^2) / (n - 1)`` is prompt p's
    within-group noise power; ``|G|^2_hat`` is :func:`g_norm2` over all rows.
    Infinite when ``|G|^2_hat <= 0``.
    """
    k = _as_gram(gram)
    order, p, n = _group_order(groups, k.shape[0])
    m = _block_means(k, order, p, n)
    w = _within_sums(k, order, p, n, m) / (n - 1)
    return _ratio(float(w.mean()), g_norm2(k))


@dataclass(frozen=True)
class NoiseDecomposition:
    """Step-level noise summary (science §6.2, §6.3); fields of the noise_steps table."""

    n_rollouts: int
    n_prompts: int
    n: int
    trace_sigma: float
    g_norm2: float
    b_simple: float
    b_naive: float
    prompt_noise: float
    rollout_noise: float
    rho_icc: float
    k_sat_icc: float
    k_crit: float
    crs: float


def decompose(gram: np.ndarray, groups: np.ndarray) -> NoiseDecomposition:
    """All step-level noise numbers of one measurement step (science §6.2, §6.3).

    * ``b_simple``, ``trace_sigma``, ``g_norm2``: over all N rollouts as if
      independent.
    * ``b_naive``: mini-batches = the prompt groups (K = P batches of b = n),
      the layout of a GRPO batch whose rows are stored group by group, which
      is what a README-style split of consecutive rows sees.
    * ``prompt_noise`` / ``rollout_noise``: :func:`prompt_axis_b_noise` and
      :func:`rollout_axis_noise`.
    * ``k_crit`` uses ``rho_icc``, ``s = max(tb, 0) + MSW`` (tb read as 0
      where rho_icc is 0, consistent with it) and ``|G|^2_hat`` over all rows;
      ``crs = min(k_sat_icc, k_crit)``.
    """
    k = _as_gram(gram)
    order, p, n = _group_order(groups, k.shape[0])
    icc = icc_components(k, groups)
    g2 = g_norm2(k)
    s = max(icc.tb, 0.0) + icc.msw
    kc = k_crit(icc.rho, s, g2)
    return NoiseDecomposition(
        n_rollouts=k.shape[0],
        n_prompts=p,
        n=n,
        trace_sigma=trace_sigma(k),
        g_norm2=g2,
        b_simple=b_simple(k),
        b_naive=b_naive(k[np.ix_(order, order)], p),
        prompt_noise=prompt_axis_b_noise(k, groups),
        rollout_noise=rollout_axis_noise(k, groups),
        rho_icc=icc.rho,
        k_sat_icc=icc.k_sat,
        k_crit=kc,
        crs=crs(icc.k_sat, kc),
    )


# ---------------------------------------------------------------------------
# §6.3 outlier handling and reporting


def _as_values(values: np.ndarray, name: str) -> np.ndarray:
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D array, got shape {v.shape}")
    if np.any(np.isnan(v)):
        raise ValueError(f"{name}: expected numbers (inf allowed), found NaN")
    return v


def iqr_filter(values: np.ndarray) -> np.ndarray:
    """Keep-mask of the essay's IQR filter (science §6.3).

    Keeps values inside ``[Q1 - 1.5 IQR, Q3 + 1.5 IQR]``, the quartiles
    taken (linear interpolation) over the finite values only. Infinite
    values (K_sat of a group with rho <= 0) are always dropped: they are
    outliers by definition, and letting them into the quartiles would make
    the fences infinite. With no finite values nothing is kept.
    """
    v = _as_values(values, "values")
    finite = np.isfinite(v)
    if not finite.any():
        return np.zeros(v.shape, dtype=bool)
    q1, q3 = np.percentile(v[finite], [25.0, 75.0])
    iqr = q3 - q1
    return finite & (v >= q1 - 1.5 * iqr) & (v <= q3 + 1.5 * iqr)


def _stats(v: np.ndarray) -> dict[str, float]:
    if v.size == 0:
        return {"count": 0, "mean": math.nan, "median": math.nan, "std": math.nan, "max": math.nan}
    return {
        "count": int(v.size),
        "mean": float(np.mean(v)),
        "median": float(np.median(v)),
        "std": float(np.std(v, ddof=1)) if v.size > 1 else math.nan,
        "max": float(np.max(v)),
    }


def summary_stats(values: np.ndarray) -> dict[str, float]:
    """Unfiltered and IQR-filtered count, mean, median, std, max (science §6.3).

    Keys: ``count, mean, median, std, max`` (all values) and the same with a
    ``_filtered`` suffix (after :func:`iqr_filter`). ``std`` is the sample
    std (ddof = 1), as pandas reports it. Unfiltered statistics keep
    infinities as they are: any inf makes ``mean`` and ``max`` inf and
    ``std`` NaN.
    """
    v = _as_values(values, "values")
    out: dict[str, float] = {}
    with np.errstate(invalid="ignore"):
        out.update(_stats(v))
        out.update({f"{key}_filtered": val for key, val in _stats(v[iqr_filter(v)]).items()})
    return out


def quintile_table(
    pass_rates: np.ndarray, k_sats: np.ndarray, drop_outliers: bool = True
) -> pd.DataFrame:
    """K_sat by pass-rate quintile: count, mean, median, std (science §6.3).

    Bins are the quintiles of ``pass_rates`` (``pandas.qcut``); tied
    quintile edges (pass rates are multiples of 1/n) merge bins, so fewer
    than five rows can come back, and one row when all pass rates are equal.
    With ``drop_outliers`` the global :func:`iqr_filter` removes K_sat
    outliers first (binning still uses every prompt) and ``n_outliers``
    counts what was dropped per bin. Index: the pass-rate interval.
    """
    pr = _as_values(pass_rates, "pass_rates")
    ks = _as_values(k_sats, "k_sats")
    if pr.shape != ks.shape:
        raise ValueError(
            f"pass_rates, k_sats: expected equal lengths, got {pr.shape[0]} and {ks.shape[0]}"
        )
    if pr.size == 0:
        raise ValueError("pass_rates: expected at least one value")
    if not np.all(np.isfinite(pr)):
        raise ValueError("pass_rates: expected finite values")
    if np.unique(pr).size == 1:
        bins = pd.Categorical([pd.Interval(pr[0], pr[0], closed="both")] * pr.size)
    else:
        bins = pd.qcut(pr, 5, duplicates="drop")
    keep = iqr_filter(ks) if drop_outliers else np.ones(ks.shape, dtype=bool)
    frame = pd.DataFrame({"bin": bins, "k_sat": ks, "keep": keep})
    with np.errstate(invalid="ignore"):
        grouped = frame[frame["keep"]].groupby("bin", observed=False)["k_sat"]
        table = grouped.agg(["count", "mean", "median", "std"])
    if drop_outliers:
        dropped = (~frame["keep"]).groupby(frame["bin"], observed=False).sum()
        table["n_outliers"] = dropped.astype(int)
    table.index.name = "pass_rate_quintile"
    return table
