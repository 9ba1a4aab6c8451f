"""Frontier analysis fits (science §7): record points, the sigmoid per n, S(B), the CRS check.

Pure functions on numpy / pandas; bounded fits use ``scipy.optimize.curve_fit``
(:mod:`rollscale.core.fitting`). Every fit returns a small frozen dataclass
with the parameters, their least-squares standard errors (``_se``: curve_fit's
covariance, derived quantities by the delta method; NaN with no residual
degree of freedom), ``r2``, ``n_points``, ``status`` (``"ok"`` or a reason
such as ``"too few points (3 < 4)"``), a ``predict`` method and ``to_dict()``
giving one flat table row. A fit that cannot be made is not an exception: it
comes back with NaN parameters and the reason. The least-squares SEs treat
pooled record points as independent and understate the error; the intervals
to quote are the bootstrap's over seeds (:mod:`rollscale.core.bootstrap`).
The frontier and n*(C) live in :mod:`rollscale.core.frontier`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.special import expit

from rollscale.core.fitting import best_curve_fit, positive, r2, same_length, se, too_few, vector

__all__ = [
    "CrsPrediction",
    "SigmoidFit",
    "StepsToTargetFit",
    "fit_sigmoid",
    "fit_steps_to_target",
    "predicted_vs_observed_best_n",
    "record_breaking_points",
    "sigmoid_model",
    "steps_to_target",
]

_LN10 = math.log(10.0)
# Relative tolerance under which reward / bin_width counts as sitting exactly on
# a bin edge: 0.3 / 0.1 == 2.9999999999999996 must land in bin 3, not bin 2.
_BIN_EDGE_RTOL = 1e-9

SIGMOID_MIN_POINTS = 4  # four parameters: R0, A, C_mid, beta
STEPS_MIN_DISTINCT_B = 3  # two parameters, plus one degree of freedom


# ---------------------------------------------------------------------------
# record-breaking points


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
    ratio = r / bin_width
    nearest = np.rint(ratio)
    on_edge = np.isclose(ratio, nearest, rtol=_BIN_EDGE_RTOL, atol=_BIN_EDGE_RTOL)
    bins = np.where(on_edge, nearest, np.floor(ratio))
    keep: list[int] = []
    best = -math.inf
    for i, b in enumerate(bins):
        if b > best:
            keep.append(i)
            best = b
    return keep


# ---------------------------------------------------------------------------
# monotonic sigmoid per n


@dataclass(frozen=True)
class SigmoidFit:
    """``R(C) = R0 + (A - R0) / (1 + (C_mid / C)^beta)`` (science §7).

    ``c_mid_se`` is propagated from the fitted ``log10_c_mid``; ``a_se`` from
    ``R0`` and ``A - R0``. Non-"ok" fits carry NaN parameters. ``at_bound``
    names the parameters the fit left at a bound of its range (e.g.
    ``log10_c_mid`` three decades past the data when the curve has not bent
    within the budget): the data do not identify them, nor A with them, though
    the curve still describes the data it was fitted on.
    """

    r0: float
    a: float
    c_mid: float
    beta: float
    r0_se: float
    a_se: float
    c_mid_se: float
    beta_se: float
    log10_c_mid: float
    log10_c_mid_se: float
    r2: float
    n_points: int
    status: str
    at_bound: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def predict(self, compute: ArrayLike) -> Any:
        """Predicted reward at compute C (scalar in, float out; array in, array out)."""
        c = np.asarray(compute, dtype=float)
        if np.any(c < 0):
            raise ValueError("compute: expected non-negative numbers")
        with np.errstate(divide="ignore"):
            x = np.log10(c)
        out = sigmoid_model(np.array([self.r0, self.a - self.r0, self.log10_c_mid, self.beta]), x)
        return float(out) if out.ndim == 0 else out

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def sigmoid_model(theta: NDArray[np.float64], x: ArrayLike) -> NDArray[np.float64]:
    """R at ``x = log10 C`` for ``theta = (R0, A - R0, log10 C_mid, beta)``, any leading shape (science §7)."""
    r0, delta, m, beta = theta
    # (C_mid / C)^beta = 10^(beta (m - x)), so the fraction is expit(beta ln10 (x - m))
    return r0 + delta * expit(beta * _LN10 * (np.asarray(x, float) - m))


def _sigmoid_jacobian(theta: NDArray[np.float64], x: NDArray[np.float64]) -> NDArray[np.float64]:
    _, delta, m, beta = theta
    s = expit(beta * _LN10 * (x - m))
    ds = delta * s * (1.0 - s) * _LN10
    return np.column_stack([np.ones_like(x), s, -ds * beta, ds * (x - m)])


def _nan_sigmoid(n: int, status: str) -> SigmoidFit:
    nan = math.nan
    return SigmoidFit(nan, nan, nan, nan, nan, nan, nan, nan, nan, nan, nan, n, status)


def fit_sigmoid(compute: ArrayLike, reward: ArrayLike) -> SigmoidFit:
    """Fit the monotonic sigmoid of reward in compute (science §7).

    Least squares over ``x = log10 C`` (residuals in reward) with bounded
    parameters ``(R0, delta = A - R0 >= 0, log10 C_mid, beta > 0)``;
    ``log10 C_mid`` is kept within three decades of the data and
    ``beta`` in [1e-3, 50]. Several starting points; the converged one with the
    least squared error wins. Needs at least 4 points at 4 distinct C.
    """
    c = vector("compute", compute)
    y = vector("reward", reward)
    same_length(compute=c, reward=y)
    positive("compute", c)
    n = len(y)
    if n < SIGMOID_MIN_POINTS:
        return _nan_sigmoid(n, too_few(n, SIGMOID_MIN_POINTS))
    x = np.log10(c)
    n_c = len(np.unique(x))
    if n_c < SIGMOID_MIN_POINTS:
        return _nan_sigmoid(n, too_few(n_c, SIGMOID_MIN_POINTS, "distinct compute values"))

    lower = [-np.inf, 0.0, x.min() - 3.0, 1e-3]
    upper = [np.inf, np.inf, x.max() + 3.0, 50.0]
    span = max(float(y.max() - y.min()), 1e-6)
    starts = [
        [float(y.min()), span, float(m0), b0]
        for m0 in np.quantile(x, [0.25, 0.5, 0.75])
        for b0 in (0.5, 1.0, 2.0)
    ]
    best = best_curve_fit(sigmoid_model, _sigmoid_jacobian, x, y, starts, lower, upper)
    if best is None:
        return _nan_sigmoid(n, "fit did not converge")
    theta, cov, resid = best
    r0, delta, m, beta = (float(v) for v in theta)
    # A = R0 + delta: var(A) = var(R0) + var(delta) + 2 cov(R0, delta)
    var_a = cov[0, 0] + cov[1, 1] + 2.0 * cov[0, 1]
    a_se = math.sqrt(var_a) if var_a >= 0 else math.nan
    m_se = se(cov, 2)
    c_mid = 10.0**m
    # within 1e-3 of a bound's scale: least squares stops at the bound, not exactly on it
    at_bound = [name for name, v, lo, hi in (("log10_c_mid", m, lower[2], upper[2]), ("beta", beta, lower[3], upper[3]))
                if min(abs(v - lo), abs(v - hi)) <= 1e-3 * max(1.0, abs(v))]
    return SigmoidFit(
        r0=r0,
        a=r0 + delta,
        c_mid=c_mid,
        beta=beta,
        r0_se=se(cov, 0),
        a_se=a_se,
        c_mid_se=c_mid * _LN10 * m_se,  # delta method on C_mid = 10^m
        beta_se=se(cov, 3),
        log10_c_mid=m,
        log10_c_mid_se=m_se,
        r2=r2(y, resid),
        n_points=n,
        status="ok",
        at_bound=", ".join(at_bound),
    )


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
