"""Advantage estimators of GRPO (science §3): group-normalised, and Dr.GRPO's unscaled one.

Registered in :data:`rollscale.registry.ADVANTAGE_ESTIMATORS` under the values of
``sweep.train.advantage_scale``; each maps a group's rewards (1-D, or 2-D groups x n)
to advantages of the same shape.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np

from rollscale.registry import ADVANTAGE_ESTIMATORS


def _as_reward_array(rewards, name: str = "rewards") -> np.ndarray:
    arr = np.asarray(rewards, dtype=np.float64)
    if arr.ndim not in (1, 2):
        raise ValueError(f"{name} must be 1-D (one group) or 2-D (groups x n), got shape {arr.shape}")
    if arr.shape[-1] == 0:
        raise ValueError(f"{name} must have at least one rollout per group, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite, got non-finite values")
    return arr


def group_advantages(
    rewards, scale: Literal["group", "none"] = "group", eps: float = 1e-6
) -> np.ndarray:
    """GRPO group-relative advantages (science §3).

    ``A_i = (r_i - mean(r)) / (std(r) + eps)`` within each group, ``std`` the
    Bessel-corrected sample standard deviation (ddof=1). ``scale="none"`` drops
    the division (Dr.GRPO). A group whose rewards are all equal, and a group of
    one rollout, get advantages that are exactly zero.

    Args:
        rewards: 1-D (one group) or 2-D (groups x n) rewards.
        scale: "group" (divide by the group std) or "none" (Dr.GRPO).
        eps: added to the std before dividing; must be >= 0.

    Returns:
        float64 array of the same shape as ``rewards``.
    """
    if scale not in ("group", "none"):
        raise ValueError(f"scale must be 'group' or 'none', got {scale!r}")
    if not (math.isfinite(eps) and eps >= 0):
        raise ValueError(f"eps must be a finite number >= 0, got {eps!r}")
    arr = _as_reward_array(rewards)
    groups = arr.reshape(-1, arr.shape[-1])
    n = groups.shape[1]
    if n == 1:
        return np.zeros_like(arr)
    centered = groups - groups.mean(axis=1, keepdims=True)
    # Exact zeros for zero-variance groups: the float mean of equal values need not equal them.
    constant = np.ptp(groups, axis=1) == 0
    centered[constant] = 0.0
    if scale == "group":
        std = groups.std(axis=1, ddof=1, keepdims=True)
        denom = std + eps
        # eps = 0 with a constant group: centered is already 0; avoid 0/0.
        denom[constant] = 1.0
        centered = centered / denom
    return centered.reshape(arr.shape)


@ADVANTAGE_ESTIMATORS.register("group")
def grpo_advantages(rewards) -> np.ndarray:
    """GRPO: centred on the group mean, divided by the group std (science §3)."""
    return group_advantages(rewards, "group")


@ADVANTAGE_ESTIMATORS.register("none")
def dr_grpo_advantages(rewards) -> np.ndarray:
    """Dr.GRPO: centred on the group mean, not divided (science §3)."""
    return group_advantages(rewards, "none")


def nonzero_variance_mask(rewards) -> np.ndarray:
    """Per-rollout flag: does the rollout's group have nonzero reward variance?

    The ``regularize`` argument of :func:`~rollscale.core.grpo.loss.grpo_loss` under the
    zero-variance filter on regularisers (science §3). ``rewards`` is 1-D (one group)
    or 2-D (groups x n); the result has the same shape, dtype bool.
    """
    arr = _as_reward_array(rewards)
    groups = arr.reshape(-1, arr.shape[-1])
    flags = np.broadcast_to((np.ptp(groups, axis=1) > 0)[:, None], groups.shape)
    return flags.reshape(arr.shape).copy()
