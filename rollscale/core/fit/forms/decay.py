"""The rise per doubling that can only decay (science §11.2): the ``decay`` and ``linear`` forms.

Per key k, past its early regime, ``R_k(C) = L_k + s_k h(log2 C - u_k)`` with ``h(t) = (1 - e^(-lambda t)) /
lambda`` (``t`` as lambda -> 0): ``u_k`` is log2 of the largest budget k was evaluated at, ``L_k`` its level
there, ``s_k >= 0`` its rise per doubling there, and the rise per doubling falls by the factor ``e^(-lambda)``
each doubling, ``lambda >= 0`` pooled over the group's keys (one decay rate: the keys' curves bend alike, and
one key's few doublings do not pin its own), and 0 unless the data show the bend beyond noise (an F test at
:data:`BEND_LEVEL` of the fit with lambda against the one without, in the point fit and in every refit). So a curve still rising where its data end keeps rising at its own
rate, slowed only as far as the group's data show rises falling from doubling to doubling; a ceiling is never
read from where the data stop. ``linear`` holds lambda at 0 (the rise per doubling continued unchanged), the
form's limit and a yardstick. Every prediction is capped at the settings' ceiling (the base's pass@k on the
validation problems where known, science §11.2).

The early regime: a key's evaluations before its reward leaves its step-0 band (R0 plus two standard errors of
a window's mean, the window one doubling from each budget) carry no shape (ScaleRL fits after it) and are left
out; a key keeps at least its last :data:`MIN_SHAPE_POINTS` evaluations.

A key not trained: per refit, the reward of the trained keys at C interpolated linearly in log2 of the key
(beyond them, continued from the nearest two).

Refits: seed slots resampled paired across keys (science §9.3), evaluation noise redrawn at the fitted values
(``Binomial(eval_draws, p) / eval_draws - p``) and the rest of the residuals' scatter as a normal draw, the model
refitted from the point fit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy.optimize import minimize_scalar
from scipy.stats import f as f_dist

from rollscale.core.fit.forms import FormSettings, register
from rollscale.core.fit.surface import SurfaceData

__all__ = ["DecayForm", "LAMBDA_MAX", "MIN_SHAPE_POINTS", "Rise", "fit_decay", "fit_decay_key", "fit_linear",
           "fit_shape", "recent_points", "shape_points"]

MIN_SHAPE_POINTS = 3
BEND_LEVEL = 0.95  # a bend is read only where the data show it beyond noise (an F test of lambda against 0)
LAMBDA_MAX = 2.0  # a rise per doubling falling by e^-2 (to 14 %) each doubling: a curve all but flat
_BAND_Z = 2.0
# each key's rise per doubling: its own; one for the group ("pooled"); or its own but at least the group's where its
# own data show no bend ("floor", :mod:`rollscale.core.fit.forms.recent`)
Rise = Literal["own", "pooled", "floor"]


def shape_points(data: SurfaceData, eval_draws: int | None) -> np.ndarray:
    """(P,) bool: the evaluations past each key's early regime (module docstring)."""
    r0 = float(np.nanmean(data.step0)) if np.isfinite(data.step0).any() else math.nan
    keep = np.ones(data.y.size, bool)
    if not math.isfinite(r0):
        return keep
    if eval_draws:
        se = math.sqrt(max(r0 * (1 - r0), 1e-4) / eval_draws)
    else:
        s0 = data.step0[np.isfinite(data.step0)]
        se = float(np.std(s0, ddof=1)) if s0.size > 1 else 0.02
    x2 = data.log10_c * math.log2(10.0)
    for i in range(len(data.keys)):
        on = np.flatnonzero(data.point_key == i)
        if on.size == 0:
            continue
        order = on[np.argsort(x2[on], kind="stable")]
        start = None
        for j in order:
            window = order[(x2[order] >= x2[j]) & (x2[order] <= x2[j] + 1.0 + 1e-9)]
            if data.y[window].mean() > r0 + _BAND_Z * se / math.sqrt(window.size):
                start = x2[j]
                break
        early = order[x2[order] < start] if start is not None else order
        early = early[:max(order.size - MIN_SHAPE_POINTS, 0)]  # the last few always stay
        keep[early] = False
    return keep


