"""Many §7 sigmoids and their bootstrap refits at once: the engine of the frontier search (science §7, §8).

The fit stage fits one key at a time (:func:`rollscale.core.fit.curves.fit_sigmoid`,
scipy, about 20 ms a key); the search refits every key of every group after
every rung, and its simulation (:mod:`rollscale.core.search.simulate`) does that for
hundreds of studies. :func:`fit_curves` does the same science batched:

* record-breaking points per run (:func:`rollscale.core.fit.curves.record_flags`, the
  fit stage's rule), pooled per (group, key): one *curve*;
* the point fit of each curve from :func:`rollscale.core.fit.curves.sigmoid_starts`'
  nine starts within :func:`rollscale.core.fit.curves.sigmoid_bounds`, all starts of
  all curves in one :func:`rollscale.core.fit.bootstrap.sigmoid_refits` call (unit
  weights), keeping the start of least squared error, with A <= ``a_max``
  (science §8, A1) as the fit stage has it;
* the bootstrap over seeds: each curve's runs resampled with replacement
  (:class:`rollscale.core.fit.bootstrap.Bootstrap`, one independent stream per
  (group, key) as text, so adding a key or a seed leaves the others' draws alone) and
  refitted from the point fit, every distinct resample of every curve in one
  call.

A curve with fewer than 4 record points at 4 distinct C has no fit: NaN
parameters and refits, and a ``status`` in the fit stage's words.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from rollscale.core.fit import curves as fit
from rollscale.core.fit.bootstrap import Bootstrap, sigmoid_refits
from rollscale.core.fit.columns import require
from rollscale.core.fit.least_squares import too_few_points
from rollscale.core.fit.frontier import asymptote_upper

__all__ = ["POINT_COLUMNS", "CurveBank", "fit_curves"]

POINT_COLUMNS = ("group", "key", "run_id", "seed", "c", "avg_at_k")
# steps every start of a point fit takes before only the best start of each curve goes on: on 240 simulated
# curves the result matched fit_sigmoid's least squares within 1e-5 (relative), in 40 % less time than
# taking every start to convergence
SCOUT = 20


@dataclass(frozen=True)
class CurveBank:
    """Fitted curves: ``curves`` rows (group, key, runs, c_seen, n_points, status, c_low) with parameters and refits.

    ``theta`` is ``(curves, 4)`` and ``refits`` ``(curves, resamples, 4)`` in
    the parametrisation ``(R0, A - R0, log10 C_mid, beta)``; ``runs`` counts
    the curve's runs (seeds), ``c_seen`` is the largest C of any evaluation of
    them (record or not), ``c_low`` the smallest C > 0 of a record point.
    """

    curves: pd.DataFrame
    theta: NDArray[np.float64]
    refits: NDArray[np.float64]
    a_max: float | None = None  # A1's bound the fits were made under

    def index(self, group: object) -> NDArray[np.int64]:
        """Row numbers of ``group``'s curves, in key order."""
        if "_rows" not in self.__dict__:  # built once: a decision looks up every group
            rows = pd.Series(np.arange(len(self.curves))).groupby(self.curves["group"].to_numpy()).apply(np.asarray)
            object.__setattr__(self, "_rows", rows.to_dict())
        return self.__dict__["_rows"].get(group, np.array([], int))

    def predict(self, rows: NDArray[np.int64], c: NDArray[np.float64]) -> NDArray[np.float64]:
        """Point predictions, ``(rows, budgets)``."""
        return fit.sigmoid_model(self.theta[rows].T[..., None], np.log10(c))

    def predict_refits(self, rows: NDArray[np.int64], c: NDArray[np.float64]) -> NDArray[np.float64]:
        """Predictions under every refit, ``(rows, resamples, budgets)``."""
        return fit.sigmoid_model(np.moveaxis(self.refits[rows], 2, 0)[..., None], np.log10(c))

    def a_upper(self, rows: NDArray[np.int64], level: float, eta: float = 1.0) -> NDArray[np.float64]:
        """Upper bound of each curve's asymptote (:func:`rollscale.core.fit.frontier.asymptote_upper`)."""
        c = self.curves
        return asymptote_upper(self.refits[rows], c["c_seen"].to_numpy(float)[rows], c["runs"].to_numpy(int)[rows],
                               level, self.a_max, eta)


