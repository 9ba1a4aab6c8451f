"""Frontier analysis fits (science §7): record points, the sigmoid per n, S(B), the CRS check.

The sigmoid lives in :mod:`rollscale.core.fit.sigmoid` (re-exported here).

Pure functions on numpy / pandas; bounded fits use ``scipy.optimize.curve_fit``
(:mod:`rollscale.core.fit.least_squares`). Every fit returns a small frozen dataclass
with the parameters, their least-squares standard errors (``_se``: curve_fit's
covariance, derived quantities by the delta method; NaN with no residual
degree of freedom), ``r2``, ``n_points``, ``status`` (``"ok"`` or a reason
such as ``"too few points (3 < 4)"``), a ``predict`` method and ``to_dict()``
giving one flat table row. A fit that cannot be made is not an exception: it
comes back with NaN parameters and the reason. The least-squares SEs treat
pooled record points as independent and understate the error; the intervals
to quote are the bootstrap's over seeds (:mod:`rollscale.core.fit.bootstrap`).
The frontier and n*(C) live in :mod:`rollscale.core.fit.frontier`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike, NDArray

from rollscale.core.fit.least_squares import best_curve_fit, positive, r2, same_length, se, too_few, vector
from rollscale.core.fit.sigmoid import (
    SIGMOID_MIN_POINTS,
    SigmoidFit,
    fit_sigmoid,
    sigmoid_bounds,
    sigmoid_model,
    sigmoid_starts,
    to_delta,
    to_u,
    u_jacobian,
)

__all__ = [
    "SIGMOID_MIN_POINTS",
    "CrsPrediction",
    "SigmoidFit",
    "StepsToTargetFit",
    "fit_sigmoid",
    "fit_steps_to_target",
    "predicted_vs_observed_best_n",
    "record_breaking_points",
    "record_flags",
    "reward_bins",
    "sigmoid_bounds",
    "sigmoid_model",
    "sigmoid_starts",
    "steps_to_target",
    "to_delta",
    "to_u",
    "u_jacobian",
]

# Relative tolerance under which reward / bin_width counts as sitting exactly on
# a bin edge: 0.3 / 0.1 == 2.9999999999999996 must land in bin 3, not bin 2.
_BIN_EDGE_RTOL = 1e-9

STEPS_MIN_DISTINCT_B = 3  # two parameters, plus one degree of freedom


# ---------------------------------------------------------------------------
# record-breaking points


def reward_bins(reward: ArrayLike, bin_width: float) -> NDArray[np.float64]:
    """``floor(reward / bin_width)``, with a ratio within a relative 1e-9 of an integer taken as that integer."""
    ratio = np.asarray(reward, float) / bin_width
    nearest = np.rint(ratio)
    on_edge = np.isclose(ratio, nearest, rtol=_BIN_EDGE_RTOL, atol=_BIN_EDGE_RTOL)
    return np.where(on_edge, nearest, np.floor(ratio))


def record_flags(runs: ArrayLike, reward: ArrayLike, bin_width: float) -> NDArray[np.bool_]:
    """Record-breaking rows of many runs at once (science §7; :func:`record_breaking_points` per run).

    Rows are grouped by ``runs`` (each run's rows in increasing compute, runs
    in any order); a row is a record when its reward bin is higher than every
    earlier row's of its run.
    """
    bins = pd.Series(reward_bins(reward, bin_width))
    earlier = bins.groupby(np.asarray(runs), sort=False).cummax().groupby(np.asarray(runs), sort=False).shift(1)
    return (earlier.isna() | (bins > earlier)).to_numpy(bool)


def record_breaking_points(compute: ArrayLike, reward: ArrayLike, bin_width: float) -> list[int]:
    """Indices of a run's record-breaking evaluations (science §7).

    Rows are the run's evaluations in increasing compute. Reward is bucketed
    into bins ``floor(reward / bin_width)``; a row is kept when its bin is
    higher than every earlier row's (so the first row always is, and of a run
    of rows in one new bin only the first). A ratio within a relative 1e-9 of
    an integer counts as that integer, so 0.3 with bin 0.1 is bin 3.

    Raises ValueError for non-positive ``bin_width``, unequal lengths,
    non-finite values, or compute that decreases.
    """
    c = vector("compute", compute)
    r = vector("reward", reward)
    same_length(compute=c, reward=r)
    if not (math.isfinite(bin_width) and bin_width > 0):
        raise ValueError(f"bin_width: expected a positive finite number, got {bin_width!r}")
    if np.any(np.diff(c) < 0):
        raise ValueError("compute: expected the evaluations in non-decreasing compute order")
    return np.flatnonzero(record_flags(np.zeros(len(r)), r, bin_width)).tolist()


# ---------------------------------------------------------------------------
# steps to target (critical batch size)


def steps_to_target(steps: ArrayLike, reward: ArrayLike, target: float) -> int | None:
    """First step whose validation reward is >= target, or None if never (science §7, S(B)).

    ``steps`` need not be sorted; the smallest qualifying step is returned.
    """
    s = vector("steps", steps)
    r = vector("reward", reward)
    same_length(steps=s, reward=r)
    if not math.isfinite(target):
        raise ValueError(f"target: expected a finite number, got {target!r}")
    hit = s[r >= target]
    return int(hit.min()) if len(hit) else None


@dataclass(frozen=True)
class StepsToTargetFit:
    """``S(B) = S_min (1 + B_crit / B)``, ``E_min = S_min B_crit`` (science §7).

    Fitted as the linear model ``S = S_min + E_min / B``; ``b_crit_se`` by the
    delta method on ``E_min / S_min``. A fit giving ``S_min <= 0`` or
    ``E_min < 0`` keeps its numbers (for diagnosis) but its status says it is
    not physical.
    """

    s_min: float
    b_crit: float
    e_min: float
    s_min_se: float
    b_crit_se: float
    e_min_se: float
    r2: float
    n_points: int
    status: str

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def predict(self, batch_size: ArrayLike) -> Any:
        """Predicted steps to target at batch size B."""
        b = np.asarray(batch_size, dtype=float)
        if np.any(b <= 0):
            raise ValueError("batch_size: expected positive numbers")
        out = self.s_min + self.e_min / b
        return float(out) if np.ndim(out) == 0 else out

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def fit_steps_to_target(batch_sizes: ArrayLike, steps: ArrayLike) -> StepsToTargetFit:
    """Least-squares fit of ``S(B) = S_min (1 + B_crit / B)`` to (B, S) pairs (science §7).

    Repeated B (seeds) are allowed; at least 3 distinct B are needed. Runs
    that never reached the target have no S and must be left out by the caller.
    """
    b = vector("batch_sizes", batch_sizes)
    s = vector("steps", steps)
    same_length(batch_sizes=b, steps=s)
    positive("batch_sizes", b)
    positive("steps", s)
    n = len(b)
    n_b = len(np.unique(b))
    if n_b < STEPS_MIN_DISTINCT_B:
        nan = math.nan
        return StepsToTargetFit(
            nan, nan, nan, nan, nan, nan, nan, n, too_few(n_b, STEPS_MIN_DISTINCT_B, "distinct batch sizes")
        )
    design = np.column_stack([np.ones_like(b), 1.0 / b])
    coef, *_ = np.linalg.lstsq(design, s, rcond=None)  # linear: curve_fit starts at the exact optimum
    best = best_curve_fit(lambda t, bb: t[0] + t[1] / bb, lambda t, bb: np.column_stack([np.ones_like(bb), 1.0 / bb]),
                          b, s, [coef], [-np.inf, -np.inf], [np.inf, np.inf])
    coef, cov, resid = best if best is not None else (coef, np.full((2, 2), np.nan), design @ coef - s)
    s_min, e_min = float(coef[0]), float(coef[1])
    with np.errstate(divide="ignore", invalid="ignore"):
        b_crit = e_min / s_min
        # gradient of E/S with respect to (S, E)
        grad = np.array([-e_min / s_min**2, 1.0 / s_min])
        var_b = float(grad @ cov @ grad)
    if s_min <= 0:
        status = f"not physical: S_min = {s_min:.4g} <= 0"
    elif e_min < 0:
        status = f"not physical: E_min = {e_min:.4g} < 0 (steps grow with B)"
    else:
        status = "ok"
    return StepsToTargetFit(
        s_min=s_min,
        b_crit=float(b_crit),
        e_min=e_min,
        s_min_se=se(cov, 0),
        b_crit_se=math.sqrt(var_b) if var_b >= 0 else math.nan,
        e_min_se=se(cov, 1),
        r2=r2(s, resid),
        n_points=n,
        status=status,
    )


# ---------------------------------------------------------------------------
# CRS prediction check


@dataclass(frozen=True)
class CrsPrediction:
    """One row of the CRS prediction table (science §7, last bullet; CRS from §6.3).

    ``predicted_n`` is the grid n nearest to the CRS in log2 (None when the
    CRS is NaN); ``agree`` is whether it equals ``observed_best_n``.
    """

    crs: float
    predicted_n: int | None
    observed_best_n: int
    observed_best_reward: float
    agree: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def predicted_vs_observed_best_n(crs: float, reward_by_n: Mapping[int, float]) -> CrsPrediction:
    """Put the CRS-predicted best n beside the observed one under a fixed total batch (science §7).

    ``crs`` is the critical rollout size measured in a short run at large n
    (§6.3; may be inf, meaning "the largest n"; NaN when not measured).
    ``reward_by_n`` maps each n of the iso-batch runs to its final or peak
    validation reward. The prediction is the n of the grid nearest to the CRS
    in log2 (ties to the smaller n); the observed best is the argmax reward
    (ties to the smaller n, the cheaper choice).
    """
    if not reward_by_n:
        raise ValueError("reward_by_n: expected at least one n -> reward entry")
    grid = sorted(reward_by_n)
    for n in grid:
        if int(n) != n or n < 1:
            raise ValueError(f"reward_by_n: expected positive integer n, got {n!r}")
        if not math.isfinite(reward_by_n[n]):
            raise ValueError(f"reward_by_n: expected a finite reward for n={n}, got {reward_by_n[n]!r}")
    crs = float(crs)
    if crs <= 0:
        raise ValueError(f"crs: expected a positive number, inf or nan, got {crs!r}")

    predicted: int | None
    if math.isnan(crs):
        predicted = None
    elif math.isinf(crs):
        predicted = int(grid[-1])
    else:
        # min keeps the first of equal distances, i.e. the smaller n
        predicted = int(min(grid, key=lambda n: abs(math.log2(n) - math.log2(crs))))
    best_reward = max(reward_by_n[n] for n in grid)
    observed = int(next(n for n in grid if reward_by_n[n] == best_reward))
    return CrsPrediction(
        crs=crs,
        predicted_n=predicted,
        observed_best_n=observed,
        observed_best_reward=float(best_reward),
        agree=predicted == observed,
    )