def recent_points(data: SurfaceData, u: np.ndarray, window: float) -> np.ndarray:
    """(P,) bool: each key's evaluations within ``window`` doublings of its last, and at least its last
    :data:`MIN_SHAPE_POINTS` (the rise per doubling where the data end, science §11.2)."""
    x2 = data.log10_c * math.log2(10.0)
    keep = x2 >= u[data.point_key] - window - 1e-9
    for i in range(len(data.keys)):
        on = np.flatnonzero(data.point_key == i)
        last = on[np.argsort(x2[on], kind="stable")][-MIN_SHAPE_POINTS:]
        keep[last] = True
    return keep


def _h(t: np.ndarray, lam: float | np.ndarray) -> np.ndarray:
    """The doublings' rise for rates falling by ``e^-lam`` a doubling (``lam`` one, or each point's own)."""
    lam = np.asarray(lam, float)
    if lam.ndim == 0 and lam < 1e-9:
        return t  # the rise continued unchanged: the common case, on the predictions' hot path
    safe = np.where(lam < 1e-9, 1.0, lam)
    return np.where(lam < 1e-9, t, -np.expm1(-safe * t) / safe)


@dataclass(frozen=True)
class DecayForm:
    keys: np.ndarray  # (K,) trained keys
    u: np.ndarray  # (K,) log2 of each key's largest evaluated budget
    theta: np.ndarray  # (2K + 1,): L, s, lambda
    thetas: np.ndarray  # (resamples, 2K + 1)
    ceiling: float

    def _lambdas(self, theta: np.ndarray) -> np.ndarray:
        k = self.keys.size
        return theta[2 * k:3 * k] if theta.size == 3 * k else np.full(k, float(theta[-1]))

    def _trained(self, theta: np.ndarray, log2c: np.ndarray) -> np.ndarray:
        """(K, len(log2c)) every trained key's reward at each budget."""
        k = self.keys.size
        t = log2c[None, :] - self.u[:, None]
        lam = self._lambdas(theta)
        return np.stack([theta[i] + theta[k + i] * _h(t[i], float(lam[i])) for i in range(k)])

    def points(self, theta: np.ndarray, point_key: np.ndarray, log2c: np.ndarray) -> np.ndarray:
        k = self.keys.size
        lam = self._lambdas(theta)
        t = log2c - self.u[point_key]
        out = np.empty(log2c.size)
        for i in range(k):
            on = point_key == i
            out[on] = theta[i] + theta[k + i] * _h(t[on], float(lam[i]))
        return out

    def _at(self, theta: np.ndarray, keys: np.ndarray, log2c: np.ndarray) -> np.ndarray:
        grid = self._trained(theta, log2c)  # (K, n)
        x = np.log2(self.keys.astype(float))
        out = np.empty(keys.size)
        for j, key in enumerate(keys):
            xk = math.log2(float(key))
            hit = np.flatnonzero(self.keys == key)
            if hit.size:
                out[j] = grid[hit[0], j]
            elif x.size == 1:
                out[j] = grid[0, j]
            else:
                i = int(np.clip(np.searchsorted(x, xk) - 1, 0, x.size - 2))
                w = (xk - x[i]) / (x[i + 1] - x[i])
                out[j] = (1 - w) * grid[i, j] + w * grid[i + 1, j]
        return np.clip(out, 0.0, self.ceiling)

    def predict(self, keys: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        keys, log2c = np.asarray(keys), np.log2(np.asarray(c, float))
        point = self._at(self.theta, keys, log2c)
        refits = np.stack([self._at(t, keys, log2c) for t in self.thetas]) if len(self.thetas) else \
            np.empty((0, keys.size))
        return point, refits


def _given_lambda(pk: np.ndarray, t: np.ndarray, y: np.ndarray, w: np.ndarray, k: int,
                  lam: float | np.ndarray, rise: Rise = "own") -> tuple[np.ndarray, float]:
    """``(theta (2K + 1,) or, with each key's own lambda (``lam`` (K,)), (3K,); weighted RSS)``: given lambda the
    model is linear in each key's (L, s): weighted least squares per key in closed form, s held at 0 where its
    estimate is negative (a key never forecast to fall). ``rise`` (:data:`Rise`): "pooled", one s for every key
    (each key its own L), from the keys' within-key scatter together; "floor", each key's own s but at least the
    pooled one, unless its own lambda is above 0 (its data bend: a bending key is not lifted to the group's rise)."""
    lams = np.asarray(lam, float)
    h = _h(t, lams[pk] if lams.ndim else lams)
    sw, swh, swhh = (np.bincount(pk, weights=v, minlength=k) for v in (w, w * h, w * h * h))
    swy, swhy = np.bincount(pk, weights=w * y, minlength=k), np.bincount(pk, weights=w * h * y, minlength=k)
    det = sw * swhh - swh**2
    ok = (det > 1e-12 * np.maximum(sw * swhh, 1e-300)) & (sw > 0)
    safe = np.where(ok, det, 1.0)
    own = np.where(ok, (sw * swhy - swh * swy) / safe, 0.0)
    if rise != "own":
        # sum over keys of (S_hy - S_h S_y / S) / sum of (S_hh - S_h^2 / S): the common slope
        has = sw > 0
        num = float(np.sum(np.where(has, swhy - swh * swy / np.where(has, sw, 1.0), 0.0)))
        den = float(np.sum(np.where(has, det / np.where(has, sw, 1.0), 0.0)))
        common = num / den if den > 1e-12 else 0.0
        slope = np.full(k, common)
        if rise == "floor":
            slope = np.where(ok, np.where(lams > 1e-9, own, np.maximum(own, common)), common)
    else:
        slope = own
    slope = np.clip(slope, 0.0, None)
    level = np.where(sw > 0, (swy - slope * swh) / np.where(sw > 0, sw, 1.0), 0.0)
    resid = level[pk] + slope[pk] * h - y
    return np.concatenate([level, slope, lams if lams.ndim else [float(lams)]]), float((w * resid * resid).sum())


def _solve_bent(data: SurfaceData, u: np.ndarray, on: np.ndarray, y: np.ndarray, w: np.ndarray,
                lam_max: float, rise: Rise = "own") -> np.ndarray:
    """The fit with lambda free where the data show a bend beyond noise, else with lambda 0 (module docstring):
    lambda is bounded below, so left free it would be above 0 in every fit to noise, and the forecast low.
    Lambda is profiled out: a bounded one-dimensional search over the closed-form fits given lambda."""
    k = len(data.keys)
    keep = on & (w > 0)
    pk = data.point_key[keep]
    t = data.log10_c[keep] * math.log2(10.0) - u[pk]
    yy, ww = y[keep], w[keep]
    flat, rss0 = _given_lambda(pk, t, yy, ww, k, 0.0, rise)
    if lam_max <= 0:
        return flat
    best = minimize_scalar(lambda lam: _given_lambda(pk, t, yy, ww, k, lam, rise)[1], bounds=(0.0, lam_max),
                           method="bounded", options={"xatol": 1e-4})
    bent, rss1 = _given_lambda(pk, t, yy, ww, k, float(best.x), rise)
    dof = int(keep.sum()) - (k + 2 if rise == "pooled" else bent.size)
    if dof < 1 or rss1 >= rss0:
        return flat
    f = (rss0 - rss1) / max(rss1 / dof, 1e-300)
    return bent if f > float(f_dist.ppf(BEND_LEVEL, 1, dof)) else flat


def _solve_each(data: SurfaceData, u: np.ndarray, on: np.ndarray, y: np.ndarray, w: np.ndarray,
                lam_max: float) -> np.ndarray:
    """:func:`_solve_bent` key by key: each key its own lambda (its own F test); theta's lambda slot unused."""
    k = len(data.keys)
    theta = np.zeros(3 * k)
    for i in range(k):
        sel = on & (data.point_key == i)
        one = _solve_bent(_one_key(data, i), u[[i]], sel[data.point_key == i], y[data.point_key == i],
                          w[data.point_key == i], lam_max)
        theta[i], theta[k + i], theta[2 * k + i] = one
    return theta


def _one_key(data: SurfaceData, i: int) -> SurfaceData:
    mine = data.point_key == i
    runs = np.flatnonzero(data.run_key == i)
    remap = np.full(data.run_key.size, -1)
    remap[runs] = np.arange(runs.size)
    return SurfaceData(data.keys[[i]], np.zeros(runs.size, int), data.slot[runs], data.reach[runs],
                       data.step0[runs], remap[data.point_run[mine]], data.log10_c[mine], data.y[mine])


def fit_shape(data: SurfaceData, settings: FormSettings, lam_max: float, per_key: bool = False,
              window: float | None = None, rise: Rise = "own") -> DecayForm:
    """The fit of this module's forms and of :mod:`rollscale.core.fit.forms.recent`'s, with its refits.
    ``per_key``: each key's own bend (its own F test); ``window``: each key's level and rise per doubling read on
    its last ``window`` doublings of evaluations only (at least its last :data:`MIN_SHAPE_POINTS`), the bend still
    read on its whole shape; ``rise``: each key's rise per doubling (:data:`Rise`)."""
    k = len(data.keys)
    x2 = data.log10_c * math.log2(10.0)
    u = np.array([x2[data.point_key == i].max() if (data.point_key == i).any() else 0.0 for i in range(k)])
    on = shape_points(data, settings.eval_draws)
    ones = np.ones(data.y.size)
    if per_key and window is None:
        solve = _solve_each
    elif window is None:
        def solve(data, u, on, y, w, lam_max):
            return _solve_bent(data, u, on, y, w, lam_max, rise)
    else:
        shape, on = on, on & recent_points(data, u, window)

        def solve(data, u, near, y, w, lam_max):
            # the bend read on the whole shape, beyond noise; the level and the rise where the data end
            lam: float | np.ndarray = 0.0
            if lam_max > 0 and per_key:
                lam = _solve_each(data, u, shape, y, w, lam_max)[2 * k:]
            elif lam_max > 0:
                lam = float(_solve_bent(data, u, shape, y, w, lam_max, rise)[-1])
            keep = near & (w > 0)
            pk = data.point_key[keep]
            t = data.log10_c[keep] * math.log2(10.0) - u[pk]
            return _given_lambda(pk, t, y[keep], w[keep], k, lam, rise)[0]
    theta = solve(data, u, on, data.y, ones, lam_max)
    form = DecayForm(data.keys, u, theta, np.empty((0, theta.size)), settings.ceiling)
    rng = np.random.default_rng([settings.seed, 7])
    runs_per_key = np.bincount(data.run_key, minlength=k)
    slots = [idx[np.argsort(data.slot[idx])] for idx in (np.flatnonzero(data.run_key == i) for i in range(k))]
    fitted = np.clip(form.points(theta, data.point_key, x2), 0.0, 1.0)
    # the points' scatter about the fit beyond evaluation noise (a run's curve wiggles): redrawn too, so that a
    # slope read from two seeds spreads as much as its residuals say
    resid = (data.y - fitted)[on]
    dof = max(int(on.sum()) - (k + 2 if rise == "pooled" else theta.size), 1)
    s2 = float(resid @ resid) / dof
    noise2 = float(np.mean(fitted[on] * (1 - fitted[on]))) / settings.eval_draws if settings.eval_draws else 0.0
    extra = math.sqrt(max(s2 - noise2, 0.0))
    thetas = np.empty((settings.resamples, theta.size))
    for b in range(settings.resamples):
        counts = np.ones(data.run_key.size)
        if settings.resample_runs:
            counts = np.zeros(data.run_key.size)
            draw = rng.random(int(runs_per_key.max()))
            for order in slots:
                np.add.at(counts, order[np.floor(draw[:order.size] * order.size).astype(int)], 1.0)
        y = data.y
        if settings.eval_draws:
            y = y + rng.binomial(settings.eval_draws, fitted) / settings.eval_draws - fitted
        if extra > 0:
            y = y + rng.normal(0.0, extra, y.size)
        thetas[b] = solve(data, u, on, y, counts[data.point_run], lam_max)
    return DecayForm(data.keys, u, theta, thetas, settings.ceiling)


@register("decay")
def fit_decay(data: SurfaceData, settings: FormSettings) -> DecayForm:
    """The ``decay`` form (module docstring)."""
    return fit_shape(data, settings, LAMBDA_MAX)


@register("decay_key")
def fit_decay_key(data: SurfaceData, settings: FormSettings) -> DecayForm:
    """The ``decay`` form with each key's own decay rate (its own F test): keys at different phases of their
    curves (one bending, one still accelerating) do not share one."""
    return fit_shape(data, settings, LAMBDA_MAX, per_key=True)


@register("linear")
def fit_linear(data: SurfaceData, settings: FormSettings) -> DecayForm:
    """The ``linear`` form: the rise per doubling at the data's end, continued (lambda = 0)."""
    return fit_shape(data, settings, 0.0)
