"""Gradient noise of one GRPO step's batch, measured before its update (science §6).

g_i is the gradient of rollout i's own term of the step's loss (advantages
held fixed, the full batch's aggregation normalisers, so a term does not
depend on which rows share a forward call). The Gram matrix of the g_i
(science §6.1) goes through :func:`~rollscale.core.noise.gram.gram_matrix` in
chunks of the step's micro-batch size, so its forward/backward memory is that
of one micro-batch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from contextlib import contextmanager

import numpy as np
import torch

from rollscale.core.noise.gram import gram_matrix
from rollscale.core.noise.estimators import decompose
from rollscale.core.noise.correlation import k_sat, k_sat_null, split_half_rho
from rollscale.core.noise.ema import EmaNoiseScale
from rollscale.core.noise.pooled import prompt_pieces
from rollscale.train.distributed import Ranks, gram_over_ranks
from rollscale.train.step import RefLogprobs, StepSettings, TrainBatch, batch_normalizers, micro_batch, micro_batch_loss


def gram_chunk_size(batch: TrainBatch, micro_batch_tokens: int) -> int:
    """Rollouts per Gram chunk: as many of the batch's widest rows as fit the token budget."""
    prompt, completion = batch.widths()
    return max(1, micro_batch_tokens // (max(prompt) + max(completion)))


@contextmanager
def _no_checkpointing(model: torch.nn.Module):
    """Gradient checkpointing re-runs forward hooks (the Gram's); off for the measurement."""
    on = getattr(model, "is_activation_checkpointing", None)
    if on is None:  # transformers < 5 names it differently
        on = getattr(model, "is_gradient_checkpointing", False)
    if on:
        model.gradient_checkpointing_disable()
    try:
        yield
    finally:
        if on:
            model.gradient_checkpointing_enable()


def batch_gram(
    model: torch.nn.Module, batch: TrainBatch, settings: StepSettings, pad_id: int,
    ref_logprobs: RefLogprobs | None = None, exclude: Sequence[str] = (), ranks: Ranks | None = None,
) -> np.ndarray:
    """Gram matrix ``K_ij = <g_i, g_j>`` of the batch's per-rollout loss terms (science §6.1), over
    the trainable parameters but those named in ``exclude`` (all excluded: zeros). A sharded run
    (``ranks``): each rank the blocks of its share of the parameters, summed over ranks
    (:func:`~rollscale.train.distributed.gram_over_ranks`), the same matrix on every rank."""
    if ranks is not None:
        return gram_over_ranks(model, ranks, lambda mine: batch_gram(model, batch, settings, pad_id, ref_logprobs, mine))
    if set(exclude) >= {name for name, p in model.named_parameters() if p.requires_grad}:
        return np.zeros((len(batch), len(batch)))
    device = next(model.parameters()).device
    norm = batch_normalizers(batch, settings.max_new_tokens)

    def loss_terms(idx: torch.Tensor) -> torch.Tensor:
        # float32 forward (no autocast): the Gram's hooks take the activations as they come
        mb = micro_batch(batch, idx.numpy(), pad_id, device)
        return micro_batch_loss(model, mb, settings, norm, ref_logprobs)[0].per_rollout

    model.train()
    with _no_checkpointing(model):
        return gram_matrix(model, loss_terms, len(batch), exclude=exclude,
                           chunk_size=gram_chunk_size(batch, settings.train.micro_batch_tokens))


def noise_figures(
    gram: np.ndarray, rewards: np.ndarray, ema: EmaNoiseScale, split_rng: Callable[[int], np.random.Generator],
) -> tuple[dict, list[dict]]:
    """Step-level noise figures (science §6.2) and per-group split-half rows (science §6.3).

    ``rewards`` is [groups, n] (equal groups); ``split_rng(g)`` seeds group g's
    random split. Returns ``({}, [])`` when the decomposition is undefined
    (fewer than two groups). Per-group rows hold ``n``, ``pass_rate``,
    ``rho_split``, ``k_sat``, ``k_sat_null``, ``k_sat_ratio`` and the pieces the
    pooled estimates are means of (:func:`~rollscale.core.noise.pooled.prompt_pieces`).
    """
    n_groups, n = rewards.shape
    if n_groups < 2:
        return {}, []
    groups = np.repeat(np.arange(n_groups), n)
    dec = decompose(gram, groups)
    finite = np.isfinite([dec.trace_sigma, dec.g_norm2]).all()
    b_ema = ema.update(dec.trace_sigma, dec.g_norm2) if finite else math.nan
    pieces = prompt_pieces(gram, groups)  # what the report pools over steps before any ratio (science §6.2)
    rows = []
    for gi in range(n_groups):
        block = gram[gi * n : (gi + 1) * n, gi * n : (gi + 1) * n]
        rho = math.nan
        if n >= 3 and np.ptp(rewards[gi]) > 0 and np.trace(block) > 0:
            rho = split_half_rho(block, split_rng(gi))
        null = k_sat_null(n) if n >= 3 else math.nan
        ks = k_sat(rho) if np.isfinite(rho) else math.nan
        rows.append({"n": n, "pass_rate": float(np.mean(rewards[gi])), "rho_split": rho, "k_sat": ks,
                     "k_sat_null": null, "k_sat_ratio": ks / null if np.isfinite(ks) else ks,
                     **{c: float(v[gi]) for c, v in pieces.items()}})
    figures = {
        "noise_n": n, "trace_sigma": dec.trace_sigma, "g_norm2": dec.g_norm2, "b_simple": dec.b_simple,
        "b_simple_ema": b_ema, "b_naive": dec.b_naive, "prompt_noise": dec.prompt_noise,
        "rollout_noise": dec.rollout_noise, "rho_icc": dec.rho_icc, "k_sat_icc": dec.k_sat_icc,
        "k_crit": dec.k_crit, "crs": dec.crs,
    }
    return figures, rows
