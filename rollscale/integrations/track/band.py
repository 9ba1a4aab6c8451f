"""The study's forecast band for the production run: its key's reward at every C up to C* (science §9.3).

:func:`study_band` refits the decision group's runs at their shared R0 exactly as the fit stage's decision
does (:func:`rollscale.core.fit.decision.fit_groups`) and reads the key's reward at each C with the pooled
t-interval of :func:`rollscale.core.fit.decision.key_rewards`, so at C* the band is the ``decision`` table's
``reward [reward_lo, reward_hi]``. Where the decision at C* is the forecast's (C* past the study's data,
science §10.2; the ``decision`` table's ``source``), :func:`forecast_band` reads the key off the same surface the
fit stage fitted (:func:`rollscale.core.fit.forecast.bootstrap_surface`, the study's settings), so that at C* the
band is again the decision's. Another forecast: anything that returns a :class:`Band` (its C grid, reward, bounds
and what it comes from); the tracker reads only :meth:`Band.at`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.stats import t as student_t

from rollscale.core.fit.bootstrap import LEVEL
from rollscale.core.fit.decision import fit_groups, key_rewards
from rollscale.core.fit.backtest import calibrated
from rollscale.core.fit.forecast import ForecastSettings, bootstrap_surface, interval, predict, spread
from rollscale.core.fit.tables import REWARD_MAX, DesignGroup, design_groups

__all__ = ["Band", "forecast_band", "study_band"]

GRID_POINTS = 96


@dataclass(frozen=True)
class Band:
    """A forecast of the production run's reward: ``reward`` and its ``lo`` / ``hi`` bounds at the rollouts ``c``
    (increasing, up to C*); ``source`` says where it comes from."""

    c: np.ndarray
    reward: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    source: str

    def at(self, c: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(reward, lo, hi) at ``c``, interpolated in log C; NaN outside the band's range of C."""
        c = np.asarray(c, float)
        x, inside = np.log(np.clip(c, 1e-300, None)), (c >= self.c[0] * (1 - 1e-9)) & (c <= self.c[-1] * (1 + 1e-9))
        grid = np.log(self.c)
        return tuple(np.where(inside, np.interp(x, grid, v), np.nan) for v in (self.reward, self.lo, self.hi))

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame({"c": self.c, "forecast": self.reward, "forecast_lo": self.lo, "forecast_hi": self.hi})


def _group(evals: pd.DataFrame, design: str, bucket: str, rule: str, fixed: str) -> DesignGroup:
    groups = [g for g in design_groups(evals, design)[0] if (g.bucket, g.rule, g.fixed) == (bucket, rule, fixed)]
    if not groups:
        raise LookupError(f"the study's evaluations have no decision group {design} / {bucket} / {rule} / {fixed} "
                          "(the sweep's runs changed since the fit stage ran? run it again)")
    return groups[0]


def _grid(rows: pd.DataFrame, c_star: float, points: int) -> np.ndarray:
    """C from the group's first evaluation past step 0 to C*, log-spaced."""
    start = float(rows.loc[rows["c"] > 0, "c"].min())
    return np.unique(np.geomspace(min(start, c_star), c_star, points))


def forecast_band(evals: pd.DataFrame, design: str, bucket: str, rule: str, fixed: str, key: int, c_star: float,
                  settings: ForecastSettings, points: int = GRID_POINTS) -> Band:
    """The band of ``key`` read off its group's forecast surface (science §10.2) up to ``c_star``, with the refits'
    interval as the ``forecast`` table has it (``settings``: the fit stage's)."""
    g = _group(evals, design, bucket, rule, fixed)
    boot = bootstrap_surface(g.rows, g.key_col, settings.at_answer(g.rows, c_star))
    boot = calibrated(boot, g.rows, g.key_col, c_star)[0]  # science §11.4
    grid = _grid(g.rows, c_star, points)
    point, refits = predict(boot, np.full(grid.size, key), grid)
    top = settings.a_max if settings.a_max is not None else math.inf
    lo, hi = interval(point, refits, spread(boot), settings.level, (0.0, top))
    return Band(grid, point, lo, hi, f"the study's forecast of key {key} ({design} / {rule} / {fixed}; science "
                                     f"§10.2): one surface over the group's {boot.data.keys.size} keys, "
                                     f"{settings.resamples} refits, {settings.level:.0%} interval")


def study_band(evals: pd.DataFrame, design: str, bucket: str, rule: str, fixed: str, key: int, c_star: float,
               level: float = LEVEL, points: int = GRID_POINTS) -> Band:
    """The band of ``key`` in its decision group (``evals``: :func:`rollscale.core.fit.analysis.run_evals`'s
    table of the study's runs) from the group's first evaluation past step 0 to ``c_star`` (science §9.3)."""
    g = _group(evals, design, bucket, rule, fixed)
    curves = fit_groups(g.rows.assign(_group=0, _key=g.rows[g.key_col]), "_key", "_group", REWARD_MAX)[0]
    grid = _grid(g.rows, c_star, points)
    reward, lo, hi = (np.full(grid.size, math.nan) for _ in range(3))
    for i, c in enumerate(grid):
        est = key_rewards(curves, float(c))
        where = np.flatnonzero(est.keys == key)
        if not where.size:
            continue
        j = int(where[0])
        half = float(student_t.ppf(0.5 + level / 2, est.df)) * math.sqrt(est.var[j]) if est.df else math.nan
        reward[i], lo[i], hi[i] = est.reward[j], est.reward[j] - half, min(est.reward[j] + half, REWARD_MAX)
    if not np.isfinite(reward).any():
        raise LookupError(f"decision group {design} / {bucket} / {rule} / {fixed}: key {key} has no fitted curve "
                          "(each run needs 4 evaluations past step 0)")
    return Band(grid, reward, lo, hi, f"the study's §9.3 fit of key {key} ({design} / {rule} / {fixed}): "
                                      f"{int(curves.key[curves.key == key].size)} runs, {level:.0%} t-interval")
