"""The GRPO step: group advantages, the clipped policy loss with its
aggregation modes, KL and entropy regularisers, overlong handling, the
learning-rate schedule and the per-token log-probabilities (science §3).

Conventions follow verl's ``core_algos`` (``agg_loss``, ``kl_penalty`` "low_var_kl"
= k3, clip-higher via separate ``clip_ratio_low`` / ``clip_ratio_high``) and TRL's
``GRPOTrainer``; the code here is our own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from rollscale.core.checks import is_int

# per-token log-probabilities (memory-bounded) and the overlong / learning-rate rules
# live in their own modules; re-exported here, the step's one import
from rollscale.core.logprobs import token_logprobs_and_entropy  # noqa: F401
from rollscale.core.shaping import (  # noqa: F401
    overlong_filter_mask,
    overlong_penalty,
    sqrt_scaled_lr,
    warmup_factor,
)

AggMode = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
AGG_MODES: tuple[str, ...] = (
    "token-mean",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
)

# verl clamps the log-ratio of the k3 estimator to this range so that exp() stays finite.
_K3_LOG_RATIO_CLAMP = 20.0


def _describe(x) -> str:
    return f"shape {tuple(x.shape)}" if hasattr(x, "shape") else type(x).__name__


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


def nonzero_variance_mask(rewards) -> np.ndarray:
    """Per-rollout flag: does the rollout's group have nonzero reward variance?

    The ``regularize`` argument of :func:`grpo_loss` under the zero-variance
    filter on regularisers (science §3). ``rewards`` is 1-D (one group) or 2-D
    (groups x n); the result has the same shape, dtype bool.
    """
    arr = _as_reward_array(rewards)
    groups = arr.reshape(-1, arr.shape[-1])
    flags = np.broadcast_to((np.ptp(groups, axis=1) > 0)[:, None], groups.shape)
    return flags.reshape(arr.shape).copy()


@dataclass(frozen=True)
class LossConfig:
    """Settings of the GRPO training loss (science §3).

    Attributes:
        clip_low: eps_low, the ratio is clipped below at ``1 - clip_low``.
        clip_high: eps_high, clipped above at ``1 + clip_high`` (0.28 for DAPO clip-higher).
        agg_mode: how per-token losses become one scalar (see :func:`grpo_loss`).
        kl_coef: beta, the coefficient of the k3 KL estimate to the reference policy.
        entropy_coef: the coefficient of the entropy bonus (subtracted from the loss).
        zero_var_filter: apply KL and entropy only to rollouts of groups with
            nonzero reward variance (the ``regularize`` flags of :func:`grpo_loss`).
        max_new_tokens: the generation budget; the constant normaliser of
            ``seq-mean-token-sum-norm`` (required for that mode).
        tis_cap: truncated importance sampling on the sampler/trainer mismatch:
            the policy term of each token is weighted by
            ``min(exp(logp_old - logp_sampler), tis_cap)`` when the sampler's
            log-probs are given (verl's ``tis_imp_ratio_cap``); 0 = off.
    """

    clip_low: float = 0.2
    clip_high: float = 0.2
    agg_mode: AggMode = "token-mean"
    kl_coef: float = 0.0
    entropy_coef: float = 0.0
    zero_var_filter: bool = False
    max_new_tokens: int | None = None
    tis_cap: float = 2.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.clip_low) and 0.0 <= self.clip_low < 1.0):
            raise ValueError(f"clip_low must be in [0, 1), got {self.clip_low!r}")
        if not (math.isfinite(self.clip_high) and self.clip_high >= 0.0):
            raise ValueError(f"clip_high must be a finite number >= 0, got {self.clip_high!r}")
        if self.agg_mode not in AGG_MODES:
            raise ValueError(f"agg_mode must be one of {AGG_MODES}, got {self.agg_mode!r}")
        if not (math.isfinite(self.kl_coef) and self.kl_coef >= 0.0):
            raise ValueError(f"kl_coef must be a finite number >= 0, got {self.kl_coef!r}")
        if not (math.isfinite(self.entropy_coef) and self.entropy_coef >= 0.0):
            raise ValueError(f"entropy_coef must be a finite number >= 0, got {self.entropy_coef!r}")
        if not isinstance(self.zero_var_filter, bool):
            raise ValueError(f"zero_var_filter must be a bool, got {self.zero_var_filter!r}")
        if self.max_new_tokens is not None and (not is_int(self.max_new_tokens) or self.max_new_tokens < 1):
            raise ValueError(f"max_new_tokens must be a positive int or None, got {self.max_new_tokens!r}")
        if not (math.isfinite(self.tis_cap) and self.tis_cap >= 0.0):
            raise ValueError(f"tis_cap must be a finite number >= 0 (0 = off), got {self.tis_cap!r}")
        if self.agg_mode == "seq-mean-token-sum-norm" and self.max_new_tokens is None:
            raise ValueError("agg_mode 'seq-mean-token-sum-norm' needs max_new_tokens (its normaliser)")


@dataclass(frozen=True)
class LossNormalizers:
    """The batch-level denominators of the aggregation modes (science §3).

    Computed once over the whole batch before a micro-batch loop, so that the
    sum of the micro-batches' losses is the full-batch loss in every mode.

    Attributes:
        n_tokens: masked-in tokens of the batch (``token-mean``).
        n_seqs: rollouts with at least one masked-in token (the ``seq-mean-*`` modes).
    """

    n_tokens: float
    n_seqs: float


def loss_normalizers(mask: torch.Tensor) -> LossNormalizers:
    """:class:`LossNormalizers` of a ``[N, T]`` 0/1 loss mask."""
    per_seq = mask.sum(dim=1)
    return LossNormalizers(n_tokens=float(per_seq.sum().item()), n_seqs=float((per_seq > 0).sum().item()))


@dataclass
class LossOutput:
    """Result of :func:`grpo_loss`.

    Attributes:
        loss: the scalar training loss (differentiable).
        per_rollout: [N] each rollout's own term of ``loss``; ``per_rollout.sum()``
            is ``loss`` (it is computed that way), so ``grad(per_rollout[i])`` is the
            per-rollout gradient g_i of science §6.1.
        policy_loss: the clipped policy term alone, aggregated the same way.
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


def k3_kl(logp_new: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(new || ref): ``exp(ref - new) - (ref - new) - 1`` (science §3).

    Non-negative for every token; unbiased for the KL when tokens are sampled
    from the new policy. The log-ratio is clamped to [-20, 20] (as verl does) so
    the exponential stays finite.
    """
    log_ratio = torch.clamp(logp_ref - logp_new, -_K3_LOG_RATIO_CLAMP, _K3_LOG_RATIO_CLAMP)
    return torch.exp(log_ratio) - log_ratio - 1.0


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
    cfg: LossConfig,
    logp_ref: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    regularize: torch.Tensor | None = None,
    normalizers: LossNormalizers | None = None,
    logp_sampler: torch.Tensor | None = None,
) -> LossOutput:
    """The GRPO training loss of one batch of rollouts (science §3).

    Per token ``t`` of rollout ``i`` (completion tokens only):
    ``l_it = -min(ratio * A_i, clip(ratio, 1 - clip_low, 1 + clip_high) * A_i)
    + kl_coef * k3_it - entropy_coef * H_it`` with ``ratio = exp(new - old)``.
    With ``cfg.zero_var_filter`` the KL and entropy terms are kept only on
    rollouts flagged in ``regularize`` (zero elsewhere; the aggregation
    denominators are unchanged, since aggregation applies to the combined loss).

    Aggregation over masked-in tokens (``mask`` 1), with ``N'`` the number of
    rollouts that have at least one masked-in token (verl's convention: fully
    masked rows, e.g. overlong-filtered rollouts, do not count as sequences):

    - ``token-mean``: ``sum_it m l / sum_it m``;
    - ``seq-mean-token-mean``: ``(1/N') sum_i (sum_t m l / sum_t m)``;
    - ``seq-mean-token-sum``: ``(1/N') sum_i sum_t m l``;
    - ``seq-mean-token-sum-norm``: ``(1/(N' * max_new_tokens)) sum_it m l`` (Dr.GRPO).

    A batch with no masked-in token has loss 0 (not NaN). ``normalizers`` gives
    the denominators of a larger batch this call is a micro-batch of (default:
    this call's own), so micro-batch losses add up to the full-batch loss.

    Off-policy correction: with ``logp_sampler`` (the log-probs of a separate
    sampling engine) and ``cfg.tis_cap > 0`` the policy term of each token is
    multiplied by the detached truncated importance weight
    ``min(exp(logp_old - logp_sampler), tis_cap)`` (verl's TIS; decoupled PPO:
    the ratio is clipped against the trainer's ``logp_old``, the weight corrects
    for the sampler having drawn the tokens).

    Args:
        logp_new: [N, T] log-probs of the sampled tokens under the policy being trained.
        logp_old: [N, T] log-probs under the policy that sampled them (detached here).
        advantages: [N] one advantage per rollout (detached here).
        mask: [N, T] 1 for tokens in the loss, 0 for padding and masked-out rollouts.
        cfg: the loss settings.
        logp_ref: [N, T] reference-policy log-probs; required when ``cfg.kl_coef > 0``.
        entropy: [N, T] per-token entropy of the policy (gradient flows through it);
            required when ``cfg.entropy_coef > 0``.
        regularize: [N] bool, which rollouts get KL / entropy; required when
            ``cfg.zero_var_filter`` and a regulariser is on, ignored when the filter is off.
        normalizers: the full batch's aggregation denominators (see above).
        logp_sampler: [N, T] log-probs of the sampled tokens under the sampler, or None.

    Returns:
        :class:`LossOutput`.
    """
    if not isinstance(cfg, LossConfig):
        raise ValueError(f"cfg must be a LossConfig, got {type(cfg).__name__}")
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
    if cfg.kl_coef > 0 and logp_ref is None:
        raise ValueError("logp_ref is required when cfg.kl_coef > 0")
    if cfg.entropy_coef > 0 and entropy is None:
        raise ValueError("entropy is required when cfg.entropy_coef > 0")
    use_filter = cfg.zero_var_filter and (cfg.kl_coef > 0 or cfg.entropy_coef > 0)
    if use_filter:
        if regularize is None:
            raise ValueError("regularize ([N] bool) is required when cfg.zero_var_filter and KL or entropy is on")
        if not isinstance(regularize, torch.Tensor) or regularize.shape != (n_rollouts,):
            raise ValueError(f"regularize must be a torch.Tensor of shape ({n_rollouts},), got {_describe(regularize)}")
    if not torch.all((mask == 0) | (mask == 1)):
        raise ValueError("mask must contain only 0 and 1")

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
    adv = advantages.detach().to(dtype)[:, None]
    ratio = torch.exp(logp_new - logp_old)
    pg_unclipped = -adv * ratio
    pg_clipped = -adv * torch.clamp(ratio, 1.0 - cfg.clip_low, 1.0 + cfg.clip_high)
    pg_tok = torch.maximum(pg_unclipped, pg_clipped)
    sampler_stats = (math.nan, math.nan, math.nan)
    if logp_sampler is not None:
        logp_sampler = torch.where(keep, logp_sampler.detach().to(dtype), logp_old)
        log_w = logp_old - logp_sampler
        tis_w = torch.exp(log_w.clamp(max=_K3_LOG_RATIO_CLAMP))
        capped = tis_w > cfg.tis_cap
        if cfg.tis_cap > 0:
            pg_tok = pg_tok * tis_w.clamp(max=cfg.tis_cap)
        with torch.no_grad():
            n_keep = max(float(m.sum().item()), 1.0)
            sampler_stats = (
                float((log_w.abs() * m).sum().item() / n_keep),
                float((k3_kl(logp_sampler, logp_old) * m).sum().item() / n_keep),
                float((capped.to(dtype) * m).sum().item() / n_keep) if cfg.tis_cap > 0 else math.nan,
            )

    reg_weight = m
    if use_filter:
        reg_weight = m * regularize.to(dtype)[:, None]
    total_tok = pg_tok
    kl_tok = None
    if logp_ref is not None:
        kl_tok = k3_kl(logp_new, logp_ref)
        if cfg.kl_coef > 0:
            total_tok = total_tok + cfg.kl_coef * kl_tok * reg_weight
    if entropy is not None and cfg.entropy_coef > 0:
        total_tok = total_tok - cfg.entropy_coef * entropy * reg_weight

    if normalizers is None:
        normalizers = loss_normalizers(m)
    weights = _aggregation_weights(m, cfg, normalizers)  # [N, T], zero on masked-out tokens
    per_rollout = (total_tok * weights).sum(dim=1)
    loss = per_rollout.sum()

    n_tokens = int(m.sum().item())
    with torch.no_grad():
        policy_loss = float((pg_tok * weights).sum().item())
        denom = max(n_tokens, 1)
        clip_frac = float(((pg_clipped > pg_unclipped).to(dtype) * m).sum().item() / denom)
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


def _aggregation_weights(m: torch.Tensor, cfg: LossConfig, norm: LossNormalizers) -> torch.Tensor:
    """Per-token weights w so that the aggregated loss is ``sum(w * l)`` (science §3)."""
    tokens_per_seq = m.sum(dim=1, keepdim=True)
    n_seq = norm.n_seqs
    if cfg.agg_mode == "token-mean":
        return m / max(norm.n_tokens, 1.0)
    if cfg.agg_mode == "seq-mean-token-mean":
        return m / tokens_per_seq.clamp(min=1.0) / max(n_seq, 1.0)
    if cfg.agg_mode == "seq-mean-token-sum":
        return m / max(n_seq, 1.0)
    # seq-mean-token-sum-norm; max_new_tokens checked in LossConfig
    return m / (max(n_seq, 1.0) * float(cfg.max_new_tokens))
