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

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.special import expit
from scipy.stats import norm
from scipy.stats import t as student_t

from rollscale.core.sigmoid import to_delta, to_u, u_jacobian

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
    tail = 100.0 * float(norm.cdf(-math.sqrt(seeds / (seeds - 1)) * student_t.ppf(0.5 + level / 2, seeds - 1)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-failed column is NaN, which is what we report
        lo, hi = np.nanpercentile(a, [tail, 100.0 - tail], axis=axis, method="linear")
    return lo, hi


def interval_note(seeds: int, resamples: int) -> str:
    """The ``interval`` column: how an interval was made, or why there is none."""
    if seeds < 2:
        return ONE_SEED
    if resamples < 1:
        return "no bootstrap (fit.bootstrap_resamples = 0)"
    return f"bootstrap over runs: {seeds}+ seeds per config, {resamples} resamples, 95 %"


# ---------------------------------------------------------------------------
# vectorised refits


def _sigmoid_parts(theta: NDArray[np.float64], x: NDArray[np.float64]) -> tuple[NDArray, NDArray]:
    r0, delta, m, beta = (theta[:, i : i + 1] for i in range(4))
    s = expit(beta * _LN10 * (x - m))
    f = r0 + delta * s
    ds = delta * s * (1.0 - s) * _LN10
    jac = np.stack([np.ones_like(s), s, -ds * beta, ds * (x - m)], axis=-1)
    return f, jac


def _levenberg_marquardt(parts: Callable[[NDArray, NDArray], tuple[NDArray, NDArray]], x: NDArray[np.float64],
                         y: NDArray[np.float64], w: NDArray[np.float64], theta: NDArray[np.float64],
                         lo: NDArray[np.float64], hi: NDArray[np.float64], iterations: int) -> NDArray[np.float64]:
    """Damped Gauss-Newton per row, each step clipped to the bounds; rows are independent."""
    rows = theta.shape[0]
    theta = np.clip(theta, lo, hi)
    lam = np.full(rows, 1e-3)

    def cost_rows(t: NDArray[np.float64], idx: NDArray[np.int64]) -> NDArray[np.float64]:
        f, _ = parts(t, x[idx])
        return np.sum(w[idx] * (f - y[idx]) ** 2, axis=1)

    active = np.arange(rows)
    current = cost_rows(theta, active)
    eye = np.eye(4)
    for _ in range(iterations):
        t, wa = theta[active], w[active]
        f, jac = parts(t, x[active])
        jwt = (jac * wa[:, :, None]).transpose(0, 2, 1)
        a = jwt @ jac
        g = (jwt @ (f - y[active])[:, :, None])[:, :, 0]
        damp = a + lam[active, None, None] * (np.diagonal(a, axis1=1, axis2=2)[:, :, None] * eye + 1e-12 * eye)
        trial = np.clip(t - np.linalg.solve(damp, g[:, :, None])[:, :, 0], lo[active], hi[active])
        new = cost_rows(trial, active)
        better = new < current[active]
        gain = np.where(better, current[active] - new, 0.0)
        theta[active[better]], current[active[better]] = trial[better], new[better]
        lam[active] = np.where(better, lam[active] / 3.0, lam[active] * 4.0)
        # a row is done when its cost stops moving or its damping says no step helps
        done = (lam[active] > 1e8) | (better & (gain <= 1e-12 * np.maximum(current[active], 1e-30)))
        active = active[~done]
        if active.size == 0:
            break
    return theta


def sigmoid_refits(
    x: ArrayLike, y: ArrayLike, weights: ArrayLike, theta0: ArrayLike,
    lower: ArrayLike, upper: ArrayLike, iterations: int = 100, a_max: float | None = None,
) -> NDArray[np.float64]:
    """Weighted least-squares refits of the §7 sigmoid, one per row of ``weights``.

    ``x = log10 C`` and ``y`` are the pooled points (``(points,)``, or one row
    per refit), ``weights`` is ``(refits, points)`` (each point's run count,
    0 for padding), ``theta0`` the full-data estimate ``(R0, A - R0, log10
    C_mid, beta)`` and the bounds those of :func:`rollscale.core.fit.fit_sigmoid`
    (``(4,)`` or one row per refit). Returns ``(refits, 4)`` in the same
    parametrisation; a refit with fewer than 4 distinct x of positive weight
    (no identifiable fit) is NaN. With ``a_max`` (science §8, A1), a refit
    whose A exceeds it is redone with A <= a_max, as ``fit_sigmoid`` does.

    Identical rows (with 3 seeds a key's 200 resamples hold at most 10
    distinct run counts) are fitted once: rows are independent, so this
    changes no result, only the time.
    """
    w_all = np.asarray(weights, float)
    rows = w_all.shape[0]
    per_row = [np.broadcast_to(np.asarray(v, float), shape) for v, shape in (
        (x, w_all.shape), (y, w_all.shape), (theta0, (rows, 4)), (lower, (rows, 4)), (upper, (rows, 4)))]
    _, first, inverse = np.unique(np.concatenate([w_all, *per_row], axis=1), axis=0, return_index=True,
                                  return_inverse=True)
    w, xv, yv, theta, lo, hi = (a[first] for a in (w_all, *per_row))
    theta = _levenberg_marquardt(_sigmoid_parts, xv, yv, w, theta.copy(), lo, hi, iterations)
    over = np.flatnonzero(theta[:, 0] + theta[:, 1] > a_max) if a_max is not None else np.array([], int)
    if over.size:
        def bounded(t: NDArray[np.float64], xx: NDArray[np.float64]) -> tuple[NDArray, NDArray]:
            f, jac = _sigmoid_parts(to_delta(t, a_max), xx)
            return f, u_jacobian(jac, t, a_max)

        lo_u, hi_u = lo[over].copy(), hi[over].copy()
        lo_u[:, 1], hi_u[:, 0], hi_u[:, 1] = 0.0, a_max, 1.0
        theta_u = _levenberg_marquardt(bounded, xv[over], yv[over], w[over], to_u(theta[over], a_max), lo_u, hi_u,
                                       iterations)
        theta[over] = to_delta(theta_u, a_max)
    xs = np.sort(np.where(w > 0, xv, np.inf), axis=1)
    with np.errstate(invalid="ignore"):  # inf - inf past the last weighted point
        distinct = np.isfinite(xs[:, 0]) + ((np.diff(xs, axis=1) > 0) & np.isfinite(xs[:, 1:])).sum(axis=1)
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
