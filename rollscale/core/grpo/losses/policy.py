"""Policy losses (science §3): per-token policy-gradient terms, registered in
:data:`rollscale.registry.POLICY_LOSSES` under the values of ``sweep.train.policy_loss``.

A policy loss maps ``(logp_new, logp_old, advantages, settings)`` (``[N, T]``, ``[N, T]``
detached, ``[N, 1]`` detached, the run's ``TrainParams``) to :class:`PolicyTerms`; the caller
masks, weights (truncated importance sampling) and aggregates them. verl's
``compute_policy_loss_vanilla`` is the model; GSPO or CISPO would be siblings here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rollscale.registry import POLICY_LOSSES

if TYPE_CHECKING:
    import torch

CLIP_LOW = 0.2  # eps_low of PPO / GRPO
CLIP_HIGH = 0.2  # eps_high without clip-higher
CLIP_HIGHER = 0.28  # DAPO's eps_high (``clip_higher``)


@dataclass
class PolicyTerms:
    """Per-token policy terms of a batch.

    Attributes:
        tokens: ``[N, T]`` the loss of each token (differentiable).
        clipped: ``[N, T]`` bool, where a clipped term is the active one (``clip_frac``).
    """

    tokens: torch.Tensor
    clipped: torch.Tensor


@POLICY_LOSSES.register("clip")
def clipped_surrogate(logp_new: torch.Tensor, logp_old: torch.Tensor, advantages: torch.Tensor,
                      settings: Any) -> PolicyTerms:
    """The clipped PPO / GRPO surrogate (science §3):
    ``-min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A)`` with ``ratio = exp(new - old)``,
    ``eps_low = 0.2`` and ``eps_high`` 0.2, or 0.28 with ``settings.clip_higher`` (DAPO)."""
    clip_high = CLIP_HIGHER if settings.clip_higher else CLIP_HIGH
    ratio = (logp_new - logp_old).exp()
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - CLIP_LOW, 1.0 + clip_high)
    return PolicyTerms(tokens=unclipped.maximum(clipped), clipped=clipped > unclipped)
