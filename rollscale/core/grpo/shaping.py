"""Overlong handling and the learning-rate rules of the GRPO step (science §3):
overlong filtering, DAPO's soft overlong penalty, square-root learning-rate
scaling and linear warm-up."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from rollscale.core.checks import is_int


def overlong_filter_mask(truncated: Sequence[bool]) -> np.ndarray:
    """Keep-mask of overlong filtering (science §3): False for rollouts that hit
    ``max_new_tokens`` without an end marker (masked out of the loss, still
    counted in C), True otherwise."""
    arr = np.asarray(truncated)
    if arr.ndim != 1:
        raise ValueError(f"truncated must be a 1-D sequence of bools, got shape {arr.shape}")
    if arr.size and arr.dtype != np.bool_:
        if not np.all(np.isin(arr, (0, 1))):
            raise ValueError("truncated must contain only booleans (or 0/1)")
    return ~arr.astype(bool)


def overlong_penalty(lengths, max_new_tokens: int, cache_len: int) -> np.ndarray:
    """DAPO's soft overlong punishment (Yu et al. 2025, eq. 13; science §3).

    With ``L_max = max_new_tokens`` and ``L_cache = cache_len``, a response of
    length ``L`` gets ``0`` if ``L <= L_max - L_cache``, ``(L_max - L_cache - L) / L_cache``
    if ``L_max - L_cache < L <= L_max``, and ``-1`` if ``L > L_max``. Added to the
    verifier reward.
    """
    if not is_int(max_new_tokens) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
    if not is_int(cache_len) or not 1 <= cache_len <= max_new_tokens:
        raise ValueError(f"cache_len must be an int in [1, max_new_tokens={max_new_tokens}], got {cache_len!r}")
    lengths_arr = np.asarray(lengths, dtype=np.float64)
    if not np.all(np.isfinite(lengths_arr)) or np.any(lengths_arr < 0):
        raise ValueError("lengths must be finite and >= 0")
    soft_start = max_new_tokens - cache_len
    penalty = np.where(lengths_arr <= soft_start, 0.0, (soft_start - lengths_arr) / cache_len)
    return np.where(lengths_arr > max_new_tokens, -1.0, penalty)


def sqrt_scaled_lr(lr_base: float, batch_size: int, base_batch_size: int) -> float:
    """Square-root learning-rate scaling ``lr_base * sqrt(B / B_base)`` (science §3)."""
    if not (math.isfinite(lr_base) and lr_base > 0):
        raise ValueError(f"lr_base must be a finite number > 0, got {lr_base!r}")
    if batch_size <= 0:
        raise ValueError(f"batch_size must be > 0, got {batch_size!r}")
    if base_batch_size <= 0:
        raise ValueError(f"base_batch_size must be > 0, got {base_batch_size!r}")
    return float(lr_base * math.sqrt(batch_size / base_batch_size))


# how far a run must move the policy to count as moved: a completion token's log-prob changed by 0.05 nats
# (a 5 % change of its probability), i.e. a per-token KL to the start of about 0.05^2 / 2 (KL ~ E[d logp^2] / 2
# for small changes). A judgement, not a measurement: the issue-32/43 SmolLM2 runs that never learned were far
# below it
LOGP_MOVE_MIN = 0.05
KL_MOVED = LOGP_MOVE_MIN**2 / 2


def lr_to_move(lr: float, kl: float, target: float = KL_MOVED) -> float | None:
    """The learning rate at which a run that reached per-token KL ``kl`` to its start at ``lr`` would reach
    ``target`` in as many steps: for small updates the weights move in proportion to lr (AdamW's steps are about
    lr each) and KL grows with the square of the move, so ``lr sqrt(target / kl)``. None where ``kl`` is not a
    positive finite number (nothing measured, or the KL term off)."""
    if not (math.isfinite(lr) and lr > 0 and math.isfinite(kl) and kl > 0):
        return None
    return float(lr * math.sqrt(target / kl))


def round_up(x: float) -> float:
    """``x`` rounded up to two significant digits: a rate that reaches its target, not one just short of it."""
    if not x > 0:
        return x
    e = math.floor(math.log10(x)) - 1
    return float(f"{math.ceil(x / 10**e - 1e-9) * 10**e:.2g}")  # 1e-9: 2.7e-5 / 1e-6 is 27.000000000000004


def kl_after(probe_kl: Sequence[float], probe_lr: float, lr: float, steps: int, warmup_steps: int = 0) -> float:
    """The per-token KL to the start a run of ``steps`` GRPO steps at ``lr`` (after a linear warm-up of
    ``warmup_steps``) reaches, from a probe's KL after each of its first steps at ``probe_lr`` without warm-up.
    For small updates the weights move in proportion to each step's rate, and KL grows with the square
    of the move: with lr^2, and with the steps to a power alpha, 2 for steps that all point one way, 1 for a random
    walk; the probe's own growth (a line in log-log) sets alpha, held in [1, 2] (1 when it has one usable point).
    A warm-up's steps count by their share of the rate (the issue-43 SmolLM2 runs, warm-up 10 of 12-25 steps,
    reached 0.4x the KL of as many full steps). 0 when the probe measured 0 throughout (every group's rewards
    tied: no gradient); NaN when it measured nothing."""
    kl = np.asarray(probe_kl, dtype=np.float64)
    s = np.arange(1, kl.size + 1, dtype=np.float64)
    finite = np.isfinite(kl)
    if not finite.any() or not (math.isfinite(probe_lr) and probe_lr > 0):
        return math.nan
    ok = finite & (kl > 0)
    if not ok.any():
        return 0.0
    alpha = float(np.clip(np.polyfit(np.log(s[ok]), np.log(kl[ok]), 1)[0], 1.0, 2.0)) if ok.sum() >= 2 else 1.0
    last = np.flatnonzero(ok)[-1]
    full = sum(warmup_factor(step, warmup_steps) for step in range(steps))  # the run's steps at its full rate
    return float(kl[last] * (lr / probe_lr) ** 2 * (full / s[last]) ** alpha)


def warmup_factor(step: int, warmup_steps: int) -> float:
    """Linear warm-up then constant (science §3): the factor on the learning rate.

    ``step`` counts optimizer steps already taken, from 0 (the convention of
    ``torch.optim.lr_scheduler.LambdaLR``): ``min(1, (step + 1) / warmup_steps)``,
    so the first step uses ``1 / warmup_steps`` (never 0) and step
    ``warmup_steps - 1`` the full rate. ``warmup_steps = 0`` means no warm-up.
    """
    if step < 0:
        raise ValueError(f"step must be >= 0 (counted from 0), got {step!r}")
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps!r}")
    if warmup_steps == 0:
        return 1.0
    return float(min(1.0, (step + 1) / warmup_steps))
