"""Loss aggregations (science §3): how per-token losses become one scalar.

Each is registered in :data:`rollscale.registry.LOSS_AGGREGATIONS` under a value of
``sweep.train.agg_mode`` and maps the ``[N, T]`` 0/1 mask and the batch's
:class:`LossNormalizers` to per-token weights ``w`` with loss ``= sum(w * l)``. With
``N'`` the rollouts that have at least one masked-in token (verl's convention: fully
masked rows, e.g. overlong-filtered rollouts, do not count as sequences):

- ``token-mean``: ``sum_it m l / sum_it m``;
- ``seq-mean-token-mean``: ``(1/N') sum_i (sum_t m l / sum_t m)``;
- ``seq-mean-token-sum``: ``(1/N') sum_i sum_t m l``;
- ``seq-mean-token-sum-norm``: ``(1/(N' * max_new_tokens)) sum_it m l`` (Dr.GRPO).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rollscale.core.checks import is_int
from rollscale.registry import LOSS_AGGREGATIONS

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class LossNormalizers:
    """The batch-level denominators of the aggregation modes (science §3).

    Computed once over the whole batch before a micro-batch loop, so that the
    sum of the micro-batches' losses is the full-batch loss in every mode.

    Attributes:
        n_tokens: masked-in tokens of the batch (``token-mean``).
        n_seqs: rollouts with at least one masked-in token (the ``seq-mean-*`` modes).
        max_new_tokens: the generation budget, the constant of ``seq-mean-token-sum-norm``.
    """

    n_tokens: float
    n_seqs: float
    max_new_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.max_new_tokens is not None and (not is_int(self.max_new_tokens) or self.max_new_tokens < 1):
            raise ValueError(f"max_new_tokens must be a positive int or None, got {self.max_new_tokens!r}")


def loss_normalizers(mask: torch.Tensor, max_new_tokens: int | None = None) -> LossNormalizers:
    """:class:`LossNormalizers` of a ``[N, T]`` 0/1 loss mask."""
    per_seq = mask.sum(dim=1)
    return LossNormalizers(n_tokens=float(per_seq.sum().item()), n_seqs=float((per_seq > 0).sum().item()),
                           max_new_tokens=max_new_tokens)


@LOSS_AGGREGATIONS.register("token-mean")
def token_mean(m: torch.Tensor, norm: LossNormalizers) -> torch.Tensor:
    return m / max(norm.n_tokens, 1.0)


@LOSS_AGGREGATIONS.register("seq-mean-token-mean")
def seq_mean_token_mean(m: torch.Tensor, norm: LossNormalizers) -> torch.Tensor:
    return m / m.sum(dim=1, keepdim=True).clamp(min=1.0) / max(norm.n_seqs, 1.0)


@LOSS_AGGREGATIONS.register("seq-mean-token-sum")
def seq_mean_token_sum(m: torch.Tensor, norm: LossNormalizers) -> torch.Tensor:
    return m / max(norm.n_seqs, 1.0)


@LOSS_AGGREGATIONS.register("seq-mean-token-sum-norm")
def seq_mean_token_sum_norm(m: torch.Tensor, norm: LossNormalizers) -> torch.Tensor:
    if norm.max_new_tokens is None:
        raise ValueError("agg_mode 'seq-mean-token-sum-norm' needs max_new_tokens (its normaliser)")
    return m / (max(norm.n_seqs, 1.0) * float(norm.max_new_tokens))
