"""A ``steps`` row's compute-accounting and rollout columns (science §1, §4), from the step's allocation and the
rollouts it generated; the update's own columns: :mod:`rollscale.train.step`, the halves': :mod:`rollscale.train.halves`."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rollscale.core.rollouts import Rollout

__all__ = ["allocation_columns"]


def _nanmean(values: Sequence[float]) -> float:
    return float(np.mean(values)) if len(values) else float("nan")


def allocation_columns(alloc, generated: Sequence[Rollout]) -> dict:
    """The compute-accounting and rollout columns of a ``steps`` row (science §1, §4):
    ``alloc`` a :class:`~rollscale.core.grpo.allocation.StepAllocation`, ``generated`` every
    rollout the step generated."""
    return {
        "draws": alloc.draws,
        "rollouts_generated": alloc.rollouts_generated,
        "rollouts_trained": alloc.rollouts_trained,
        "pilot_rollouts": alloc.pilot_rollouts,
        "discarded_rollouts": alloc.discarded_rollouts,
        "groups_trained": len(alloc.groups),
        "updated": bool(alloc.groups),
        # over every generated rollout of the step (verifier reward, before any shaping)
        "reward_mean": _nanmean([r.reward for r in generated]),
        # drawn prompts whose generated rewards were all equal (pilot rewards for Pilot-Commit)
        "zero_var_frac": alloc.zero_variance_draws / alloc.draws,
        "response_len_mean": _nanmean([r.n_tokens for r in generated]),
        "trunc_frac": _nanmean([float(r.truncated) for r in generated]),
    }
