"""One reward surface over the keys of a design group, and its bootstrap refits (science §10.1-10.2, A4).

``R(k, C) = R0 + (A(k) - R0) / (1 + (C_mid(k) / C)^beta(k))`` with ``x = log2 k``: ``A``, ``m = log10 C_mid`` and
``b = log beta`` of a trained key are its own parameters, pulled towards a line in x (``A = a0 + a1 x`` and so on)
by a penalty; a key not trained gets the line (A clipped to [R0, a_max]). R0 is the group's one step-0 mean
(:func:`rollscale.core.fit.decision.shared_r0`, science §9.2). Every run of the group is fitted at once.

**Partial pooling: penalised least squares with an empirical-Bayes penalty.** Minimised:
``sum((y - R)^2) / s_eff^2 + sum_p sum_k (p_k - line_p(x_k))^2 / tau_p^2``, the Gaussian log-likelihood of
points with the key-level deviations ``p_k - line_p(x_k) ~ N(0, tau_p^2)``. A random-effects fit by marginal
likelihood would need a Laplace approximation per refit; the penalised fit with tau estimated once by moments is
two least-squares fits, and the bootstrap holds tau fixed (a refit then costs one warm-started fit). The steps:

1. *No pooling* (tau huge): every key's own ``(A, m, b)`` and their sampling variances ``se^2`` from the
   Jacobian, with the residual variance ``s^2`` scaled by the runs' design effect ``D`` (evaluations of one run
   share its seed's curve: ``D`` is the mean of ``n_r * mean_residual_r^2 / s^2`` over runs, corrected for the
   key's own fit; at least 1). ``s_eff^2 = s^2 D``.
2. *tau by moments* (DerSimonian-Laird's, in its meta-regression form: the weighted residual sum of squares Q
   of the K keys' estimates about their weighted line, weights ``1 / se^2``, ``tau_p^2 = (Q - (K - 2)) / tr(P)``;
   weighted, so that a key whose parameter its data do not identify, a curve not bent within the data, does
   not make every key's deviation look large), never below ``v / 4``, ``v = 1 / mean(1 / se_p^2)`` the keys'
   typical variance by their precision (with four to six keys the moment estimate is 0 in many studies whose
   deviations are real but small, and a surface forced onto the line then bends its forecasts by the
   deviations it ignored; at the floor a key of typical precision still weighs a fifth. The median of
   ``se_p^2`` instead follows one unpinned key among four: measured, tau of A 0.11 on half a simulated study's
   data whose pinned keys deviated by 0.01-0.02). With two keys there is no residual:
   ``tau_p^2 = median(se_p^2)``.
3. *The pooled fit*, warm-started from step 1. The bootstrap draws tau per refit
   (:func:`tau_draws`): K keys estimate it on K - 2 degrees of freedom.

A key with many points follows its own data (small ``se``), a key with few borrows from the line.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
from scipy.optimize import least_squares
from scipy.special import expit

from rollscale.core.fit.decision import shared_r0

__all__ = ["PARAMS", "Surface", "SurfaceData", "evals_of", "fit_surface", "key_parameters", "prepare",
           "refit_surface", "reward", "surface_refits", "tau_draws"]

PARAMS = ("a", "log10_c_mid", "log_beta")
_LN10 = math.log(10.0)
_LOG_BETA = (math.log(0.1), math.log(20.0))
_NO_POOLING = 1e4  # tau of step 1: the penalty rows then weigh nothing


@dataclass(frozen=True)
class SurfaceData:
    """A group's evaluations as arrays: points with ``C > 0`` and each run's step-0 mean.

    ``keys`` are the trained keys, sorted; ``slot`` a run's place among its key's runs (by seed): the paired
    bootstrap resamples slots, the same indices for every key (science §9.3)."""

    keys: np.ndarray  # (K,)
    run_key: np.ndarray  # (R,) index into keys
    slot: np.ndarray  # (R,)
    reach: np.ndarray  # (R,) the largest C each run was evaluated at
    step0: np.ndarray  # (R,) the run's step-0 evaluation (NaN where it has none)
    point_run: np.ndarray  # (P,) index into runs
    log10_c: np.ndarray  # (P,)
    y: np.ndarray  # (P,)

    @property
    def x(self) -> np.ndarray:
        return np.log2(self.keys.astype(float))

    @property
    def point_key(self) -> np.ndarray:
        return self.run_key[self.point_run]


def prepare(evals: pd.DataFrame, key_col: str, seed_col: str | None = "seed") -> SurfaceData:
    """``evals`` (``run_id, c, avg_at_k, key_col`` and optionally ``seed_col``) of one group as arrays."""
    missing = [c for c in ("run_id", "c", "avg_at_k", key_col) if c not in evals.columns]
    if missing:
        raise ValueError(f"evals: missing columns {missing} (has {list(evals.columns)})")
    if (evals[key_col] <= 0).any():
        raise ValueError(f"evals: {key_col} must be positive (the surface is in log2 {key_col})")
    order = [key_col, seed_col, "run_id"] if seed_col in evals.columns else [key_col, "run_id"]
    runs = evals.drop_duplicates("run_id").sort_values(order)
    keys = np.array(sorted(runs[key_col].unique()))
    run_index = {r: i for i, r in enumerate(runs["run_id"])}
    run_key = np.searchsorted(keys, runs[key_col].to_numpy())
    slot = runs.groupby(key_col).cumcount().to_numpy()
    by_run = evals.groupby("run_id")
    reach = by_run["c"].max().reindex(runs["run_id"]).to_numpy(float)
    at0 = evals[evals["c"] == 0].groupby("run_id")["avg_at_k"].mean()
    step0 = at0.reindex(runs["run_id"]).to_numpy(float)
    pts = evals[evals["c"] > 0].sort_values(["run_id", "c"])  # one order whatever the rows' order
    return SurfaceData(keys, run_key, slot, reach, step0, pts["run_id"].map(run_index).to_numpy(int),
                       np.log10(pts["c"].to_numpy(float)), pts["avg_at_k"].to_numpy(float))


def evals_of(data: SurfaceData, key_col: str = "key") -> pd.DataFrame:
    """The evaluations ``data`` was prepared from (:func:`prepare`'s inverse): ``run_id`` (a run's index), ``c``,
    ``avg_at_k``, ``key_col`` and ``seed`` (the run's slot), a step-0 row per run that has one."""
    runs = np.arange(data.run_key.size)
    has0 = np.isfinite(data.step0)
    run_id = np.concatenate([runs[has0], data.point_run])
    return pd.DataFrame({"run_id": run_id,
                         "c": np.concatenate([np.zeros(int(has0.sum())), 10.0 ** data.log10_c]),
                         "avg_at_k": np.concatenate([data.step0[has0], data.y]),
                         key_col: data.keys[data.run_key[run_id]], "seed": data.slot[run_id]})


@dataclass(frozen=True)
class Surface:
    """A fitted surface: ``theta`` = ``(A_1..A_K, m_1..m_K, b_1..b_K, a0, a1, m0, m1, b0, b1)`` over ``keys``."""

    keys: np.ndarray
    theta: np.ndarray
    r0: float
    tau: np.ndarray  # (3,) the deviations' sd of A, log10 C_mid, log beta
    s_eff: float  # residual sd times the square root of the runs' design effect
    se: np.ndarray  # (K, 3) the no-pooling estimates' standard errors (step 1)
    a_max: float | None
    bounds: tuple[np.ndarray, np.ndarray]
    s_points: float | None = None  # the residual sd alone, without the runs' design effect (step 1's s)

    @property
    def line(self) -> np.ndarray:
        """(3, 2): intercept and slope in x = log2 k of A, log10 C_mid, log beta."""
        return self.theta[3 * len(self.keys):].reshape(3, 2)

    def deviations(self) -> np.ndarray:
        """(K, 3): each trained key's parameters minus the line's at its x."""
        k = len(self.keys)
        own = self.theta[:3 * k].reshape(3, k).T
        x = np.log2(self.keys.astype(float))
        return own - (self.line[:, 0][None, :] + x[:, None] * self.line[:, 1][None, :])


def key_parameters(surface: Surface, keys: np.ndarray, draws: np.ndarray | None = None) -> np.ndarray:
    """(len(keys), 3) ``(A, log10 C_mid, log beta)``: a trained key's own, another the line's plus ``draws``
    ((len(keys), 3) deviations, e.g. N(0, tau^2) in a bootstrap refit), clipped to the parameters' bounds."""
    keys = np.asarray(keys)
    x = np.log2(keys.astype(float))
    out = surface.line[:, 0][None, :] + x[:, None] * surface.line[:, 1][None, :]
    if draws is not None:
        out = out + draws
    k = len(surface.keys)
    own = surface.theta[:3 * k].reshape(3, k).T
    pos = np.searchsorted(surface.keys, keys)
    trained = (pos < k) & (surface.keys[np.minimum(pos, k - 1)] == keys)
    out[trained] = own[pos[trained]]
    lo, hi = surface.bounds
    lo3, hi3 = lo[[0, k, 2 * k]], hi[[0, k, 2 * k]]
    lo3[0] = surface.r0
    if surface.a_max is not None:
        hi3[0] = surface.a_max
    return np.clip(out, lo3, hi3)


def reward(r0: float, params: np.ndarray, c: np.ndarray) -> np.ndarray:
    """R at C for rows ``(A, log10 C_mid, log beta)`` (broadcast against ``c``)."""
    a, m, b = params[..., 0], params[..., 1], params[..., 2]
    return r0 + (a - r0) * expit(np.exp(b) * _LN10 * (np.log10(c) - m))


def _parts(theta: np.ndarray, data: SurfaceData, r0: float, jac: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """Predictions at the points and, with ``jac``, their derivatives in theta's first 3K entries."""
    k = len(data.keys)
    pk = data.point_key
    a, m, b = theta[:k][pk], theta[k:2 * k][pk], theta[2 * k:3 * k][pk]
    beta = np.exp(b)
    s = expit(beta * _LN10 * (data.log10_c - m))
    f = r0 + (a - r0) * s
    if not jac:
        return f, None
    ds = (a - r0) * s * (1.0 - s) * _LN10 * beta
    cols = np.zeros((f.size, 3 * k))
    rows = np.arange(f.size)
    cols[rows, pk], cols[rows, k + pk], cols[rows, 2 * k + pk] = s, -ds, ds * (data.log10_c - m)
    return f, cols


def _solve(data: SurfaceData, r0: float, y: np.ndarray, w: np.ndarray, s_eff: float, tau: np.ndarray,
           theta0: np.ndarray, lo: np.ndarray, hi: np.ndarray, tol: float = 1e-8,
           shift: np.ndarray | None = None) -> np.ndarray:
    """The penalised least squares of the module docstring, points weighted by ``w`` (run counts); ``shift``
    ((3K,), A's then C_mid's then beta's) moves the deviations' prior mean off 0 (a refit's perturbed prior)."""
    k = len(data.keys)
    x = data.x
    sw = np.sqrt(w) / s_eff
    pen = np.zeros((3 * k, theta0.size))
    for p in range(3):
        rows = slice(p * k, (p + 1) * k)
        pen[rows, p * k:(p + 1) * k] = np.eye(k) / tau[p]
        pen[rows, 3 * k + 2 * p] = -1.0 / tau[p]
        pen[rows, 3 * k + 2 * p + 1] = -x / tau[p]

    offset = np.zeros(3 * k) if shift is None else shift / np.repeat(tau, k)

    def fun(t: np.ndarray) -> np.ndarray:
        f, _ = _parts(t, data, r0, False)
        return np.concatenate([sw * (f - y), pen @ t - offset])

    def jac(t: np.ndarray) -> np.ndarray:
        _, d = _parts(t, data, r0, True)
        top = np.zeros((d.shape[0], t.size))
        top[:, :3 * k] = sw[:, None] * d
        return np.vstack([top, pen])

    gap = np.where(np.isfinite(hi - lo), 1e-9 * (hi - lo), 0.0)
    start = np.clip(theta0, lo + gap, hi - gap)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = least_squares(fun, start, jac=jac, bounds=(lo, hi), method="trf", x_scale="jac", xtol=tol,
                            ftol=tol, max_nfev=200)
    return res.x


def _bounds(data: SurfaceData, r0: float, a_max: float | None) -> tuple[np.ndarray, np.ndarray]:
    k = len(data.keys)
    lo_c, hi_c = float(data.log10_c.min()), float(data.log10_c.max())
    top = a_max if a_max is not None else np.inf
    lo = np.concatenate([np.full(k, r0), np.full(k, lo_c - 3.0), np.full(k, _LOG_BETA[0]), np.full(6, -np.inf)])
    hi = np.concatenate([np.full(k, top), np.full(k, hi_c + 3.0), np.full(k, _LOG_BETA[1]), np.full(6, np.inf)])
    return lo, hi


def _start(data: SurfaceData, r0: float, a_max: float | None) -> np.ndarray:
    """Each key's A from its largest evaluations, C_mid at the middle of its points, beta 1.5; the line flat."""
    k = len(data.keys)
    a, m = np.zeros(k), np.zeros(k)
    for i in range(k):
        on = data.point_key == i
        ys, xs = data.y[on], data.log10_c[on]
        a[i] = max(np.quantile(ys, 0.9) if ys.size else r0, r0 + 1e-3)
        m[i] = np.median(xs) if xs.size else np.median(data.log10_c)
    if a_max is not None:
        a = np.minimum(a, a_max - 1e-6)
    b = np.full(k, math.log(1.5))
    return np.concatenate([a, m, b, [a.mean(), 0.0, m.mean(), 0.0, b.mean(), 0.0]])


def _design_effect(data: SurfaceData, resid: np.ndarray, s2: float) -> float:
    """Runs' design effect: the spread of run-mean residuals against independent points (module docstring)."""
    runs = np.bincount(data.point_run, minlength=data.run_key.size)
    sums = np.bincount(data.point_run, weights=resid, minlength=data.run_key.size)
    has = runs > 0
    per_key = np.bincount(data.run_key[has], minlength=len(data.keys))
    df = float((per_key[per_key > 0] - 1).sum())  # the key's own fit absorbs one run mean
    if df <= 0 or s2 <= 0:
        return 1.0
    return max(1.0, float((sums[has] ** 2 / runs[has]).sum()) / df / s2)


def _moment_tau(x: np.ndarray, est: np.ndarray, se: np.ndarray) -> float:
    """DerSimonian-Laird's moment estimate of the deviations' sd about a weighted line (meta-regression form:
    ``tau^2 = (Q - (K - 2)) / tr(P)``, weights ``1 / se^2``), floored (module docstring)."""
    v = np.maximum(se**2, 1e-12)
    floor = 1.0 / float(np.mean(1.0 / v)) / 4.0
    if x.size < 3:
        return math.sqrt(max(float(np.median(v)), 1e-12))
    w = np.diag(1.0 / v)
    design = np.column_stack([np.ones_like(x), x])
    proj = w - w @ design @ np.linalg.pinv(design.T @ w @ design) @ design.T @ w
    q = float(est @ proj @ est)
    return math.sqrt(max((q - (x.size - 2)) / float(np.trace(proj)), floor, 1e-12))


def fit_surface(data: SurfaceData, r0: float | None = None, a_max: float | None = 1.0) -> Surface:
    """The point fit of the module docstring (steps 1-3). ``r0`` defaults to the runs' step-0 mean."""
    if r0 is None:
        r0 = float(np.nanmean(data.step0)) if np.isfinite(data.step0).any() else math.nan
    if not math.isfinite(r0):
        raise ValueError("evals: no step-0 (C = 0) evaluation: the surface needs the group's R0 (science §9.2)")
    if data.y.size == 0:
        raise ValueError("evals: no evaluation past step 0 to fit the surface on")
    k = len(data.keys)
    lo, hi = _bounds(data, r0, a_max)
    w = np.ones_like(data.y)
    free = np.full(3, _NO_POOLING)
    theta1 = _solve(data, r0, data.y, w, 1.0, free, _start(data, r0, a_max), lo, hi)
    f, d = _parts(theta1, data, r0, True)
    resid = data.y - f
    s2 = float(resid @ resid) / max(data.y.size - 3 * k, 1)
    s2_eff = max(s2 * _design_effect(data, resid, s2), 1e-12)
    se = np.zeros((k, 3))
    for i in range(k):
        on = data.point_key == i
        cols = np.r_[i, k + i, 2 * k + i]
        jj = d[on][:, cols]
        cov = s2_eff * np.linalg.pinv(jj.T @ jj)
        span = (hi[cols] - lo[cols])
        span[~np.isfinite(span)] = 1.0
        se[i] = np.minimum(np.sqrt(np.clip(np.diag(cov), 0, None)), span)  # an unidentified one: the range
        if not on.any():
            se[i] = span
    own = theta1[:3 * k].reshape(3, k).T
    tau = np.array([_moment_tau(data.x, own[:, p], se[:, p]) for p in range(3)])
    start = theta1.copy()
    coefs = [np.polyfit(data.x, own[:, p], 1) if k >= 2 else np.array([0.0, own[0, p]]) for p in range(3)]
    start[3 * k:] = np.concatenate([[c[1], c[0]] for c in coefs])
    theta = _solve(data, r0, data.y, w, math.sqrt(s2_eff), tau, start, lo, hi)
    return Surface(data.keys, theta, r0, tau, math.sqrt(s2_eff), se, a_max, (lo, hi), math.sqrt(max(s2, 1e-12)))


def tau_draws(surface: Surface, resamples: int, seed: int = 0) -> np.ndarray:
    """(resamples, 3): the deviations' sd for each refit, ``tau^2 d / chi2_d`` with ``d = max(K - 2, 1)``.

    tau is estimated from K keys' deviations about a line: K - 2 degrees of freedom, two with four keys. Held at
    its point estimate, a key whose parameter its own data do not pin (a curve not bent by C_max) takes the
    line's value within +-2 tau, and tau is what the keys whose data do pin theirs show: measured, the ``late``
    family's n = 16, whose asymptote lies 0.1 above the line of n = 2-8, was covered at 4 x C_max in 17 of 24
    studies, 22 of 24 with tau drawn (docs/benchmarks.md). Drawn per refit as a variance estimated on d degrees of freedom is (the
    scaled inverse chi-square of a normal variance), the refits carry tau's own uncertainty: wide where the prior
    decides, unchanged where a key's data do."""
    dof = max(len(surface.keys) - 2, 1)
    chi2 = np.random.default_rng([seed, 3]).chisquare(dof, size=(resamples, 3))
    return surface.tau[None, :] * np.sqrt(dof / np.maximum(chi2, 1e-12))


def surface_refits(data: SurfaceData, surface: Surface, resamples: int, eval_draws: int | None,
                   seed: int = 0, perturb: bool = True,
                   taus: np.ndarray | None = None, resample_runs: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """``(thetas (resamples, 3K + 6), r0s (resamples,))``: the surface refitted on bootstraps (science §10.2).

    Each refit

    * resamples seed slots, the same indices for every key (a key with S runs takes slot ``floor(u S)`` of one
      uniform u per slot: science §9.3's pairing, so D is read refit by refit); without ``resample_runs`` every
      run is kept once: the refits then spread as what these runs' evaluations leave unknown, not what other
      seeds would give (the backtest's A4 check compares a forecast with the same runs' end);
    * redraws the evaluation noise: a fresh ``Binomial(eval_draws, p) / eval_draws - p`` at each point's fitted
      p is added (the observed evaluations hold one draw already, so a refit sees the noise twice: conservative
      by that share, and what makes resamples of two seeds continuous); ``eval_draws`` None: none;
    * re-estimates R0 from the resampled runs' step-0 evaluations, redrawn the same way;
    * with ``perturb``, moves the penalty's centre per key by a draw from N(0, tau^2) (a perturbed prior: the
      refits of a penalised fit then spread as its posterior does, in the linear Gaussian case exactly). Without
      it a key whose data do not pin a parameter (a curve not bent by C_max) gets it from the line in every
      refit, and its interval misses the deviation the key may have (docs/benchmarks.md: coverage with and
      without);
    * with ``taus`` ((resamples, 3), :func:`tau_draws`), refit b's penalty and perturbed prior use ``taus[b]``;
      without, tau is held;
    * refits warm-started from ``surface``, ``s_eff`` held.

    Residual curves pooled across keys (science §9.3's other option) were tried and dropped: a donor run's
    residuals carry its own key's phase (rising where the recipient is flat), and the refits' centre moved off
    the point fit (a plateaued key's A by +0.015)."""
    rng = np.random.default_rng(seed)
    k = len(data.keys)
    runs_per_key = np.bincount(data.run_key, minlength=k)
    u = rng.random((resamples, int(runs_per_key.max())))
    p_fit = np.clip(_parts(surface.theta, data, surface.r0, False)[0], 0.0, 1.0)
    prior = np.random.default_rng([seed, 2]).normal(size=(resamples, 3 * k))
    slots = [idx[np.argsort(data.slot[idx])] for idx in (np.flatnonzero(data.run_key == i) for i in range(k))]
    thetas, r0s = np.full((resamples, surface.theta.size), np.nan), np.full(resamples, np.nan)
    for b in range(resamples):
        counts = np.zeros(data.run_key.size) if resample_runs else np.ones(data.run_key.size)
        for order in slots if resample_runs else ():
            np.add.at(counts, order[np.floor(u[b, :order.size] * order.size).astype(int)], 1.0)
        y, s0 = data.y.copy(), data.step0.copy()
        if eval_draws:
            y += rng.binomial(eval_draws, p_fit) / eval_draws - p_fit
            p0 = min(max(surface.r0, 0.0), 1.0)
            s0 += rng.binomial(eval_draws, p0, size=s0.size) / eval_draws - p0
        use = (counts > 0) & np.isfinite(s0)
        r0 = float(np.average(s0[use], weights=counts[use])) if use.any() else surface.r0
        lo = surface.bounds[0].copy()
        lo[:k] = r0
        # a refit starts at the optimum's neighbourhood: 1e-6 on the cost is far below the refits' spread
        tau = surface.tau if taus is None else taus[b]
        thetas[b] = _solve(data, r0, y, counts[data.point_run], surface.s_eff, tau, surface.theta, lo,
                           surface.bounds[1], 1e-6, np.repeat(tau, k) * prior[b] if perturb else None)
        r0s[b] = r0
    return thetas, r0s


def refit_surface(surface: Surface, theta: np.ndarray, r0: float) -> Surface:
    """``surface`` with a refit's parameters and R0 (its bounds' A floor moved to that R0)."""
    lo = surface.bounds[0].copy()
    lo[:len(surface.keys)] = r0
    return replace(surface, theta=theta, r0=r0, bounds=(lo, surface.bounds[1]))
