"""Per-rollout gradient Gram matrix from one forward and one backward pass (science §6.1).

``K_ij = <g_i, g_j>`` where ``g_i`` is the gradient of rollout i's own term of
the training loss with respect to the trainable parameters. The rows of a
causal-LM batch do not interact in the forward pass (attention masks keep
each row to itself), so during one backward of ``sum_i loss_i`` the gradient
reaching a layer's output at row i is exactly ``d loss_i / d output_i``.
Per layer the per-rollout gradient is then a sum of outer products over that
row's tokens, and the Gram matrix is built layer by layer from the layer's
input activations and output gradients, never holding all g_i at once.

Covered layer types (anything else that is trainable raises, unless excluded):

* ``nn.Linear`` (weight and bias; peft LoRA adapters are ``nn.Linear`` too):
  ``G_i = sum_t d_it a_it^T``, bias ``sum_t d_it``.
* ``nn.Embedding``: ``G_i = sum_t onehot(token_it) d_it^T`` (no gradient at
  ``padding_idx``). A weight shared by several layers (tied input embedding
  and LM head) gets the SUM of its uses' per-rollout gradients, as autograd
  would; cross terms between the uses are included.
* RMSNorm weights (transformers' ``LlamaRMSNorm``, ``torch.nn.RMSNorm``):
  ``G_i = sum_t d_it * xhat_it`` with ``xhat`` the normalised input.

Per parameter and pair of rollout sets the cheaper of two exact methods is
used (flop count): materialise per-rollout gradients in row slices and take
inner products (``N^2 * numel``), or the token-space trick
``K_ij = sum_{t,s} <a_it, a_js> <d_it, d_js>`` (``(N T)^2 (in + out)``).
Blocks are computed in ``compute_dtype`` (float32 default) and accumulated
across layers and chunks in float64. The hooks live in
:mod:`rollscale.core.noise.hooks`, the block algebra in :mod:`rollscale.core.noise.blocks`.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch
from torch import nn

from rollscale.core.noise.hooks import GramCollector, LossTermsFn, trainable_parameters

__all__ = ["gram_matrix", "naive_gram", "trainable_parameters"]

_DEFAULT_BUDGET_BYTES = 1 << 28  # working memory per block computation


def gram_matrix(
    model: nn.Module,
    loss_terms_fn: LossTermsFn,
    n_rollouts: int,
    chunk_size: int | None = None,
    *,
    exclude: Iterable[str] = (),
    compute_dtype: torch.dtype = torch.float32,
    budget_bytes: int = _DEFAULT_BUDGET_BYTES,
    method: str = "auto",
    grad_targets: str = "auto",
) -> np.ndarray:
    """Gram matrix ``K_ij = <g_i, g_j>`` of per-rollout gradients, hooks + one backward (science §6.1).

    ``loss_terms_fn(idx)`` gets a CPU LongTensor of row indices into the
    caller's batch, runs the forward pass on those rollouts (rows in that
    order as the batch dimension) and returns their per-rollout loss terms,
    shape ``[len(idx)]``. A term must not depend on which other rows are in
    the call: batch-level normalisers (e.g. token-mean's total token count)
    are constants fixed by the caller. ``g_i`` is the gradient of term i with
    respect to every trainable parameter except those named in ``exclude``
    (names as in ``model.named_parameters()``); a trainable parameter of a
    layer type not covered (see module docstring) raises unless excluded.
    Parameter ``.grad`` fields are not touched; the model's train/eval mode
    is left as it is (dropout, if active, is one realisation per call).

    Memory: with ``chunk_size=None`` one forward/backward of all N rollouts
    and, per parameter, its captured input activations and output gradients
    until its block is added (layer by layer during backward). With
    ``chunk_size`` the rollouts go through in chunks (the autograd graph of
    one chunk at a time); cross-chunk blocks need earlier chunks, so for every
    parameter the smaller of its captured factors and its per-rollout
    gradients is kept for all N rollouts (on the model's device).
    ``budget_bytes`` bounds the working memory of each block computation.
    ``method``: ``"auto"`` picks per parameter by flop count; ``"materialize"``
    or ``"tokens"`` force one (the token trick only applies to Linear and
    Embedding weights; biases and norms are always materialised).
    ``grad_targets``: what the single backward is asked for; the hooks see
    every output gradient either way. ``"outputs"`` (the hooked layers'
    outputs) skips the weight-gradient products but holds every output
    gradient until the pass ends; ``"parameters"`` computes the (unused)
    parameter gradients but holds only parameter-sized results; ``"auto"``
    takes whichever holds less (parameters for LoRA).
    Returns a float64 ``[N, N]`` numpy array.

    Cost: one forward and one backward pass plus the Gram work, about
    ``N^2 * numel`` multiply-adds per materialised parameter. With LoRA that
    is a few percent on top of the backward; for full-parameter training on
    short rollouts (N much larger than the tokens per rollout) it dominates
    (``benchmarks/gram.py``).
    """
    if isinstance(n_rollouts, bool) or not isinstance(n_rollouts, int) or n_rollouts < 1:
        raise ValueError(f"n_rollouts: expected a positive int, got {n_rollouts!r}")
    if chunk_size is not None and (
        isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1
    ):
        raise ValueError(f"chunk_size: expected a positive int or None, got {chunk_size!r}")
    if not compute_dtype.is_floating_point:
        raise ValueError(f"compute_dtype: expected a floating dtype, got {compute_dtype}")
    if budget_bytes < 1:
        raise ValueError(f"budget_bytes: expected a positive int, got {budget_bytes!r}")
    if grad_targets not in ("auto", "outputs", "parameters"):
        raise ValueError(
            f"grad_targets: expected 'auto', 'outputs' or 'parameters', got {grad_targets!r}"
        )
    if method not in ("auto", "materialize", "tokens"):
        raise ValueError(f"method: expected 'auto', 'materialize' or 'tokens', got {method!r}")
    step = n_rollouts if chunk_size is None else min(chunk_size, n_rollouts)
    store = step < n_rollouts
    collector = GramCollector(
        model, n_rollouts, exclude, compute_dtype, budget_bytes, store, method, grad_targets
    )
    with collector as col:
        for start in range(0, n_rollouts, step):
            col.run_chunk(loss_terms_fn, slice(start, min(n_rollouts, start + step)))
        return col.K.cpu().numpy()


def naive_gram(
    model: nn.Module,
    loss_terms_fn: LossTermsFn,
    n_rollouts: int,
    *,
    exclude: Iterable[str] = (),
) -> np.ndarray:
    """Reference Gram: one forward and ``autograd.grad`` per rollout, flattened (science §6.1).

    Same contract as :func:`gram_matrix`; holds all N flattened gradients
    (float32, ``N * numel``) and takes their inner products in float64.
    """
    if isinstance(n_rollouts, bool) or not isinstance(n_rollouts, int) or n_rollouts < 1:
        raise ValueError(f"n_rollouts: expected a positive int, got {n_rollouts!r}")
    params = [p for _, p in trainable_parameters(model, exclude)]
    if not params:
        raise ValueError("model: has no trainable parameters (after exclude)")
    flat = []
    for i in range(n_rollouts):
        with torch.enable_grad():
            terms = loss_terms_fn(torch.tensor([i]))
            if not isinstance(terms, torch.Tensor) or terms.shape != (1,):
                raise ValueError("loss_terms_fn: expected a tensor of shape (1,) for one rollout")
            grads = torch.autograd.grad(terms.sum(), params, allow_unused=True)
        flat.append(
            torch.cat(
                [(torch.zeros_like(p) if g is None else g).reshape(-1).float() for g, p in zip(grads, params)]
            )
        )
    gmat = torch.stack(flat)
    k = torch.zeros(n_rollouts, n_rollouts, dtype=torch.float64, device=gmat.device)
    cols = max(1, (1 << 24) // n_rollouts)  # float64 copies in column slices
    for s in range(0, gmat.shape[1], cols):
        part = gmat[:, s : s + cols].double()
        k += part @ part.T
    return k.cpu().numpy()
