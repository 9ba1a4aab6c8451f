"""The memory-bounded GRPO update: micro-batches, gradient accumulation, PPO epochs (science §3).

One optimizer step equals the full-batch step for every aggregation mode: the
batch's normalisers (tokens, sequences) are computed before the loop and every
micro-batch's loss is its exact share of the full-batch loss, so the
accumulated gradient is the full-batch gradient. Rollouts are packed into
micro-batches by a budget of padded tokens, each padded to its own width, so
peak memory depends on the micro-batch, not on B.

``logp_old`` (the policy before this step's updates, science §3): the first
epoch's ``logp_new.detach()``, kept for the later epochs. That is exactly the
no-grad forward of the policy before the first update (no parameter changes
during the first epoch's accumulation), so ``ppo_epochs > 1`` costs no extra
forward pass and ``ppo_epochs = 1`` is TRL's on-policy update. A separate
sampling engine's log-probs (``Rollout.logprobs``) enter as the behaviour
policy of the truncated importance weight (:func:`~rollscale.core.grpo.loss.grpo_loss`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from rollscale.core.grpo.loss import LossOutput, grpo_loss
from rollscale.core.grpo.logprobs import token_logprobs_and_entropy
from rollscale.core.grpo.losses.advantages import nonzero_variance_mask
from rollscale.core.grpo.losses.aggregation import LossNormalizers, loss_normalizers
from rollscale.core.rollouts import Rollout
from rollscale.core.grpo.shaping import overlong_filter_mask, overlong_penalty
from rollscale.registry import ADVANTAGE_ESTIMATORS
from rollscale.train.halves import Halves, half_columns, half_products, half_weights

if TYPE_CHECKING:
    from rollscale.config import TrainParams
    from rollscale.train.distributed import Ranks
    from rollscale.train.run_config import RunConfig

# the loss columns of a ``steps`` row (NaN on a step that trains nothing)
LOSS_COLUMNS = ("loss", "policy_loss", "kl", "entropy", "clip_frac", "grad_norm", "logp_mismatch", "sampler_kl",
                "tis_frac", "zero_var_frac_trained")

RefLogprobs = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class NonFiniteLossError(RuntimeError):
    """The loss or gradient norm of a step was NaN or infinite; the update was not applied."""


@dataclass(frozen=True)
class TrainBatch:
    """The rollouts one step trains on, as token lists (science §3).

    Attributes:
        prompt_ids: per rollout, its prompt's token ids.
        completion_ids: per rollout, the sampled completion's token ids.
        advantages: [N] group advantages.
        regularize: [N] bool, rollouts that get KL / entropy (zero-variance filter).
        keep: [N] bool, rollouts in the loss (False = overlong-filtered).
        sampler_logprobs: per rollout, the sampler's log-probs of its completion
            tokens, or None when the sampler is the training model.
    """

    prompt_ids: Sequence[Sequence[int]]
    completion_ids: Sequence[Sequence[int]]
    advantages: np.ndarray
    regularize: np.ndarray
    keep: np.ndarray
    sampler_logprobs: Sequence[Sequence[float]] | None = None

    def __len__(self) -> int:
        return len(self.completion_ids)

    def widths(self) -> tuple[list[int], list[int]]:
        return [len(p) for p in self.prompt_ids], [max(len(c), 1) for c in self.completion_ids]


@dataclass(frozen=True)
class MicroBatch:
    """Padded tensors of some rows of a :class:`TrainBatch` (left-padded prompt, right-padded completion)."""

    rows: np.ndarray
    input_ids: torch.Tensor
    attention: torch.Tensor
    completion_mask: torch.Tensor
    loss_mask: torch.Tensor
    advantages: torch.Tensor
    regularize: torch.Tensor
    sampler_logp: torch.Tensor | None


def _per_group(fn: Callable[[np.ndarray], np.ndarray], rewards: list[np.ndarray]) -> np.ndarray:
    """``fn`` of the [groups, n] rewards, flattened; groups of different sizes (rules that
    allocate per prompt) one at a time."""
    if len({len(r) for r in rewards}) == 1:
        return fn(np.stack(rewards)).reshape(-1)
    return np.concatenate([fn(r) for r in rewards])


def train_batch(
    groups: Sequence[Sequence[Rollout]], prompt_ids: Sequence[Sequence[int]], cfg: RunConfig
) -> tuple[list[np.ndarray], TrainBatch]:
    """Shaped rewards (one array per group) and the :class:`TrainBatch` of the trained groups
    (science §3): the DAPO overlong penalty when on, advantages (``train.advantage_scale``'s
    estimator), the zero-variance flags and the overlong filter."""
    t = cfg.train
    rewards = [np.array([r.reward for r in g], dtype=np.float64) for g in groups]
    if t.overlong_penalty_cache:
        rewards = [r + overlong_penalty(np.array([x.n_tokens for x in g]), cfg.sampling.max_new_tokens,
                                        t.overlong_penalty_cache) for r, g in zip(rewards, groups)]
    rollouts = [r for g in groups for r in g]
    keep = np.ones(len(rollouts), dtype=bool)
    if t.overlong_filter:
        keep = overlong_filter_mask([r.truncated for r in rollouts])
    logprobs = [r.logprobs for r in rollouts]
    return rewards, TrainBatch(
        prompt_ids=[p for p, g in zip(prompt_ids, groups) for _ in g],
        completion_ids=[r.token_ids for r in rollouts],
        advantages=_per_group(ADVANTAGE_ESTIMATORS.get(t.advantage_scale), rewards),
        regularize=_per_group(nonzero_variance_mask, rewards),
        keep=keep,
        sampler_logprobs=None if any(lp is None for lp in logprobs) else logprobs,
    )


def pack_micro_batches(prompt_lens: Sequence[int], completion_lens: Sequence[int], micro_batch_tokens: int) -> list[np.ndarray]:
    """Consecutive rows packed so each micro-batch's padded size
    ``rows * (max prompt + max completion width)`` stays within ``micro_batch_tokens``
    (a row longer than the budget gets a micro-batch of its own)."""
    if micro_batch_tokens < 1:
        raise ValueError(f"micro_batch_tokens must be >= 1, got {micro_batch_tokens!r}")
    batches: list[list[int]] = []
    cur: list[int] = []
    wp = wc = 0
    for i, (p, c) in enumerate(zip(prompt_lens, completion_lens)):
        np_, nc = max(wp, p), max(wc, c)
        if cur and (len(cur) + 1) * (np_ + nc) > micro_batch_tokens:
            batches.append(cur)
            cur, np_, nc = [], p, c
        cur.append(i)
        wp, wc = np_, nc
    if cur:
        batches.append(cur)
    return [np.asarray(b, dtype=np.int64) for b in batches]


def micro_batch(batch: TrainBatch, rows: np.ndarray, pad_id: int, device: torch.device) -> MicroBatch:
    """The padded tensors of ``rows`` (see :func:`~rollscale.core.grpo.logprobs.token_logprobs_and_entropy`)."""
    prompts = [batch.prompt_ids[i] for i in rows]
    comps = [batch.completion_ids[i] for i in rows]
    width_p = max(map(len, prompts))
    width_c = max(max(map(len, comps)), 1)
    n = len(rows)
    input_ids = torch.full((n, width_p + width_c), pad_id, dtype=torch.long)
    attention = torch.zeros((n, width_p + width_c), dtype=torch.long)
    completion_mask = torch.zeros((n, width_c), dtype=torch.long)
    sampler = None if batch.sampler_logprobs is None else torch.zeros((n, width_c), dtype=torch.float32)
    for row, (p, c) in enumerate(zip(prompts, comps)):
        input_ids[row, width_p - len(p) : width_p] = torch.as_tensor(p)
        attention[row, width_p - len(p) : width_p + len(c)] = 1
        if len(c):
            input_ids[row, width_p : width_p + len(c)] = torch.as_tensor(c)
        completion_mask[row, : len(c)] = 1
        if sampler is not None:
            lp = batch.sampler_logprobs[rows[row]]
            if len(lp) != len(c):
                raise ValueError(f"rollout {int(rows[row])}: sampler gave {len(lp)} log-probs for {len(c)} tokens")
            sampler[row, : len(c)] = torch.as_tensor(lp, dtype=torch.float32)
    keep = torch.as_tensor(batch.keep[rows])
    return MicroBatch(
        rows=rows,
        input_ids=input_ids.to(device),
        attention=attention.to(device),
        completion_mask=completion_mask.to(device),
        loss_mask=(completion_mask * keep[:, None]).to(device),
        advantages=torch.as_tensor(batch.advantages[rows], dtype=torch.float32, device=device),
        regularize=torch.as_tensor(batch.regularize[rows], device=device),
        sampler_logp=None if sampler is None else sampler.to(device),
    )


def batch_normalizers(batch: TrainBatch, max_new_tokens: int | None) -> LossNormalizers:
    """The whole batch's aggregation denominators (science §3), so that micro-batch losses
    add up to the full-batch loss."""
    lens = torch.as_tensor([len(c) for c in batch.completion_ids], dtype=torch.float32)
    width = int(max(lens.max().item(), 1))
    mask = (torch.arange(width)[None, :] < lens[:, None]).float()
    return loss_normalizers(mask * torch.as_tensor(batch.keep, dtype=torch.float32)[:, None], max_new_tokens)


@dataclass(frozen=True)
class StepSettings:
    """How the update runs (science §3).

    Attributes:
        train: the run's ``TrainParams``: the loss (its registered pieces and coefficients),
            micro-batch budget, PPO epochs, gradient clipping, bf16 autocast.
        temperature: the sampling temperature the log-probs are taken at.
        max_new_tokens: the generation budget (the ``seq-mean-token-sum-norm`` normaliser).
    """

    train: TrainParams
    temperature: float
    max_new_tokens: int | None = None

    @classmethod
    def of_run(cls, config: RunConfig) -> StepSettings:
        """The update's settings (:func:`policy_update`) of a run."""
        return cls(train=config.train, temperature=config.sampling.temperature,
                   max_new_tokens=config.sampling.max_new_tokens)


