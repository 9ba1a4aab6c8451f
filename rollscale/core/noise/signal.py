"""The between-prompt signal and the noise powers of one step's Gram matrix (science §6.2).

Input checks shared by every estimator of §6 (a
symmetric finite Gram matrix, equal-sized prompt groups), then ``|G|^2_hat``
from between-prompt pairs only, the per-rollout, prompt-axis and rollout-axis
noise powers, and the noise scales they give: B_simple, the biased B_naive
kept for comparison, prompt-axis B_noise and the rollout-axis noise scale.
"""

from __future__ import annotations

import math

import numpy as np


# ---------------------------------------------------------------------------
# input checks


def as_gram(gram: np.ndarray, min_size: int = 2, name: str = "gram") -> np.ndarray:
    """``gram`` as a float64 array, checked: square, at least ``min_size`` rows, finite, symmetric."""
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


def group_order(groups: np.ndarray, n_rows: int, min_n: int = 2) -> tuple[np.ndarray, int, int]:
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


def block_means(k: np.ndarray, order: np.ndarray, n_blocks: int, size: int) -> np.ndarray:
    """Gram matrix of block-mean gradients: M_pq = <gbar_p, gbar_q>."""
    kk = k[np.ix_(order, order)].reshape(n_blocks, size, n_blocks, size)
    return kk.mean(axis=(1, 3))


def noise_ratio(num: float, den: float) -> float:
    """A noise power over the signal ``|G|^2_hat``; infinite when the signal estimate is not positive."""
    return math.inf if den <= 0.0 else num / den


def within_sums(
    k: np.ndarray, order: np.ndarray, p: int, n: int, m: np.ndarray
) -> np.ndarray:
    """Per prompt ``sum_i |g_pi - gbar_p|^2 = sum_i K_ii - n |gbar_p|^2``."""
    diag = np.diag(k)[order].reshape(p, n).sum(axis=1)
    return diag - n * np.diag(m)




# ---------------------------------------------------------------------------
# §6.2 B_noise from between-prompt pairs


def _block_gram(gram: np.ndarray, groups: np.ndarray, min_n: int = 1) -> tuple[np.ndarray, np.ndarray, int, int]:
    """(K, M, P, n): the checked Gram matrix and the Gram of prompt means ``M_pq``."""
    k = as_gram(gram)
    order, p, n = group_order(groups, k.shape[0], min_n)
    return k, block_means(k, order, p, n), p, n


def between_mean(m: np.ndarray) -> float:
    """Mean off-diagonal entry of the prompt-mean Gram ``M``: ``|G|^2_hat`` (between-prompt pairs only)."""
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
    return between_mean(m)


def g_norm2_all_pairs(gram: np.ndarray) -> float:
    """All-pairs ``sum_{i != j} K_ij / (N (N - 1))`` — a named comparison only (science §6.2).

    It counts two rollouts of one prompt as independent samples, so it is
    biased upward by the within-prompt covariance.
    """
    k = as_gram(gram)
    n = k.shape[0]
    return float((k.sum() - np.trace(k)) / (n * (n - 1)))


def trace_sigma(gram: np.ndarray, groups: np.ndarray) -> float:
    """Per-rollout noise power ``s_hat = mean_i K_ii - |G|^2_hat`` (science §6.2)."""
    k, m, _, _ = _block_gram(gram, groups)
    return float(np.mean(np.diag(k))) - between_mean(m)


def b_simple(gram: np.ndarray, groups: np.ndarray) -> float:
    """McCandlish's B_simple in rollouts, ``s_hat / |G|^2_hat`` (science §6.2).

    Infinite when ``|G|^2_hat <= 0``. No smoothing here: see :class:`EmaNoiseScale`.
    """
    return noise_ratio(trace_sigma(gram, groups), g_norm2(gram, groups))


def b_naive(gram: np.ndarray, n_batches: int) -> float:
    """Mini-batch form ``(b / (K - 1)) sum_k |g_k - gbar|^2 / |gbar|^2`` (science §6.2).

    The rows are cut into ``n_batches = K`` mini-batches of ``b = N / K``
    consecutive rows. Kept for comparison with the CBS-in-RLVR README and shown
    only beside the unbiased estimate: its bias has no fixed sign (toward
    ``B / (1 + B / N)`` for independent rollouts, because the plug-in
    ``|gbar|^2`` carries ``tr(Sigma) / N``; upward when mini-batches cut
    across prompt groups). Infinite when ``|gbar|^2 <= 0``.
    """
    k = as_gram(gram)
    n = k.shape[0]
    if isinstance(n_batches, bool) or not isinstance(n_batches, (int, np.integer)):
        raise ValueError(f"n_batches: expected an int, got {n_batches!r}")
    if n_batches < 2:
        raise ValueError(f"n_batches: expected at least 2 mini-batches, got {n_batches}")
    if n % n_batches != 0:
        raise ValueError(f"n_batches: {n_batches} does not divide the {n} rows of gram")
    b = n // n_batches
    m = block_means(k, np.arange(n), int(n_batches), b)
    gbar2 = float(m.mean())
    spread = np.diag(m) - 2.0 * m.mean(axis=1) + gbar2  # |g_k - gbar|^2
    return noise_ratio(b / (n_batches - 1) * float(spread.sum()), gbar2)


def prompt_noise_power(gram: np.ndarray, groups: np.ndarray) -> float:
    """Noise of one prompt's group mean, ``s_P_hat = mean_p M_pp - |G|^2_hat`` (science §6.2)."""
    _, m, _, _ = _block_gram(gram, groups)
    return float(np.mean(np.diag(m))) - between_mean(m)


def rollout_noise_power(gram: np.ndarray, groups: np.ndarray) -> float:
    """Mean within-group noise ``mean_p w_p``, ``w_p = (sum_{i in p} K_ii - n M_pp) / (n - 1)`` (science §6.2)."""
    k = as_gram(gram)
    order, p, n = group_order(groups, k.shape[0], 2)
    m = block_means(k, order, p, n)
    return float(within_sums(k, order, p, n, m).mean()) / (n - 1)


def prompt_axis_b_noise(gram: np.ndarray, groups: np.ndarray) -> float:
    """Prompt-axis B_noise ``s_P_hat / |G|^2_hat``, in prompts at this n (science §6.2)."""
    return noise_ratio(prompt_noise_power(gram, groups), g_norm2(gram, groups))


def rollout_axis_noise(gram: np.ndarray, groups: np.ndarray) -> float:
    """Rollout-axis noise scale ``mean_p w_p / |G|^2_hat`` (science §6.2); inf when ``|G|^2_hat <= 0``."""
    return noise_ratio(rollout_noise_power(gram, groups), g_norm2(gram, groups))
