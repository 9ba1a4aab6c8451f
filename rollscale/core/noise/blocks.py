"""Per-rollout gradient contributions and their Gram blocks (science §6.1).

The algebra behind :func:`rollscale.core.noise.gram.gram_matrix`: a parameter use's
per-rollout gradients held as factors (outer products of a layer's output
gradients and inputs, embedding rows) or materialised, and ``<G_i, G_j>``
between two row sets by the cheaper of two exact methods: materialise
per-rollout gradients in row slices (``N^2 * numel``) or the token-space trick
``K_ij = sum_{t,s} <a_it, a_js> <d_it, d_js>`` (``(N T)^2 (in + out)``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Outer:
    """``G_i = sum_t u_it v_it^T``; u: [N, T, a], v: [N, T, b] (Linear weight)."""

    u: torch.Tensor
    v: torch.Tensor


@dataclass
class Rows:
    """``G_i = sum_t onehot(idx_it) v_it^T``; idx: [N, T] (-1 = no row), v: [N, T, b]."""

    idx: torch.Tensor
    v: torch.Tensor


@dataclass
class Dense:
    """Materialised per-rollout gradients, g: [N, numel]."""

    g: torch.Tensor


Contrib = Outer | Rows | Dense


def n_rows(c: Contrib) -> int:
    return c.g.shape[0] if isinstance(c, Dense) else c.v.shape[0]


def _tokens(c: Outer | Rows) -> int:
    return c.v.shape[1]


def _size(c: Contrib) -> int:
    if isinstance(c, Dense):
        return c.g.numel()
    if isinstance(c, Outer):
        return c.u.numel() + c.v.numel()
    return c.idx.numel() + c.v.numel()


def materialize(contribs: list[Contrib], shape: tuple[int, int], lo: int, hi: int) -> torch.Tensor:
    """Per-rollout gradients of parameter rows lo:hi, [N, (hi - lo) * b]."""
    a, b = shape
    n = n_rows(contribs[0])
    if len(contribs) == 1 and isinstance(contribs[0], Dense):  # no copy needed
        return contribs[0].g.view(n, a, b)[:, lo:hi].reshape(n, -1)
    out: torch.Tensor | None = None
    for c in contribs:
        if isinstance(c, Dense):
            part = c.g.view(n, a, b)[:, lo:hi]
            out = part.clone() if out is None else out.add_(part)
        elif isinstance(c, Outer):
            ut = c.u[:, :, lo:hi].transpose(1, 2)
            out = torch.bmm(ut, c.v) if out is None else out.baddbmm_(ut, c.v)
        else:
            if out is None:
                out = torch.zeros(n, hi - lo, b, dtype=c.v.dtype, device=c.v.device)
            sel = (c.idx >= lo) & (c.idx < hi)
            rows = torch.arange(n, device=c.idx.device)[:, None].expand_as(c.idx)[sel]
            flat = rows * (hi - lo) + (c.idx[sel] - lo)
            out.view(n * (hi - lo), b).index_add_(0, flat, c.v[sel])
    assert out is not None
    return out.reshape(n, -1)


def _u_gram(p: Outer | Rows, q: Outer | Rows) -> torch.Tensor:
    """Token-space Gram of the row factors, [Np * Tp, Nq * Tq]."""
    if isinstance(p, Outer) and isinstance(q, Outer):
        return p.u.reshape(-1, p.u.shape[-1]) @ q.u.reshape(-1, q.u.shape[-1]).T
    if isinstance(p, Rows) and isinstance(q, Rows):
        ip, iq = p.idx.reshape(-1), q.idx.reshape(-1)
        return ((ip[:, None] == iq[None, :]) & (ip >= 0)[:, None]).to(p.v.dtype)
    if isinstance(p, Rows):
        return _u_gram(q, p).T
    # <u_it, onehot(k)> = u_it[k]
    iq = q.idx.reshape(-1)
    g = p.u.reshape(-1, p.u.shape[-1])[:, iq.clamp(min=0)]
    return g * (iq >= 0).to(g.dtype)[None, :]


def _trick(cx: list[Contrib], cy: list[Contrib], budget: int) -> torch.Tensor:
    """``K_ij = sum_{t,s} <u_it, u_js> <v_it, v_js>`` summed over all use pairs."""
    nx, ny = n_rows(cx[0]), n_rows(cy[0])
    out = None
    for p in cx:
        for q in cy:
            tp, tq = _tokens(p), _tokens(q)
            step = max(1, budget // max(1, 3 * tp * ny * tq))  # bound the token Grams
            vq = q.v.reshape(-1, q.v.shape[-1])
            for s in range(0, nx, step):
                e = min(nx, s + step)
                ps = Outer(p.u[s:e], p.v[s:e]) if isinstance(p, Outer) else Rows(p.idx[s:e], p.v[s:e])
                sv = ps.v.reshape(-1, vq.shape[-1]) @ vq.T
                blk = (_u_gram(ps, q) * sv).view(e - s, tp, ny, tq).sum(dim=(1, 3))
                if out is None:
                    out = torch.zeros(nx, ny, dtype=blk.dtype, device=blk.device)
                out[s:e] += blk
    assert out is not None
    return out


def _mat_cost(c: Contrib, numel: int, b: int) -> int:
    if isinstance(c, Outer):
        return n_rows(c) * _tokens(c) * numel
    if isinstance(c, Rows):
        return n_rows(c) * _tokens(c) * b
    return 0


def use_token_trick(
    cx: list[Contrib], cy: list[Contrib], shape: tuple[int, int], same: bool, method: str
) -> bool:
    """Whether the token-space trick is the method for this block (else materialise)."""
    if method == "materialize" or any(isinstance(c, Dense) for c in (*cx, *cy)):
        return False
    if method == "tokens":
        return True
    a, b = shape
    numel = a * b
    nx, ny = n_rows(cx[0]), n_rows(cy[0])
    mat = nx * ny * numel + sum(_mat_cost(c, numel, b) for c in cx)
    if not same:
        mat += sum(_mat_cost(c, numel, b) for c in cy)
    trick = sum(
        nx * _tokens(p) * ny * _tokens(q) * ((a if isinstance(p, Outer) and isinstance(q, Outer) else 1) + b)
        for p in cx
        for q in cy
    )
    return trick < mat


def gram_block(
    cx: list[Contrib],
    cy: list[Contrib],
    shape: tuple[int, int],
    same: bool,
    budget: int,
    method: str = "auto",
) -> torch.Tensor:
    """``<G_i, G_j>`` for i in the rows of cx, j in the rows of cy, by the cheaper method."""
    if use_token_trick(cx, cy, shape, same, method):
        return _trick(cx, cy, budget)
    a, b = shape
    nx, ny = n_rows(cx[0]), n_rows(cy[0])
    rows = max(1, budget // max(1, (nx + ny) * b))
    out = None
    for lo in range(0, a, rows):
        hi = min(a, lo + rows)
        mx = materialize(cx, shape, lo, hi)
        blk = mx @ (mx if same else materialize(cy, shape, lo, hi)).T
        out = blk if out is None else out + blk
    assert out is not None
    return out


def compact(contribs: list[Contrib], shape: tuple[int, int]) -> list[Contrib]:
    """The smaller of the captured factors and the materialised per-rollout gradients."""
    n = n_rows(contribs[0])
    if n * shape[0] * shape[1] <= sum(_size(c) for c in contribs):
        return [Dense(materialize(contribs, shape, 0, shape[0]))]
    return contribs