def _autocast(device: torch.device, on: bool):
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16) if on else nullcontext()


def micro_batch_loss(
    model: torch.nn.Module, mb: MicroBatch, settings: StepSettings, norm: LossNormalizers,
    ref_logprobs: RefLogprobs | None = None, logp_old: torch.Tensor | None = None,
    logp_ref: torch.Tensor | None = None, autocast: bool = False,
) -> tuple[LossOutput, torch.Tensor, torch.Tensor | None]:
    """The loss of one micro-batch, as its exact share of the full batch's (``norm``; science §3).

    One forward pass (under bf16 autocast when asked), the KL reference's log-probs when
    ``logp_ref`` is not given (from ``ref_logprobs``, when the KL term is on), then
    :func:`~rollscale.core.grpo.loss.grpo_loss`; ``logp_old`` None is on-policy (this forward's
    log-probs, detached). Returns the loss, the log-probs and the reference's log-probs.
    """
    with _autocast(mb.input_ids.device, autocast):
        logp, entropy = token_logprobs_and_entropy(
            model, mb.input_ids, mb.attention, mb.completion_mask, settings.temperature,
            entropy_grad=settings.train.entropy_coef > 0,
        )
    if logp_ref is None and ref_logprobs is not None and settings.train.kl_coef > 0:
        logp_ref = ref_logprobs(mb.input_ids, mb.attention, mb.completion_mask)
    out = grpo_loss(logp, logp.detach() if logp_old is None else logp_old, mb.advantages, mb.loss_mask,
                    settings.train, logp_ref=logp_ref, entropy=entropy, regularize=mb.regularize,
                    normalizers=norm, logp_sampler=mb.sampler_logp)
    return out, logp, logp_ref


