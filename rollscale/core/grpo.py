"""The GRPO step: group advantages, the clipped policy loss with its
aggregation modes, KL and entropy regularisers, overlong handling, the
learning-rate schedule and the per-token log-probabilities (science §3).

Conventions follow verl's ``core_algos`` (``agg_loss``, ``kl_penalty`` "low_var_kl"
= k3, clip-higher via separate ``clip_ratio_low`` / ``clip_ratio_high``) and TRL's
``GRPOTrainer``; the code here is our own.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from rollscale.core.checks import is_int

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


@dataclass
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
    """

    clip_low: float = 0.2
    clip_high: float = 0.2
    agg_mode: AggMode = "token-mean"
    kl_coef: float = 0.0
    entropy_coef: float = 0.0
    zero_var_filter: bool = False
    max_new_tokens: int | None = None

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
        if self.agg_mode == "seq-mean-token-sum-norm" and self.max_new_tokens is None:
            raise ValueError("agg_mode 'seq-mean-token-sum-norm' needs max_new_tokens (its normaliser)")


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
    """

    loss: torch.Tensor
    per_rollout: torch.Tensor
    policy_loss: float
    kl: float
    entropy: float
    clip_frac: float
    n_tokens: int


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

    A batch with no masked-in token has loss 0 (not NaN).

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

    weights = _aggregation_weights(m, cfg)  # [N, T], zero on masked-out tokens
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
    )


def _aggregation_weights(m: torch.Tensor, cfg: LossConfig) -> torch.Tensor:
    """Per-token weights w so that the aggregated loss is ``sum(w * l)`` (science §3)."""
    tokens_per_seq = m.sum(dim=1, keepdim=True)
    n_seq = float((tokens_per_seq > 0).sum().item())
    if cfg.agg_mode == "token-mean":
        return m / max(float(m.sum().item()), 1.0)
    if cfg.agg_mode == "seq-mean-token-mean":
        return m / tokens_per_seq.clamp(min=1.0) / max(n_seq, 1.0)
    if cfg.agg_mode == "seq-mean-token-sum":
        return m / max(n_seq, 1.0)
    # seq-mean-token-sum-norm; max_new_tokens checked in LossConfig
    return m / (max(n_seq, 1.0) * float(cfg.max_new_tokens))


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


def _accepts_logits_to_keep(model: torch.nn.Module) -> bool:
    target = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft wrappers
    try:
        return "logits_to_keep" in inspect.signature(target.forward).parameters
    except (TypeError, ValueError):
        return False


def token_logprobs_and_entropy(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    completion_mask: torch.Tensor,
    temperature: float = 1.0,
    entropy_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-probs and entropies of the completions, one forward pass (science §3).

    ``input_ids`` is ``[N, P + T_c]``: left-padded prompts of width ``P``
    followed by right-padded completions of width ``T_c = completion_mask.shape[1]``.
    Position ids are passed as ``cumsum(attention_mask) - 1`` so each sequence
    starts at position 0 whatever its left padding; the model then sees what it
    sees unpadded (models with absolute position embeddings need this; for
    rotary ones it changes nothing beyond rounding). Logits are divided by
    ``temperature`` (as verl and TRL do) so the log-probs are those of the
    distribution sampled from. Only the last ``T_c + 1`` logit rows are
    requested (``logits_to_keep``) where the model supports it.

    Args:
        model: a Hugging Face causal LM (or a peft wrapper of one).
        input_ids: [N, L] token ids.
        attention_mask: [N, L] 1 for real tokens.
        completion_mask: [N, T_c] 1 for real completion tokens.
        temperature: sampling temperature (> 0).
        entropy_grad: False computes the entropy without autograd (for logging
            only; saves the memory of the full softmax in the graph).

    Returns:
        ``(logp, entropy)``, each [N, T_c] float32, zero where ``completion_mask`` is 0.
        ``entropy`` is that of the full next-token distribution at each completion position.
    """
    if input_ids.ndim != 2:
        raise ValueError(f"input_ids must be 2-D [N, L], got shape {tuple(input_ids.shape)}")
    if attention_mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask must have shape {tuple(input_ids.shape)}, got {tuple(attention_mask.shape)}")
    if completion_mask.ndim != 2 or completion_mask.shape[0] != input_ids.shape[0]:
        raise ValueError(f"completion_mask must be [N={input_ids.shape[0]}, T_c], got {tuple(completion_mask.shape)}")
    t_c = completion_mask.shape[1]
    if not 1 <= t_c < input_ids.shape[1]:
        raise ValueError(
            f"completion width T_c={t_c} must be in [1, L={input_ids.shape[1]}) (at least one prompt token)"
        )
    if not (math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be > 0, got {temperature!r}")

    position_ids = (attention_mask.long().cumsum(dim=1) - 1).clamp(min=0)
    kwargs = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "use_cache": False,
    }
    if _accepts_logits_to_keep(model):
        kwargs["logits_to_keep"] = t_c + 1
    logits = model(**kwargs).logits
    # Row j predicts token j + 1: the rows before each completion token.
    logits = logits[:, -(t_c + 1) : -1, :].float()
    if temperature != 1.0:
        logits = logits / temperature
    targets = input_ids[:, -t_c:]
    log_norm = torch.logsumexp(logits, dim=-1)
    # gather + logsumexp avoids materialising a second [N, T_c, V] tensor of log-probs
    logp = torch.gather(logits, 2, targets.unsqueeze(-1)).squeeze(-1) - log_norm

    def _entropy() -> torch.Tensor:
        probs = torch.softmax(logits, dim=-1)
        return log_norm - (probs * logits).sum(dim=-1)

    if entropy_grad:
        ent = _entropy()
    else:
        with torch.no_grad():
            ent = _entropy()
    cm = completion_mask.to(logp.dtype)
    return logp * cm, ent * cm
