"""A step's two halves (science §6.4): the step's prompts split in two at random, each half's share of the batch
loss, and the halves' mean gradients' products that the ``steps`` row records (:data:`HALF_COLUMNS`), from which the
noise along the run is read (:mod:`rollscale.core.noise.along`). The update itself: :mod:`rollscale.train.step`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np
import torch

from rollscale.core.noise.along import HALF_COLUMNS  # the steps row's two-halves columns (science §6.4)

if TYPE_CHECKING:
    from rollscale.train.distributed import Ranks

__all__ = ["Halves", "HalvedBatch", "half_columns", "half_products", "half_weights", "split_halves"]


class HalvedBatch(Protocol):
    """What :func:`half_weights` reads of a :class:`rollscale.train.step.TrainBatch` (typed here so that this
    module does not import the step, which imports it)."""

    completion_ids: Sequence[Sequence[int]]
    keep: np.ndarray


@dataclass(frozen=True)
class Halves:
    """A step's prompts split in two at random (science §6.4): ``rows`` is each batch row's half (0 = a,
    1 = b), ``prompts`` the halves' prompt counts."""

    rows: np.ndarray
    prompts: tuple[int, int]


def split_halves(group_sizes: Sequence[int], rng: np.random.Generator) -> Halves | None:
    """A random split of the step's prompts into halves of floor(P / 2) and ceil(P / 2) prompts (science
    §6.4): by prompt, never by rollout, since rollouts of one prompt are correlated (§6.2). None with fewer
    than two prompts (no split)."""
    p = len(group_sizes)
    if p < 2:
        return None
    in_b = np.zeros(p, dtype=np.int8)
    in_b[rng.permutation(p)[p // 2:]] = 1
    return Halves(np.repeat(in_b, np.asarray(group_sizes, dtype=np.int64)), (p // 2, p - p // 2))


def half_weights(batch: HalvedBatch, halves: Halves, agg_mode: str) -> tuple[float, float]:
    """Each half's share of the batch loss's normaliser (science §3): the full-batch gradient is
    ``w_a g_a + w_b g_b`` with ``g_a`` half a's mean gradient in the aggregation's own unit (masked-in
    tokens for ``token-mean``, rollouts with a masked-in token for the ``seq-mean-*`` modes)."""
    tokens = np.array([len(c) for c in batch.completion_ids], dtype=np.float64) * np.asarray(batch.keep, dtype=np.float64)
    unit = tokens if agg_mode == "token-mean" else (tokens > 0).astype(np.float64)
    total = unit.sum()
    if total <= 0:
        return 0.0, 0.0
    return float(unit[halves.rows == 0].sum() / total), float(unit[halves.rows == 1].sum() / total)


def _local(t: torch.Tensor) -> torch.Tensor:
    """A sharded (DTensor) gradient's local shard; a plain tensor as is."""
    return t.to_local() if hasattr(t, "to_local") else t


def half_products(params: Sequence[torch.nn.Parameter], snapshot: Sequence[torch.Tensor | None],
                  weights: tuple[float, float], ranks: Ranks | None = None) -> tuple[float, float]:
    """``<g_a, g_b>`` and ``|g_a - g_b|^2`` of the halves' mean gradients ``g_a = G_a / w_a``, ``G_a`` the
    gradient snapshot taken after half a's passes and ``G_b`` the accumulated gradient minus it; a sharded
    run sums its ranks' shards (the inner products over the whole parameter vector)."""
    wa, wb = weights
    dot = diff2 = 0.0
    for p, a in zip(params, snapshot):
        if p.grad is None and a is None:
            continue
        total = _local(p.grad).detach() if p.grad is not None else torch.zeros_like(_local(a))
        ga = (_local(a) if a is not None else torch.zeros_like(total)) / wa
        gb = (total - ga * wa) / wb
        dot += float(torch.sum(ga * gb, dtype=torch.float64))
        diff2 += float(torch.sum((ga - gb) ** 2, dtype=torch.float64))
    if ranks is not None:
        dot, diff2 = ranks.sum([dot, diff2])
    return dot, diff2


def half_columns(halves: Halves | None, values: tuple[float, float] | None = None) -> dict:
    """The ``steps`` row's :data:`HALF_COLUMNS` (science §6.4): ``<g_a, g_b>``, ``|g_a - g_b|^2`` and each
    half's prompts and rollouts; NaN and 0 where there is no split."""
    if halves is None or values is None:
        return dict(zip(HALF_COLUMNS, (math.nan, math.nan, 0, 0, 0, 0)))
    return dict(zip(HALF_COLUMNS, (*values, *halves.prompts, int(np.sum(halves.rows == 0)),
                                   int(np.sum(halves.rows == 1)))))