def _padded(values: NDArray, curve: NDArray[np.int64], pos: NDArray[np.int64], shape: tuple[int, int],
            fill: float) -> NDArray[np.float64]:
    out = np.full(shape, fill, float)
    out[curve, pos] = values
    return out


def _point_fits(x: NDArray, y: NDArray, mask: NDArray, ok: NDArray, a_max: float | None) -> NDArray[np.float64]:
    """Least-squares fits of the curves ``ok`` from the fit stage's nine starts; NaN elsewhere."""
    theta = np.full((x.shape[0], 4), np.nan)
    rows = np.flatnonzero(ok)
    if not rows.size:
        return theta
    starts, lower, upper = [], [], []
    for i in rows:
        xi, yi = x[i, mask[i]], y[i, mask[i]]
        lo, hi = fit.sigmoid_bounds(xi)
        starts += fit.sigmoid_starts(xi, yi)
        lower += [lo] * 9
        upper += [hi] * 9
    rep = np.repeat(rows, 9)
    w = mask[rep].astype(float)
    lower, upper = np.array(lower), np.array(upper)
    # every start SCOUT steps, then the best start of each curve to convergence (most of the time is the slow
    # crawl of starts that end worse, along an unbent curve's valley)
    est = sigmoid_refits(x[rep], y[rep], w, np.array(starts), lower, upper, a_max=a_max, iterations=SCOUT,
                         dedupe=False)
    f = fit.sigmoid_model(est.T[..., None], x[rep])  # (curves * 9, points)
    cost = np.where(np.isnan(f).any(axis=1), np.inf, np.sum(w * (np.nan_to_num(f) - y[rep]) ** 2, axis=1))
    best = np.arange(rows.size) * 9 + np.argmin(cost.reshape(-1, 9), axis=1)
    theta[rows] = sigmoid_refits(x[rows], y[rows], w[best], est[best], lower[best], upper[best], a_max=a_max,
                                 dedupe=False)
    return theta


