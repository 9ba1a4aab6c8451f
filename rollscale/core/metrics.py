"""Evaluation metrics: avg@k, best@k (coverage), worst@k and the standard
error of a per-problem mean (science §5, §2).

``best_at_k`` and ``worst_at_k`` are the unbiased estimators from ``N >= k``
samples with ``c`` correct (Chen et al. 2021), computed as products of ratios
(as in the Codex paper's numpy snippet) rather than from binomial coefficients,
which overflow floats for large N. All take scalars or numpy arrays
(broadcast together) and return a float for scalar input, an array otherwise.
"""

from __future__ import annotations

import numpy as np


def _as_counts(value, name: str) -> np.ndarray:
    arr = np.asarray(value)
    if arr.dtype == np.bool_ or not (np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)):
        raise ValueError(f"{name} must be integer counts, got dtype {arr.dtype}")
    if np.issubdtype(arr.dtype, np.floating):
        if not np.all(np.isfinite(arr)) or not np.all(arr == np.round(arr)):
            raise ValueError(f"{name} must be whole numbers")
    return arr.astype(np.int64)


def _counts(n_samples, n_correct, k=None):
    n = _as_counts(n_samples, "n_samples")
    c = _as_counts(n_correct, "n_correct")
    if k is None:
        if np.any(n < 1):
            raise ValueError("n_samples must be >= 1")
        n, c = np.broadcast_arrays(n, c)
        kk = None
    else:
        kk = _as_counts(k, "k")
        if np.any(kk < 1):
            raise ValueError("k must be >= 1")
        n, c, kk = np.broadcast_arrays(n, c, kk)
        if np.any(n < kk):
            raise ValueError("n_samples must be >= k")
    if np.any(c < 0) or np.any(c > n):
        raise ValueError("n_correct must satisfy 0 <= n_correct <= n_samples")
    return n, c, kk


def _out(values: np.ndarray, *inputs):
    return float(values) if all(np.ndim(x) == 0 for x in inputs) else values


def _falling_ratio(top: np.ndarray, n: np.ndarray, k: np.ndarray) -> np.ndarray:
    """``C(top, k) / C(n, k) = prod_{j<k} (top - j) / (n - j)`` elementwise (0 when top < k)."""
    if top.size == 0:
        return np.zeros(top.shape, dtype=np.float64)
    j = np.arange(int(k.max()))
    shape = (1,) * top.ndim + (-1,)
    j = j.reshape(shape)
    num = np.maximum(top[..., None] - j, 0).astype(np.float64)
    den = (n[..., None] - j).astype(np.float64)
    active = j < k[..., None]
    # Inactive factors (j >= k) are 1; their denominators may be <= 0, so never divide there.
    factors = np.divide(num, den, out=np.ones_like(num), where=active)
    return np.prod(factors, axis=-1)


def avg_at_k(n_correct, n_samples):
    """avg@k of one or many problems: the fraction of the k samples that are correct (science §2, §5)."""
    n, c, _ = _counts(n_samples, n_correct)
    return _out(c / n, n_samples, n_correct)


def best_at_k(n_samples, n_correct, k):
    """Unbiased best@k (pass@k, coverage) from N samples with c correct (science §5).

    ``1 - C(N - c, k) / C(N, k)``: the probability that at least one of k
    samples drawn without replacement from the N is correct (Chen et al. 2021).
    """
    n, c, kk = _counts(n_samples, n_correct, k)
    return _out(1.0 - _falling_ratio(n - c, n, kk), n_samples, n_correct, k)


def worst_at_k(n_samples, n_correct, k):
    """Unbiased worst@k from N samples with c correct (science §5).

    ``C(c, k) / C(N, k)``: the probability that all k samples drawn without
    replacement from the N are correct.
    """
    n, c, kk = _counts(n_samples, n_correct, k)
    return _out(_falling_ratio(c, n, kk), n_samples, n_correct, k)


def standard_error(per_problem_values) -> float:
    """Standard error of the mean over problems: ``std(ddof=1) / sqrt(P)`` (science §5).

    Needs at least two finite values.
    """
    v = np.asarray(per_problem_values, dtype=np.float64)
    if v.ndim != 1:
        raise ValueError(f"per_problem_values must be 1-D, got shape {v.shape}")
    if v.size < 2:
        raise ValueError(f"per_problem_values needs at least 2 values for a standard error, got {v.size}")
    if not np.all(np.isfinite(v)):
        raise ValueError("per_problem_values must be finite")
    return float(v.std(ddof=1) / np.sqrt(v.size))