def _weighted(stats: list[tuple[float, int]]) -> float:
    pairs = [(v, n) for v, n in stats if n and math.isfinite(v)]
    total = sum(n for _, n in pairs)
    return sum(v * n for v, n in pairs) / total if total else math.nan


def _norm_value(norm: torch.Tensor) -> float:
    """A total gradient norm as a float (a sharded run's DTensor is gathered first)."""
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)


def _all_ranks(ranks: Ranks | None, sums: list[float], weighted: list[list[tuple[float, int]]]
               ) -> tuple[list[float], list[list[tuple[float, int]]]]:
    """``sums`` summed and each token-weighted mean of ``weighted`` taken over every rank's
    tokens (one all-reduce); unchanged in one process."""
    if ranks is None:
        return sums, weighted
    flat = list(sums)
    for stats in weighted:
        pairs = [(v, n) for v, n in stats if n and math.isfinite(v)]
        flat += [sum(v * n for v, n in pairs), sum(n for _, n in pairs)]
    total = ranks.sum(flat)
    k = len(sums)
    return total[:k], [[(total[k + 2 * i] / total[k + 2 * i + 1], total[k + 2 * i + 1])] if total[k + 2 * i + 1]
                       else [] for i in range(len(weighted))]


def policy_update(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    params: Sequence[torch.nn.Parameter],
    batch: TrainBatch,
    settings: StepSettings,
    pad_id: int,
    ref_logprobs: RefLogprobs | None = None,
    rows: np.ndarray | None = None,
    ranks: Ranks | None = None,
    halves: Halves | None = None,
) -> dict:
    """``ppo_epochs`` optimizer steps on ``batch``, each accumulated over micro-batches (science §3).

    ``ref_logprobs(input_ids, attention, completion_mask)`` gives the KL
    reference's log-probs (no grad); it is called once per micro-batch and
    kept for later epochs. Returns the loss columns of the ``steps`` row: the
    loss, KL and entropy of the first epoch (the batch under the pre-update
    policy), ``clip_frac`` over every epoch's tokens (0 in the first epoch by
    construction), ``grad_norm`` of the first optimizer step.

    A sharded run (:mod:`rollscale.train.distributed`): ``batch`` is the whole step's batch on
    every rank and ``rows`` this rank's rows; the normalisers are the whole batch's, every rank
    runs as many micro-batches (the extra ones weigh 0: FSDP's passes are collective), and the
    row's figures are over every rank's tokens, as in one process.

    ``halves`` (science §6.4): the micro-batches of half a's rows run first, the gradient is copied
    after them (one extra buffer; a sharded run its shards), and half b's follow, so the optimizer sees
    the same total gradient; the row gains :data:`~rollscale.core.noise.along.HALF_COLUMNS` from the two halves' mean gradients.

    Raises :class:`NonFiniteLossError` before an optimizer step whose loss or
    gradient norm is not finite (earlier epochs' steps stay applied).
    """
    device = next(model.parameters()).device
    t = settings.train
    norm = batch_normalizers(batch, settings.max_new_tokens)
    mine = np.arange(len(batch)) if rows is None else np.asarray(rows, dtype=np.int64)
    prompt_w, completion_w = batch.widths()
    # half a's rows, then half b's, each packed on its own (one part without halves)
    parts = [mine] if halves is None else [mine[halves.rows[mine] == h] for h in (0, 1)]
    micro: list[np.ndarray] = []
    real: list[bool] = []
    for part in parts:
        packed = [part[m] for m in pack_micro_batches([prompt_w[i] for i in part], [completion_w[i] for i in part],
                                                      t.micro_batch_tokens)] if len(part) else []
        # padding passes on row 0 with weight 0, so every rank runs as many (and ends half a at the same pass)
        n_pad = 0 if ranks is None else ranks.max(len(packed)) - len(packed)
        micro += packed + [np.zeros(1, dtype=np.int64)] * n_pad
        real += [True] * len(packed) + [False] * n_pad
        if halves is not None and part is parts[0]:
            snap_after = len(micro) - 1  # the last pass of half a
    n_real = sum(real)
    snapshot: list[torch.Tensor | None] = []
    halves_out = half_columns(None) if halves is not None else {}
    scale = 1.0 if ranks is None else ranks.loss_scale
    logp_old: list[torch.Tensor] = []
    logp_ref: list[torch.Tensor | None] = []
    clip: list[tuple[float, int]] = []
    first: dict = {}
    model.train()
    for epoch in range(t.ppo_epochs):
        optimizer.zero_grad(set_to_none=True)
        loss_sum = policy_sum = 0.0
        kl, ent, mismatch, skl, tis = [], [], [], [], []
        for i, mb_rows in enumerate(micro):
            mb = micro_batch(batch, mb_rows, pad_id, device)
            if epoch == 0:  # on-policy; its log-probs and the reference's are kept for later epochs
                out, logp, ref = micro_batch_loss(model, mb, settings, norm, ref_logprobs, autocast=t.autocast_bf16)
                logp_old.append(logp.detach())
                logp_ref.append(ref)
            else:
                out, _, _ = micro_batch_loss(model, mb, settings, norm, logp_old=logp_old[i], logp_ref=logp_ref[i],
                                             autocast=t.autocast_bf16)
            weight = scale if real[i] else 0.0
            (out.loss if weight == 1.0 else out.loss * weight).backward()
            if halves is not None and epoch == 0 and i == snap_after:
                snapshot = [None if p.grad is None else p.grad.detach().clone() for p in params]
            if not real[i]:
                continue
            loss_sum += float(out.loss.detach())
            policy_sum += out.policy_loss
            clip.append((out.clip_frac, out.n_tokens))
            for acc, value in ((kl, out.kl), (ent, out.entropy), (mismatch, out.logp_mismatch),
                               (skl, out.sampler_kl), (tis, out.tis_frac)):
                acc.append((value, out.n_tokens))
        (loss_sum, policy_sum), (kl, ent, mismatch, skl, tis) = _all_ranks(
            ranks, [loss_sum, policy_sum], [kl, ent, mismatch, skl, tis])
        if halves is not None and epoch == 0:  # before clipping: the halves' gradients as the loss gives them
            weights = half_weights(batch, halves, t.agg_mode)
            if min(weights) > 0:
                halves_out = half_columns(halves, half_products(params, snapshot, weights, ranks))
            snapshot = []
        max_norm = t.grad_clip if t.grad_clip > 0 else math.inf
        grad_norm = _norm_value(torch.nn.utils.clip_grad_norm_(list(params), max_norm))
        if not (math.isfinite(loss_sum) and math.isfinite(grad_norm)):
            optimizer.zero_grad(set_to_none=True)
            raise NonFiniteLossError(
                f"non-finite loss or gradient norm (loss={loss_sum}, grad_norm={grad_norm}, "
                f"epoch {epoch + 1} of {t.ppo_epochs}); the update was not applied"
            )
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if epoch == 0:
            first = {
                "loss": loss_sum, "policy_loss": policy_sum, "kl": _weighted(kl), "entropy": _weighted(ent),
                "grad_norm": grad_norm, "n_tokens": int(norm.n_tokens), "logp_mismatch": _weighted(mismatch),
                "sampler_kl": _weighted(skl), "tis_frac": _weighted(tis),
            }
    [n_micro], [clip] = _all_ranks(ranks, [n_real], [clip])
    return {**first, "clip_frac": _weighted(clip), "micro_batches": int(n_micro), **halves_out}
