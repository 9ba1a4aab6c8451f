"""A bound without a model on how far a key can still climb (science §10.4).

``s_max``, the steepest rise of reward per doubling of C in the group, from the evaluations: per key, its runs'
evaluations averaged at each C (runs of a key share their evaluation budgets), and over every window of one
doubling ``[c, 2c]`` holding at least :data:`WINDOW_POINTS` of them, the least-squares slope of reward on
``log2 C``; ``s_max`` is the largest such slope over keys and windows. Why not the rise between two evaluations:
each holds evaluation noise (sd 0.0125 at avg@16 over 100 problems, R near 0.5), so a difference of neighbours a
quarter doubling apart carries a slope noise of 0.07 per doubling, as much as the steepest true rises of the
simulated families (0.03-0.11 per doubling), and its maximum over a study's pairs measures the noise. A window's
slope averages its points (noise 0.016 a doubling for one run's five points, 0.011 for two seeds' mean); the
maximum over windows still errs upwards (a looser cap, never a wrong stop), and a window's average slope is
2-4 % below the steepest instantaneous one for the sigmoids' beta of 1-2.

The cap: ``R_k(C*) <= R_k_hi(c) + s_max log2(C* / c)`` with ``c`` the budget all of k's runs reached and
``R_k_hi(c)`` the upper bound of its per-run §9.3 value there (the runs' own sigmoids, A1 only). Every key's
reward rises with C (A1), so a key's lower bound at the budget it reached (or at C* if less) is a floor for
its reward at C*: key k **cannot catch up** when its cap is below the best other key's floor minus epsilon.
No surface, no A4.

A key still **accelerating** where its data end (science §11.2-11.3): its rise per doubling over its last
doubling above the one before, beyond noise (:func:`acceleration`, z > :data:`ACCELERATION_Z`), keeps that growth
in its upper bound at C* (:func:`accelerating_rise`), each doubling's rise the last one's times the growth seen
(at most :data:`GROWTH_MAX`). Measured on simulated curves whose midpoints lie past C_max (every key convex in
log C there): even the true curve family, a sigmoid per key fitted to every run to C_max, names the best key at
4 x C_max in 46-71 % of studies and settles almost none (0-4 %), so such a key is open, not settled on a forecast
that continues its last rise (docs/journal/2026-11-29-acceleration.md). One key's test reads a slope to about 0.02
a doubling, as large as the growth it looks for, so where the group's keys pooled accelerate beyond noise
(:func:`group_accelerating`) every key whose rise grows keeps its growth too (docs/journal/2026-11-29-pooled.md).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import pandas as pd
from scipy.stats import t as student_t

from rollscale.core.fit.decision import RunCurves, fit_runs, key_rewards

__all__ = ["ACCELERATION_Z", "CAP_COLUMNS", "GROWTH_MAX", "WINDOW_POINTS", "Acceleration", "accelerating_rise",
           "acceleration", "climb_caps", "group_accelerating", "steepest_rise"]

WINDOW_POINTS = 3
# the growth of the rise per doubling read beyond noise: one-sided, 2.3 % by chance nominally; measured up to 8 % for a
# key whose two runs give five budgets a doubling (the scatter about the lines then has few degrees of freedom)
ACCELERATION_Z = 2.0
GROWTH_MAX = 2.0  # the rise per doubling at most doubles each doubling in the bound (a sigmoid's lower tail: 2^beta)
CAP_COLUMNS = ["key", "c", "reward_lo", "reward_hi", "s_max", "cap", "best_floor", "cannot_catch_up"]


def _mean_curve(rows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(log2 C, reward) of one key's runs averaged at each budget past step 0 (its runs share their budgets)."""
    mean = rows[rows["c"] > 0].groupby("c")["avg_at_k"].mean()
    return np.log2(mean.index.to_numpy(float)), mean.to_numpy(float)


def steepest_rise(evals: pd.DataFrame, key_col: str, beyond: float | None = None) -> float:
    """``s_max`` of the module docstring (NaN when no window holds enough evaluations). ``beyond``: only windows
    that reach a quarter doubling or more past that budget (a key's continuation past its own data, science
    §11.3)."""
    best = math.nan
    for _, rows in evals.groupby(key_col):
        x, y = _mean_curve(rows)
        for i in range(x.size):
            on = (x >= x[i]) & (x <= x[i] + 1.0 + 1e-9)
            if on.sum() < WINDOW_POINTS or (beyond is not None and x[on].max() < math.log2(beyond) + 0.25):
                continue
            slope = float(np.polyfit(x[on], y[on], 1)[0])
            best = slope if not math.isfinite(best) else max(best, slope)
    return best


