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
across layers and chunks in float64.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from rollscale.core.gram_blocks import (
    gram_block,
    compact,
    Contrib,
    Dense,
    materialize,
    n_rows,
    Outer,
    Rows,
    use_token_trick,
)

__all__ = ["gram_matrix", "naive_gram", "trainable_parameters"]

LossTermsFn = Callable[[torch.Tensor], torch.Tensor]

_DEFAULT_BUDGET_BYTES = 1 << 28  # working memory per block computation


# ---------------------------------------------------------------------------
# which modules are covered


def _is_plain(module: nn.Module, base: type) -> bool:
    # a subclass that overrides forward computes something else
    return isinstance(module, base) and type(module).forward is base.forward


def _llama_rmsnorm_types() -> tuple[type, ...]:
    try:
        from transformers.models.llama.modeling_llama import LlamaRMSNorm
    except ImportError:  # pragma: no cover - transformers is a dependency
        return ()
    return (LlamaRMSNorm,)


def _module_kind(module: nn.Module) -> tuple[str, tuple[str, ...]] | None:
    """(kind, covered parameter names) for a supported module, else None."""
    if _is_plain(module, nn.Linear):
        return "linear", ("weight", "bias")
    if _is_plain(module, nn.Embedding):
        if module.max_norm is not None or module.scale_grad_by_freq:
            return None  # renormalised weights / batch-dependent scaling: not per-rollout
        return "embedding", ("weight",)
    if isinstance(module, _llama_rmsnorm_types()):
        return "llama_rmsnorm", ("weight",)
    if _is_plain(module, nn.RMSNorm) and module.weight is not None and len(module.normalized_shape) == 1:
        return "torch_rmsnorm", ("weight",)
    return None


def trainable_parameters(
    model: nn.Module, exclude: Iterable[str] = ()
) -> list[tuple[str, nn.Parameter]]:
    """(name, parameter) of every trainable parameter, shared ones once, minus ``exclude``.

    ``exclude`` holds names as ``model.named_parameters()`` gives them; an
    unknown name raises.
    """
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    excl = set(exclude)
    unknown = excl - {n for n, _ in named}
    if unknown:
        raise ValueError(f"exclude: not names of trainable parameters: {sorted(unknown)}")
    return [(n, p) for n, p in named if n not in excl]


# ---------------------------------------------------------------------------
# the hook machinery


@dataclass
class _Pending:
    expected: int = 0
    arrived: int = 0
    contribs: list[Contrib] = field(default_factory=list)


