"""The GRPO training loss of one batch (science §3): the registered pieces of
:mod:`rollscale.core.grpo.losses` put together.

Per token: the policy loss named by ``settings.policy_loss`` (the clipped surrogate by
default), weighted by truncated importance sampling when a separate sampler drew the tokens,
plus the k3 KL and minus the entropy bonus (on every rollout, or with the zero-variance
filter only on groups whose rewards vary), aggregated by ``settings.agg_mode``. Conventions
follow verl's ``core_algos`` (``agg_loss``, ``kl_penalty`` "low_var_kl" = k3, clip-higher via
separate ``clip_ratio_low`` / ``clip_ratio_high``) and TRL's ``GRPOTrainer``; the code is our own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from rollscale.core.grpo.losses.aggregation import LossNormalizers, loss_normalizers
from rollscale.core.grpo.losses.regularizers import importance_weights, k3_kl, regularizer_weights
from rollscale.registry import LOSS_AGGREGATIONS, POLICY_LOSSES

if TYPE_CHECKING:
    from rollscale.config import TrainParams


def _describe(x) -> str:
    return f"shape {tuple(x.shape)}" if hasattr(x, "shape") else type(x).__name__


@dataclass
class LossOutput:
    """Result of :func:`grpo_loss`.

    Attributes:
        loss: the scalar training loss (differentiable).
        per_rollout: [N] each rollout's own term of ``loss``; ``per_rollout.sum()``
            is ``loss`` (it is computed that way), so ``grad(per_rollout[i])`` is the
            per-rollout gradient g_i of science §6.1.
        policy_loss: the policy term alone (after importance weighting), aggregated the same way.
        kl: mean k3 KL per masked-in token (all masked-in tokens, whatever the
            zero-variance filter); NaN when no reference log-probs were given.
        entropy: mean entropy per masked-in token; NaN when not given.
        clip_frac: fraction of masked-in tokens where the clipped term is the active one.
        n_tokens: number of masked-in tokens.
        logp_mismatch: mean ``|logp_old - logp_sampler|`` per masked-in token;
            NaN when the sampler's log-probs were not given.
        sampler_kl: mean k3 estimate of KL(sampler || trainer) per masked-in token; NaN likewise.
        tis_frac: fraction of masked-in tokens whose importance weight hit ``tis_cap``; NaN likewise.
    """

    loss: torch.Tensor
    per_rollout: torch.Tensor
    policy_loss: float
    kl: float
    entropy: float
    clip_frac: float
    n_tokens: int
    logp_mismatch: float = float("nan")
    sampler_kl: float = float("nan")
    tis_frac: float = float("nan")


def _check_token_tensor(x: torch.Tensor | None, name: str, shape: torch.Size) -> None:
    if x is None:
        return
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor of shape {tuple(shape)}, got {type(x).__name__}")
    if x.shape != shape:
        raise ValueError(f"{name} must have shape {tuple(shape)} (like logp_new), got {tuple(x.shape)}")


def grpo_loss(
    logp_new: torch.Tensor,
    logp_old: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    settings: TrainParams,
    logp_ref: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    regularize: torch.Tensor | None = None,
    normalizers: LossNormalizers | None = None,
    logp_sampler: torch.Tensor | None = None,
    max_new_tokens: int | None = None,
) -> LossOutput:
    """The GRPO training loss of one batch of rollouts (science §3).

    Per token ``t`` of rollout ``i`` (completion tokens only):
    ``l_it = policy_it + kl_coef * k3_it - entropy_coef * H_it``, the policy term
    from ``settings.policy_loss`` (:mod:`rollscale.core.grpo.losses.policy`; the clipped
    surrogate ``-min(ratio * A_i, clip(ratio, 1 - eps_low, 1 + eps_high) * A_i)``
    by default). With ``settings.zero_var_filter`` the KL and entropy terms are kept
    only on rollouts flagged in ``regularize`` (zero elsewhere; the aggregation
    denominators are unchanged, since aggregation applies to the combined loss).
    ``settings.agg_mode`` aggregates over masked-in tokens
    (:mod:`rollscale.core.grpo.losses.aggregation`).

    A batch with no masked-in token has loss 0 (not NaN). ``normalizers`` gives
    the denominators of a larger batch this call is a micro-batch of (default:
    this call's own, with ``max_new_tokens``), so micro-batch losses add up to the
    full-batch loss.

    Off-policy correction: with ``logp_sampler`` (the log-probs of a separate
    sampling engine) and ``settings.tis_cap > 0`` the policy term of each token is
    multiplied by the detached truncated importance weight
    ``min(exp(logp_old - logp_sampler), tis_cap)`` (verl's TIS; decoupled PPO:
    the ratio is clipped against the trainer's ``logp_old``, the weight corrects
    for the sampler having drawn the tokens).

    Args:
        logp_new: [N, T] log-probs of the sampled tokens under the policy being trained.
        logp_old: [N, T] log-probs under the policy that sampled them (detached here).
        advantages: [N] one advantage per rollout (detached here).
        mask: [N, T] 1 for tokens in the loss, 0 for padding and masked-out rollouts.
        settings: the run's ``TrainParams`` (validated: the names and bounds are checked there).
        logp_ref: [N, T] reference-policy log-probs; required when ``kl_coef > 0``.
        entropy: [N, T] per-token entropy of the policy (gradient flows through it);
            required when ``entropy_coef > 0``.
        regularize: [N] bool, which rollouts get KL / entropy; required when
            ``zero_var_filter`` and a regulariser is on, ignored when the filter is off.
        normalizers: the full batch's aggregation denominators (see above).
        logp_sampler: [N, T] log-probs of the sampled tokens under the sampler, or None.
        max_new_tokens: the generation budget (``seq-mean-token-sum-norm``) when
            ``normalizers`` is not given.

    Returns:
        :class:`LossOutput`.
    """
    if not isinstance(logp_new, torch.Tensor) or logp_new.ndim != 2:
        raise ValueError(f"logp_new must be a 2-D [N, T] torch.Tensor, got {_describe(logp_new)}")
    shape = logp_new.shape
    n_rollouts = shape[0]
    _check_token_tensor(logp_old, "logp_old", shape)
    _check_token_tensor(mask, "mask", shape)
    _check_token_tensor(logp_ref, "logp_ref", shape)
    _check_token_tensor(entropy, "entropy", shape)
    _check_token_tensor(logp_sampler, "logp_sampler", shape)
    if not isinstance(advantages, torch.Tensor) or advantages.shape != (n_rollouts,):
        raise ValueError(f"advantages must be a torch.Tensor of shape ({n_rollouts},), got {_describe(advantages)}")
    if not torch.all(torch.isfinite(advantages)):
        raise ValueError("advantages must be finite")
    if settings.kl_coef > 0 and logp_ref is None:
        raise ValueError("logp_ref is required when kl_coef > 0")
    if settings.entropy_coef > 0 and entropy is None:
        raise ValueError("entropy is required when entropy_coef > 0")
    use_filter = settings.zero_var_filter and (settings.kl_coef > 0 or settings.entropy_coef > 0)
    if use_filter:
        if regularize is None:
            raise ValueError("regularize ([N] bool) is required when zero_var_filter and KL or entropy is on")
        if not isinstance(regularize, torch.Tensor) or regularize.shape != (n_rollouts,):
            raise ValueError(f"regularize must be a torch.Tensor of shape ({n_rollouts},), got {_describe(regularize)}")
    if not torch.all((mask == 0) | (mask == 1)):
        raise ValueError("mask must contain only 0 and 1")
    policy_loss_fn = POLICY_LOSSES.get(settings.policy_loss)
    aggregation = LOSS_AGGREGATIONS.get(settings.agg_mode)

    dtype = logp_new.dtype
    m = mask.to(dtype)
    keep = m > 0
    # Neutral values on masked-out tokens, so padding that holds -inf or NaN cannot
    # turn 0 * inf into NaN in the loss or its gradient.
    logp_old = torch.where(keep, logp_old.detach(), torch.zeros_like(m))
    logp_new = torch.where(keep, logp_new, logp_old)
    if logp_ref is not None:
        logp_ref = torch.where(keep, logp_ref.detach(), logp_new.detach())
    if entropy is not None:
        entropy = torch.where(keep, entropy, torch.zeros_like(m))
    policy = policy_loss_fn(logp_new, logp_old, advantages.detach().to(dtype)[:, None], settings)
    pg_tok = policy.tokens
    sampler_stats = (math.nan, math.nan, math.nan)
    if logp_sampler is not None:
        logp_sampler = torch.where(keep, logp_sampler.detach().to(dtype), logp_old)
        log_w, tis_w = importance_weights(logp_old, logp_sampler)
        capped = tis_w > settings.tis_cap
        if settings.tis_cap > 0:
            pg_tok = pg_tok * tis_w.clamp(max=settings.tis_cap)
        with torch.no_grad():
            n_keep = max(float(m.sum().item()), 1.0)
            sampler_stats = (
                float((log_w.abs() * m).sum().item() / n_keep),
                float((k3_kl(logp_sampler, logp_old) * m).sum().item() / n_keep),
                float((capped.to(dtype) * m).sum().item() / n_keep) if settings.tis_cap > 0 else math.nan,
            )

    reg_weight = regularizer_weights(m, regularize if use_filter else None)
    total_tok = pg_tok
    kl_tok = None
    if logp_ref is not None:
        kl_tok = k3_kl(logp_new, logp_ref)
        if settings.kl_coef > 0:
            total_tok = total_tok + settings.kl_coef * kl_tok * reg_weight
    if entropy is not None and settings.entropy_coef > 0:
        total_tok = total_tok - settings.entropy_coef * entropy * reg_weight

    if normalizers is None:
        normalizers = loss_normalizers(m, max_new_tokens)
    weights = aggregation(m, normalizers)  # [N, T], zero on masked-out tokens
    per_rollout = (total_tok * weights).sum(dim=1)
    loss = per_rollout.sum()

    n_tokens = int(m.sum().item())
    with torch.no_grad():
        policy_loss = float((pg_tok * weights).sum().item())
        denom = max(n_tokens, 1)
        clip_frac = float((policy.clipped.to(dtype) * m).sum().item() / denom)
        kl = float((kl_tok * m).sum().item() / denom) if kl_tok is not None and n_tokens else float("nan")
        ent = float((entropy * m).sum().item() / denom) if entropy is not None and n_tokens else float("nan")
    return LossOutput(
        loss=loss,
        per_rollout=per_rollout,
        policy_loss=policy_loss,
        kl=kl,
        entropy=ent,
        clip_frac=clip_frac,
        n_tokens=n_tokens,
        logp_mismatch=sampler_stats[0],
        sampler_kl=sampler_stats[1],
        tis_frac=sampler_stats[2],
    )