class Acceleration(NamedTuple):
    """A key's rise per doubling over the doubling before its last (``before``) and its last (``last``), and the
    standard error of their difference (``se``, the residual scatter about both lines, the runs' mean at each
    budget)."""

    before: float
    last: float
    se: float

    @property
    def z(self) -> float:
        return (self.last - self.before) / self.se if self.se > 0 else 0.0

    @property
    def accelerating(self) -> bool:
        return self.last > 0 and self.z > ACCELERATION_Z


def group_accelerating(accs: list[Acceleration | None]) -> bool:
    """Whether a group's keys, pooled, still accelerate where their data end: the summed growth of their rise per
    doubling over its standard error above :data:`ACCELERATION_Z`. One key's test, on two seeds' five budgets a
    doubling, reads a slope to about 0.02 a doubling, as large as the growth it looks for: in simulated `rising`
    (every key convex in log C at C_max) it read 0-2 of 4 keys per study while every one accelerated."""
    seen = [a for a in accs if a is not None and a.se > 0]
    pooled = Acceleration(sum(a.before for a in seen), sum(a.last for a in seen),
                          math.sqrt(sum(a.se**2 for a in seen)))  # the keys' slopes summed: one reading, its z
    return pooled.z > ACCELERATION_Z


def acceleration(rows: pd.DataFrame, c_end: float) -> Acceleration | None:
    """One key's :class:`Acceleration` where its data end at ``c_end`` (``rows``: its evaluations, ``c`` and
    ``avg_at_k``); None where either doubling holds fewer than :data:`WINDOW_POINTS` budgets."""
    x, y = _mean_curve(rows[rows["c"] <= c_end * (1 + 1e-3)])
    end = math.log2(c_end)
    slopes, spread, rss, dof = [], [], 0.0, 0
    for a, b in ((end - 2, end - 1), (end - 1, end)):
        on = (x >= a - 1e-9) & (x <= b + 1e-9)
        if on.sum() < WINDOW_POINTS:
            return None
        xc, yc = x[on] - x[on].mean(), y[on] - y[on].mean()
        slope = float(xc @ yc / (xc @ xc))
        resid = yc - slope * xc
        slopes.append(slope)
        spread.append(float(xc @ xc))
        rss, dof = rss + float(resid @ resid), dof + int(on.sum()) - 2
    return Acceleration(slopes[0], slopes[1], math.sqrt(rss / max(dof, 1) * (1 / spread[0] + 1 / spread[1])))


def accelerating_rise(acc: Acceleration, doublings: float) -> float:
    """The rise over ``doublings`` past the data of a key that keeps accelerating: each doubling's rise the last
    one's times the growth seen (``last / before``, in [1, :data:`GROWTH_MAX`])."""
    growth = min(max(acc.last / acc.before, 1.0), GROWTH_MAX) if acc.before > 0 else GROWTH_MAX
    if growth <= 1 + 1e-9:
        return acc.last * doublings
    return acc.last * (growth**doublings - 1) / math.log(growth)


def climb_caps(evals: pd.DataFrame, key_col: str, c_star: float, tolerance: float, level: float = 0.95,
               a_max: float | None = 1.0, curves: RunCurves | None = None) -> pd.DataFrame:
    """One row per key (:data:`CAP_COLUMNS`): its bounds where its runs reached (or at C*), the cap at C*, the best
    other key's floor and whether the key cannot catch up (module docstring). ``curves``: the runs' fits of
    ``evals`` (:func:`rollscale.core.fit.decision.fit_runs`) when the caller has them."""
    s_max = steepest_rise(evals, key_col)
    curves = curves if curves is not None else fit_runs(evals, key_col, a_max)
    reach = evals.groupby("run_id")["c"].max()
    run_key = evals.drop_duplicates("run_id").set_index("run_id")[key_col]
    rows = []
    for k in sorted(run_key.unique()):
        c = min(float(reach[run_key.index[run_key == k]].min()), float(c_star))
        est = key_rewards(curves, c)
        j = np.flatnonzero(est.keys == k)
        q = float(student_t.ppf(0.5 + level / 2, est.df)) if est.df else math.nan
        r, half = (est.reward[j[0]], q * math.sqrt(est.var[j[0]])) if j.size else (math.nan, math.nan)
        rise = max(s_max, 0.0) * math.log2(c_star / c) if math.isfinite(s_max) else math.inf
        cap = min(r + half + rise, a_max if a_max is not None else math.inf)
        rows.append({"key": int(k), "c": c, "reward_lo": r - half, "reward_hi": r + half, "s_max": s_max, "cap": cap})
    out = pd.DataFrame(rows)
    floors = out["reward_lo"].to_numpy(float)
    best = []
    for i in range(len(out)):
        others = np.delete(floors, i)
        others = others[np.isfinite(others)]
        best.append(float(others.max()) if others.size else math.nan)
    out["best_floor"] = best
    # NaN bounds (a key without a fit) compare False: such a key is never stopped by the cap
    out["cannot_catch_up"] = out["cap"] < out["best_floor"] - tolerance
    return out[CAP_COLUMNS]