class _GramCollector:
    def __init__(
        self,
        model: nn.Module,
        n_rollouts: int,
        exclude: Iterable[str],
        compute_dtype: torch.dtype,
        budget_bytes: int,
        store: bool,
        method: str,
        grad_targets: str,
    ) -> None:
        params = trainable_parameters(model, exclude)
        if not params:
            raise ValueError("model: has no trainable parameters (after exclude)")
        wanted = {id(p): n for n, p in params}
        self.shapes: dict[int, tuple[int, int]] = {}
        self.targets: list[tuple[nn.Module, str, list[tuple[int, str]]]] = []
        covered: set[int] = set()
        for _, module in model.named_modules():
            kind = _module_kind(module)
            if kind is None:
                continue
            entries = []
            for attr in kind[1]:
                p = getattr(module, attr, None)
                if isinstance(p, nn.Parameter) and id(p) in wanted:
                    entries.append((id(p), attr))
                    covered.add(id(p))
                    self.shapes[id(p)] = (p.shape[0], p[0].numel()) if p.dim() > 1 else (p.numel(), 1)
            if entries:
                self.targets.append((module, kind[0], entries))
        missing = [n for pid, n in wanted.items() if pid not in covered]
        if missing:
            raise ValueError(
                "model: trainable parameters outside the covered layer types (nn.Linear, "
                "nn.Embedding, LlamaRMSNorm, nn.RMSNorm); pass them in exclude to leave them "
                f"out of g_i: {missing}"
            )
        checkpointing = getattr(model, "is_activation_checkpointing", None)
        if checkpointing is None:  # transformers < 5 names it differently
            checkpointing = getattr(model, "is_gradient_checkpointing", False)
        if checkpointing:
            raise ValueError("model: gradient checkpointing re-runs forward hooks; disable it")
        self.params = [p for _, p in params]
        self.param_size = sum(p.numel() for p in self.params)
        device = params[0][1].device
        self.K = torch.zeros(n_rollouts, n_rollouts, dtype=torch.float64, device=device)
        self.dtype = compute_dtype
        self.budget = max(1, budget_bytes // torch.tensor([], dtype=compute_dtype).element_size())
        self.store = store
        self.method = method
        self.grad_targets = grad_targets
        self.stored: dict[int, list[tuple[slice, list[Contrib]]]] = {}
        self.rows = slice(0, 0)
        self.pending: dict[int, _Pending] = {}
        self.outputs: list[torch.Tensor] = []
        self.handles: list[torch.utils.hooks.RemovableHandle] = []

    def __enter__(self) -> _GramCollector:
        for module, kind, entries in self.targets:
            hook = functools.partial(self._forward_hook, kind=kind, entries=entries)
            self.handles.append(module.register_forward_hook(hook, with_kwargs=True))
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()

    # forward: note each use of a parameter and hook the output's gradient
    def _forward_hook(
        self, module: nn.Module, args: tuple, kwargs: dict, output: object, *, kind: str, entries: list
    ) -> None:
        if not (torch.is_grad_enabled() and isinstance(output, torch.Tensor) and output.requires_grad):
            return
        # the one tensor input of the covered modules, passed by position or by name
        x = args[0] if args else next(v for v in kwargs.values() if isinstance(v, torch.Tensor))
        n = self.rows.stop - self.rows.start
        if x.shape[0] != n or output.shape[0] != n:
            raise ValueError(
                f"loss_terms_fn: a {type(module).__name__} saw leading dimension {x.shape[0]}, "
                f"expected the {n} rollouts of the call (rows must stay the batch dimension)"
            )
        for pid, _ in entries:
            self.pending.setdefault(pid, _Pending()).expected += 1
        saved = x.detach()
        output.register_hook(
            functools.partial(self._grad_hook, module=module, kind=kind, entries=entries, saved=saved)
        )
        self.outputs.append(output)

    # backward: the output gradient of one use has arrived
    def _grad_hook(
        self, grad: torch.Tensor, *, module: nn.Module, kind: str, entries: list, saved: torch.Tensor
    ) -> None:
        with torch.no_grad():
            contribs = self._contribs(module, kind, saved, grad)
            for pid, attr in entries:
                pend = self.pending[pid]
                pend.contribs.append(contribs[attr])
                pend.arrived += 1
                if pend.arrived == pend.expected:
                    self._finish(pid)

    def _contribs(
        self, module: nn.Module, kind: str, x: torch.Tensor, grad: torch.Tensor
    ) -> dict[str, Contrib]:
        n = grad.shape[0]
        d = grad.reshape(n, -1, grad.shape[-1]).to(self.dtype)
        if kind == "linear":
            a = x.reshape(n, -1, x.shape[-1]).to(self.dtype)
            return {"weight": Outer(d, a), "bias": Dense(d.sum(dim=1))}
        if kind == "embedding":
            idx = x.reshape(n, -1)
            if module.padding_idx is not None:  # autograd leaves that row's gradient at 0
                idx = idx.masked_fill(idx == module.padding_idx, -1)
            return {"weight": Rows(idx, d)}
        xf = x.float()
        if kind == "llama_rmsnorm":
            eps = module.variance_epsilon
            xhat = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
        else:  # torch_rmsnorm
            eps = module.eps if module.eps is not None else torch.finfo(x.dtype).eps
            xhat = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        xhat = xhat.reshape(n, -1, xhat.shape[-1]).to(self.dtype)
        return {"weight": Dense((d * xhat).sum(dim=1))}

    def _finish(self, pid: int) -> None:
        pend = self.pending.pop(pid)
        if not pend.contribs:
            return
        shape, cur, rows = self.shapes[pid], pend.contribs, self.rows
        if not self.store:
            self.K[rows, rows] += gram_block(cur, cur, shape, True, self.budget, self.method).to(torch.float64)
            return
        cur = compact(cur, shape)  # the form kept for later chunks
        work = cur
        n_cur = n_rows(cur[0])
        if (
            not isinstance(cur[0], Dense)
            and n_cur * shape[0] * shape[1] <= self.budget
            and not use_token_trick(cur, cur, shape, True, self.method)
        ):
            # materialised once here rather than again for every earlier chunk
            work = [Dense(materialize(cur, shape, 0, shape[0]))]
        self.K[rows, rows] += gram_block(work, work, shape, True, self.budget, self.method).to(torch.float64)
        for prev_rows, prev in self.stored.get(pid, []):
            blk = gram_block(work, prev, shape, False, self.budget, self.method).to(torch.float64)
            self.K[rows, prev_rows] += blk
            self.K[prev_rows, rows] += blk.T
        self.stored.setdefault(pid, []).append((rows, cur))

    def run_chunk(self, loss_terms_fn: LossTermsFn, rows: slice) -> None:
        self.rows = rows
        self.pending.clear()
        self.outputs.clear()
        idx = torch.arange(rows.start, rows.stop)
        with torch.enable_grad():
            terms = loss_terms_fn(idx)
            if not isinstance(terms, torch.Tensor) or terms.shape != (len(idx),):
                got = tuple(terms.shape) if isinstance(terms, torch.Tensor) else type(terms).__name__
                raise ValueError(
                    f"loss_terms_fn: expected a tensor of shape ({len(idx)},) of per-rollout "
                    f"loss terms, got {got}"
                )
            if not terms.requires_grad:
                raise ValueError("loss_terms_fn: the loss terms do not require grad")
            if self.outputs:
                # The hooks see each output gradient as autograd computes it; what
                # autograd.grad is asked for only decides what it holds until it
                # returns. Asking for the hooked outputs skips the weight-gradient
                # products; asking for the parameters holds only parameter-sized
                # results (LoRA). Take whichever holds less. .grad is never touched.
                out_size = sum(o.numel() for o in self.outputs)
                use_params = self.grad_targets == "parameters" or (
                    self.grad_targets == "auto" and self.param_size < out_size
                )
                targets = self.params if use_params else list(self.outputs)
                self.outputs.clear()
                torch.autograd.grad(terms.sum(), targets, allow_unused=True)
                del targets
        for pid in list(self.pending):  # uses whose output got no gradient count as 0
            self._finish(pid)
        self.outputs.clear()


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
    collector = _GramCollector(
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