def fit_curves(points: pd.DataFrame, bin_width: float, boot: Bootstrap, a_max: float | None = None,
               cache: dict | None = None) -> CurveBank:
    """Record points, point fit and bootstrap refits of every (group, key) curve of ``points`` (module docstring).

    ``points`` has :data:`POINT_COLUMNS`: one row per evaluation of a run
    (``run_id`` unique within its group; ``key`` n, B_problem or a rule).
    Curves come out sorted by group and key. A curve's fit depends on its own
    points only (not on the other curves of the call), so ``cache`` (a dict
    the caller keeps between calls) can hand back the fit of a curve whose
    record points, runs and settings are unchanged: the same numbers, sooner.
    """
    require(points, "points", POINT_COLUMNS)
    if not (np.isfinite(bin_width) and bin_width > 0):
        raise ValueError(f"bin_width: expected a positive number, got {bin_width!r}")
    pts = points.sort_values(["group", "key", "run_id", "c"], kind="stable").reset_index(drop=True)
    run = pd.MultiIndex.from_frame(pts[["group", "run_id"]]).factorize()[0]
    pts["record"] = fit.record_flags(run, pts["avg_at_k"].to_numpy(float), bin_width)
    curve_of = pts.groupby(["group", "key"], sort=True)
    curves = curve_of.agg(runs=("run_id", "nunique"), c_seen=("c", "max")).reset_index()
    rec = pts[pts["record"] & (pts["c"] > 0)].copy()
    k = len(curves)
    rec["curve"] = pd.MultiIndex.from_frame(curves[["group", "key"]]).get_indexer(
        pd.MultiIndex.from_frame(rec[["group", "key"]]))
    rec["pos"] = rec.groupby("curve").cumcount()
    width = max(int(rec["pos"].max()) + 1 if len(rec) else 1, 1)
    cv, pos = rec["curve"].to_numpy(), rec["pos"].to_numpy()
    x = _padded(np.log10(rec["c"].to_numpy(float)), cv, pos, (k, width), 0.0)
    y = _padded(rec["avg_at_k"].to_numpy(float), cv, pos, (k, width), 0.0)
    mask = _padded(np.ones(len(rec)), cv, pos, (k, width), 0.0) > 0
    pair = pd.MultiIndex.from_arrays([cv, rec["run_id"].to_numpy()]).factorize()[0]  # increasing: rows are sorted
    run_in_curve = pair - pd.Series(pair).groupby(cv).transform("min").to_numpy()
    owner = _padded(run_in_curve, cv, pos, (k, width), 0).astype(int)
    n_points = mask.sum(axis=1)
    status = np.array([too_few_points(x[i, mask[i]], fit.SIGMOID_MIN_POINTS) or "ok" for i in range(k)], object)
    ok = status == "ok"
    low = rec.groupby("curve")["c"].min()
    curves = curves.assign(n_points=n_points, status=status, c_low=low.reindex(range(k)).to_numpy(float))
    ids = [(str(g), str(key), int(r), x[i, mask[i]].tobytes(), y[i, mask[i]].tobytes(), owner[i, mask[i]].tobytes(),
            boot.resamples, boot.seed, a_max)
           for i, (g, key, r) in enumerate(zip(curves["group"], curves["key"], curves["runs"], strict=True))]
    known = np.array([cache is not None and ids[i] in cache for i in range(k)], bool)
    todo = ok & ~known
    theta = _point_fits(x, y, mask, todo, a_max)
    refits = _refits(curves, x, y, mask, owner, theta, todo, boot, a_max)
    for i in np.flatnonzero(known):
        theta[i], refits[i] = cache[ids[i]]  # type: ignore[index]
    if cache is not None:
        cache.update({ids[i]: (theta[i].copy(), refits[i].copy()) for i in np.flatnonzero(todo)})
    return CurveBank(curves, theta, refits, a_max)


def _refits(curves: pd.DataFrame, x: NDArray, y: NDArray, mask: NDArray, owner: NDArray, theta: NDArray,
            ok: NDArray, boot: Bootstrap, a_max: float | None) -> NDArray[np.float64]:
    """``(curves, resamples, 4)``: each curve's runs resampled within the curve, each distinct resample refitted."""
    out = np.full((len(curves), boot.resamples, 4), np.nan)
    if not boot.resamples:
        return out
    weights, which, inverse, lower, upper = [], [], [], [], []
    groups, keys, runs = (curves[c].to_numpy() for c in ("group", "key", "runs"))
    for i in np.flatnonzero(ok):
        salt = zlib.crc32(repr((str(groups[i]), str(keys[i]))).encode())
        counts = boot.run_counts(np.zeros(int(runs[i])), salt=salt)
        distinct, inv = np.unique(counts, axis=0, return_inverse=True)
        weights.append(distinct[:, owner[i]] * mask[i])
        which += [i] * len(distinct)
        inverse.append((i, len(which) - len(distinct) + inv.reshape(-1)))
        lo, hi = fit.sigmoid_bounds(x[i, mask[i]])
        lower += [lo] * len(distinct)
        upper += [hi] * len(distinct)
    if not which:
        return out
    idx = np.asarray(which)
    est = sigmoid_refits(x[idx], y[idx], np.vstack(weights).astype(float), theta[idx], np.array(lower),
                         np.array(upper), a_max=a_max, dedupe=False)  # each curve's resamples are distinct already
    for i, rows in inverse:
        out[i] = est[rows]
    return out
