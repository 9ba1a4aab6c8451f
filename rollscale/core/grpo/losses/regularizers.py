"""The regularisers of the GRPO loss (science §3): the k3 KL estimate to the reference
policy, the zero-variance filter on regularisers, and truncated importance sampling of a
separate sampler's tokens (verl's ``kl_penalty`` "low_var_kl" and TIS; our own code)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# verl clamps the log-ratio of the k3 estimator to this range so that exp() stays finite.
LOG_RATIO_CLAMP = 20.0


def k3_kl(logp_new: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(new || ref): ``exp(ref - new) - (ref - new) - 1`` (science §3).

    Non-negative for every token; unbiased for the KL when tokens are sampled
    from the new policy. The log-ratio is clamped to [-20, 20] (as verl does) so
    the exponential stays finite.
    """
    log_ratio = (logp_ref - logp_new).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return log_ratio.exp() - log_ratio - 1.0


def regularizer_weights(m: torch.Tensor, regularize: torch.Tensor | None) -> torch.Tensor:
    """Where KL and entropy apply: the mask, or with the zero-variance filter (``regularize``
    given, [N] bool) only the rollouts of groups whose rewards vary (science §3)."""
    return m if regularize is None else m * regularize.to(m.dtype)[:, None]


def importance_weights(logp_old: torch.Tensor, logp_sampler: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(log w, w)`` of truncated importance sampling: ``w = exp(logp_old - logp_sampler)``, the
    trainer's over the sampler's probability of each sampled token, clamped so exp() stays finite.
    The caller multiplies the policy term by ``min(w, tis_cap)`` (verl's ``tis_imp_ratio_cap``)."""
    log_w = logp_old - logp_sampler
    return log_w, log_w.clamp(max=LOG_RATIO_CLAMP).exp()
