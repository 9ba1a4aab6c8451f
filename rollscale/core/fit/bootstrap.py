"""Bootstrap intervals over independent runs (science §7, "Uncertainty, honestly").

Record-breaking points of one run are not independent, so intervals come from
resampling whole runs: within each stratum (one run configuration; its runs
differ only by seed) the runs are drawn with replacement, every fit is redone
on the resample, and the 2.5 / 97.5 percentiles of the refitted quantity are
the 95 % interval. A resample is a vector of run counts, so a refit is a
least-squares fit with each point weighted by its run's count (a run drawn
twice counts twice): all resamples are fitted at once, vectorised, by
damped Gauss-Newton (Levenberg-Marquardt) from the full-data estimate.

A quantity whose runs have one seed per configuration has no interval: the
resamples would all be the data itself. Callers show "1 seed, no interval"
(:data:`ONE_SEED`) instead.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.special import expit
from scipy.stats import norm
from scipy.stats import t as student_t

from rollscale.core.fit.sigmoid import to_delta, to_u, u_jacobian

__all__ = [
    "LEVEL",
    "ONE_SEED",
    "Bootstrap",
    "interval",
    "interval_note",
    "linear_inverse_b_refits",
    "seeds_per_stratum",
    "sigmoid_refits",
    "weighted_means",
]

LEVEL = 0.95
ONE_SEED = "1 seed, no interval"
_LN10 = math.log(10.0)


@dataclass(frozen=True)
class Bootstrap:
    """How to resample: ``resamples`` draws (0 = no intervals), seeded by ``seed``."""

    resamples: int = 200
    seed: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.resamples, bool) or not isinstance(self.resamples, int) or self.resamples < 0:
            raise ValueError(f"resamples: expected an int >= 0, got {self.resamples!r}")

    def run_counts(self, strata: ArrayLike, salt: int = 0) -> NDArray[np.int64]:
        """``(resamples, runs)`` counts: each stratum's k runs drawn k times with replacement.

        ``salt`` separates the streams of independent analyses (groups, axes)
        so that adding one does not change another's draws.
        """
        labels = np.asarray(strata)
        rng = np.random.default_rng([self.seed, salt])
        counts = np.zeros((self.resamples, labels.size), dtype=np.int64)
        for label in dict.fromkeys(labels.tolist()):
            idx = np.flatnonzero(labels == label)
            counts[:, idx] = rng.multinomial(idx.size, np.full(idx.size, 1.0 / idx.size), size=self.resamples)
        return counts


def seeds_per_stratum(strata: ArrayLike) -> int:
    """The fewest runs (seeds) any stratum has: below 2 there is no interval."""
    _, counts = np.unique(np.asarray(strata), return_counts=True)
    return int(counts.min()) if counts.size else 0


def interval(
    samples: ArrayLike, seeds: int, axis: int = 0, level: float = LEVEL
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """95 % (``level``) expanded-percentile interval of bootstrap refits over ``seeds`` runs per config.

    The plain 2.5 / 97.5 percentiles are too narrow with few runs (with 3
    seeds a percentile interval covers far less than 95 %: the resampling
    distribution's spread is that of the seeds, shrunk by (k - 1) / k, and its
    tails are a normal's where a t with k - 1 degrees of freedom belongs).
    Hesterberg's expanded percentile interval (Hesterberg 2015, "What teachers
    should know about the bootstrap") takes the percentiles at
    ``Phi(-sqrt(k / (k - 1)) t_{k-1, 0.975})`` instead; with many seeds it is
    the plain one. NaN refits (failed fits) are left out; ``seeds < 2`` gives NaN.
    """
    a = np.asarray(samples, dtype=float)
    if seeds < 2 or a.shape[axis] == 0:
        shape = np.delete(a.shape, axis)
        return np.full(shape, np.nan), np.full(shape, np.nan)
    tail = _tail(seeds, level)
    return _nan_percentiles(np.moveaxis(a, axis, 0), (tail, 100.0 - tail))


@functools.lru_cache(maxsize=256)
def _tail(seeds: int, level: float) -> float:
    """The expanded percentile's lower tail in percent (Hesterberg 2015)."""
    return 100.0 * float(norm.cdf(-math.sqrt(seeds / (seeds - 1)) * student_t.ppf(0.5 + level / 2, seeds - 1)))


def _nan_percentiles(a: NDArray[np.float64], q: tuple[float, float]) -> tuple[NDArray, NDArray]:
    """``np.nanpercentile(a, q, axis=0)`` (linear), fast: columns sharing a pattern of NaN rows (a failed refit is
    NaN at every budget) are done in one ``np.percentile`` call; an all-NaN column is NaN."""
    flat = a.reshape(a.shape[0], -1)
    missing = np.isnan(flat)
    if not missing.any():
        lo, hi = np.percentile(flat, q, axis=0, method="linear")
        return lo.reshape(a.shape[1:]), hi.reshape(a.shape[1:])
    lo, hi = np.full(flat.shape[1], np.nan), np.full(flat.shape[1], np.nan)
    failed = missing.any(axis=1)
    if missing[failed].all():  # whole rows missing (failed refits): one pattern
        lo[:], hi[:] = np.percentile(flat[~failed], q, axis=0, method="linear") if (~failed).any() else (lo, hi)
        return lo.reshape(a.shape[1:]), hi.reshape(a.shape[1:])
    packed = np.ascontiguousarray(np.packbits(missing, axis=0).T)  # one byte string per column's NaN rows
    _, first, which = np.unique(packed.view(f"V{packed.shape[1]}").ravel(), return_index=True, return_inverse=True)
    for p, col in enumerate(first):
        rows = missing[:, col]
        cols = np.flatnonzero(which.reshape(-1) == p)
        if rows.all():
            continue
        lo[cols], hi[cols] = np.percentile(flat[~rows][:, cols], q, axis=0, method="linear")
    return lo.reshape(a.shape[1:]), hi.reshape(a.shape[1:])


def interval_note(seeds: int, resamples: int) -> str:
    """The ``interval`` column: how an interval was made, or why there is none."""
    if seeds < 2:
        return ONE_SEED
    if resamples < 1:
        return "no bootstrap (fit.bootstrap_resamples = 0)"
    return f"bootstrap over runs: {seeds}+ seeds per config, {resamples} resamples, 95 %"


# ---------------------------------------------------------------------------
# vectorised refits


def _sigmoid_parts(theta: NDArray[np.float64], x: NDArray[np.float64],
                   jac: bool = True) -> tuple[NDArray, NDArray | None]:
    """Predictions ``(rows, points)`` and, with ``jac``, their derivatives ``(rows, points, 4)``."""
    r0, delta, m, beta = (theta[:, i : i + 1] for i in range(4))
    s = expit(beta * _LN10 * (x - m))
    f = r0 + delta * s
    if not jac:
        return f, None
    ds = delta * s * (1.0 - s) * _LN10
    return f, np.stack([np.ones_like(s), s, -ds * beta, ds * (x - m)], axis=-1)


def _solve(a: NDArray[np.float64], b: NDArray[np.float64]) -> NDArray[np.float64]:
    """Batched ``a x = b``; a batch holding an exactly singular matrix (two parameters' Jacobian columns equal at
    the weighted points, as when A = R0) is solved by least squares (pseudo-inverse)."""
    try:
        return np.linalg.solve(a, b[:, :, None])[:, :, 0]
    except np.linalg.LinAlgError:
        return (np.linalg.pinv(a) @ b[:, :, None])[:, :, 0]


Parts = Callable[[NDArray, NDArray, bool], tuple[NDArray, NDArray | None]]


def _levenberg_marquardt(parts: Parts, x: NDArray[np.float64], y: NDArray[np.float64], w: NDArray[np.float64],
                         theta: NDArray[np.float64], lo: NDArray[np.float64], hi: NDArray[np.float64],
                         iterations: int) -> NDArray[np.float64]:
    """Damped Gauss-Newton per row within box bounds (parameters pinned at a bound drop out of the step, the
    step is clipped to the bounds); rows are independent, and a finished row leaves the working set."""
    out = np.clip(theta, lo, hi)
    idx = np.arange(out.shape[0])
    t, xa, ya, wa, la, ha = out, x, y, w, lo, hi
    lam = np.full(idx.size, 1e-3)
    cur = np.sum(wa * (parts(t, xa, False)[0] - ya) ** 2, axis=1)
    eye = np.eye(4)
    for _ in range(iterations):
        f, jac = parts(t, xa, True)
        jwt = (jac * wa[:, :, None]).transpose(0, 2, 1)
        a = jwt @ jac
        g = (jwt @ (f - ya)[:, :, None])[:, :, 0]
        damp = a + lam[:, None, None] * (np.diagonal(a, axis1=1, axis2=2)[:, :, None] * eye + 1e-12 * eye)
        # a parameter on a bound that the gradient pushes outward stays there; solving for it anyway and
        # clipping afterwards bends the other parameters' step, and the fit stalls short of its optimum
        pinned = ((t <= la) & (g > 0)) | ((t >= ha) & (g < 0))
        free = ~pinned
        damp = damp * (free[:, :, None] & free[:, None, :]) + pinned[:, :, None] * eye
        trial = np.clip(t - _solve(damp, np.where(pinned, 0.0, g)), la, ha)
        new = np.sum(wa * (parts(trial, xa, False)[0] - ya) ** 2, axis=1)
        better = new < cur
        tol = 1e-12 * np.maximum(np.minimum(cur, new), 1e-30)
        # a row is done when its cost stops moving or its damping says no step helps
        done = (lam > 1e8) | (np.abs(cur - new) <= tol)
        t = np.where(better[:, None], trial, t)
        cur = np.where(better, new, cur)
        lam = np.where(better, lam / 3.0, lam * 4.0)
        if done.any():
            out[idx[done]] = t[done]
            keep = ~done
            idx, t, xa, ya, wa, la, ha, lam, cur = (v[keep] for v in (idx, t, xa, ya, wa, la, ha, lam, cur))
            if not idx.size:
                break
    out[idx] = t
    return out


def _by_length(parts: Parts, x: NDArray[np.float64], y: NDArray[np.float64], w: NDArray[np.float64],
               theta: NDArray[np.float64], lo: NDArray[np.float64], hi: NDArray[np.float64],
               iterations: int) -> NDArray[np.float64]:
    """:func:`_levenberg_marquardt` on rows grouped by their own length (up to their last point of positive
    weight, rounded up to 8), each group cut to it. A row's sums then run over its own points only, so its fit
    is the same bits whatever other rows share the call (the search's fits do not depend on the batch)."""
    length = 8 * np.ceil((w.shape[1] - np.argmax((w > 0)[:, ::-1], axis=1)) / 8).astype(int)
    out = np.empty_like(theta)
    for cut in np.unique(length):
        rows = np.flatnonzero(length == cut)
        out[rows] = _levenberg_marquardt(parts, x[rows, :cut], y[rows, :cut], w[rows, :cut], theta[rows], lo[rows],
                                         hi[rows], iterations)
    return out


def sigmoid_refits(
    x: ArrayLike, y: ArrayLike, weights: ArrayLike, theta0: ArrayLike,
    lower: ArrayLike, upper: ArrayLike, iterations: int = 100, a_max: float | None = None, dedupe: bool = True,
) -> NDArray[np.float64]:
    """Weighted least-squares refits of the §7 sigmoid, one per row of ``weights``.

    ``x = log10 C`` and ``y`` are the pooled points (``(points,)``, or one row
    per refit), ``weights`` is ``(refits, points)`` (each point's run count,
    0 for padding), ``theta0`` the full-data estimate ``(R0, A - R0, log10
    C_mid, beta)`` and the bounds those of :func:`rollscale.core.fit.curves.fit_sigmoid`
    (``(4,)`` or one row per refit). Returns ``(refits, 4)`` in the same
    parametrisation; a refit with fewer than 4 distinct x of positive weight
    (no identifiable fit) is NaN. With ``a_max`` (science §8, A1), a refit
    whose A exceeds it is redone with A <= a_max, as ``fit_sigmoid`` does.

    Identical rows (with 3 seeds a key's 200 resamples hold at most 10
    distinct run counts) are fitted once: rows are independent, so this
    changes no result, only the time (``dedupe=False`` skips the search for
    them where the caller knows there are none).
    """
    w_all = np.asarray(weights, float)
    rows = w_all.shape[0]
    per_row = [np.broadcast_to(np.asarray(v, float), shape) for v, shape in (
        (x, w_all.shape), (y, w_all.shape), (theta0, (rows, 4)), (lower, (rows, 4)), (upper, (rows, 4)))]
    if dedupe:
        _, first, inverse = np.unique(np.concatenate([w_all, *per_row], axis=1), axis=0, return_index=True,
                                      return_inverse=True)
    else:
        first = inverse = np.arange(rows)
    w, xv, yv, theta, lo, hi = (a[first] for a in (w_all, *per_row))
    xs = np.sort(np.where(w > 0, xv, np.inf), axis=1)
    with np.errstate(invalid="ignore"):  # inf - inf past the last weighted point
        distinct = np.isfinite(xs[:, 0]) + ((np.diff(xs, axis=1) > 0) & np.isfinite(xs[:, 1:])).sum(axis=1)
    fit_rows = np.flatnonzero(distinct >= 4)  # the others have no identifiable fit: NaN
    # with a_max, a row that starts on the bound (its full-data fit needed it) is fitted bounded at once
    on_bound = theta[fit_rows, 0] + theta[fit_rows, 1] >= a_max - 1e-9 if a_max is not None else fit_rows < 0
    free = fit_rows[~on_bound]
    theta[free] = _by_length(_sigmoid_parts, xv[free], yv[free], w[free], theta[free].copy(), lo[free], hi[free],
                             iterations)
    over = fit_rows[on_bound | (theta[fit_rows, 0] + theta[fit_rows, 1] > a_max)] if a_max is not None \
        else fit_rows[:0]
    if over.size:
        def bounded(t: NDArray[np.float64], xx: NDArray[np.float64], jac: bool) -> tuple[NDArray, NDArray | None]:
            f, d = _sigmoid_parts(to_delta(t, a_max), xx, jac)
            return f, None if d is None else u_jacobian(d, t, a_max)

        lo_u, hi_u = lo[over].copy(), hi[over].copy()
        lo_u[:, 1], hi_u[:, 0], hi_u[:, 1] = 0.0, a_max, 1.0
        theta_u = _by_length(bounded, xv[over], yv[over], w[over], to_u(theta[over], a_max), lo_u, hi_u, iterations)
        theta[over] = to_delta(theta_u, a_max)
    theta[distinct < 4] = np.nan
    return theta[inverse.reshape(-1)]


def linear_inverse_b_refits(b: ArrayLike, s: ArrayLike, weights: ArrayLike) -> NDArray[np.float64]:
    """Weighted refits of ``S = S_min + E_min / B`` (science §7), one per row of ``weights``.

    Returns ``(resamples, 2)`` columns ``(S_min, E_min)``; a resample with
    fewer than 2 distinct B of positive weight is NaN.
    """
    bv, sv = np.asarray(b, float), np.asarray(s, float)
    w = np.asarray(weights, float)
    x = 1.0 / bv
    sw = w.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        mx = (w * x).sum(axis=1) / sw
        my = (w * sv).sum(axis=1) / sw
        sxx = (w * (x - mx[:, None]) ** 2).sum(axis=1)
        sxy = (w * (x - mx[:, None]) * (sv - my[:, None])).sum(axis=1)
        e_min = sxy / sxx
        s_min = my - e_min * mx
    distinct = np.array([np.unique(bv[row > 0]).size for row in w])
    out = np.column_stack([s_min, e_min])
    out[distinct < 2] = np.nan
    return out


def weighted_means(values: ArrayLike, weights: ArrayLike) -> NDArray[np.float64]:
    """Mean of per-run ``values`` under each resample's run counts; NaN values are left out."""
    v = np.asarray(values, float)
    w = np.asarray(weights, float) * np.isfinite(v)[None, :]
    with np.errstate(invalid="ignore", divide="ignore"):
        return (w * np.nan_to_num(v)).sum(axis=1) / w.sum(axis=1)
