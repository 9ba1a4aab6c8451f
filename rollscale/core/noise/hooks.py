"""The hooks that build the per-rollout gradient Gram matrix during one backward (science §6.1).

Which layers are covered (``nn.Linear``, ``nn.Embedding``, RMSNorm weights; see
:mod:`rollscale.core.noise.gram`) and :class:`GramCollector`: a forward hook on each
covered layer saves its input and hooks its output's gradient; when every use
of a parameter has its output gradient, the parameter's per-rollout
contributions become a Gram block (:mod:`rollscale.core.noise.blocks`) added to
``K``, for the rows of this chunk and against the stored earlier chunks.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
from torch import nn

from rollscale.core.noise.blocks import (
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

LossTermsFn = Callable[[torch.Tensor], torch.Tensor]


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


class GramCollector:
    """``K`` of one :func:`~rollscale.core.noise.gram.gram_matrix` call, built chunk by chunk
    (:meth:`run_chunk`); a context manager that hooks the covered layers and unhooks them."""

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

    def __enter__(self) -> GramCollector:
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
