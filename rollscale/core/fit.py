"""Frontier analysis fits (science §7).

Pure functions on numpy / pandas; fits with bounded parameters use
``scipy.optimize.least_squares``. Every fit returns a small frozen dataclass
with the parameters, their standard errors, ``r2``, ``n_points``, ``status``
(``"ok"`` or a reason such as ``"too few points (3 < 4)"``), a ``predict``
method and ``to_dict()`` giving one flat, JSON-friendly table row (floats, inf
and nan allowed). A fit that cannot be made (too few points, no convergence)
is not an exception: it comes back with NaN parameters and the reason.

Standard errors come from the Jacobian at the optimum,
``cov = s^2 (J^T J)^-1`` with ``s^2 = SSR / (n - p)``; derived quantities use
the delta method. With ``n == p`` there is no residual degree of freedom and
the standard errors are NaN; a singular ``J^T J`` gives infinite ones.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike, NDArray
from scipy.optimize import least_squares
from scipy.special import expit

__all__ = [
    "CrsPrediction",
    "NStarFit",
    "SigmoidFit",
    "StepsToTargetFit",
    "epochs_at_transitions",
    "fit_n_star",
    "fit_sigmoid",
    "fit_steps_to_target",
    "frontier",
    "log_grid",
    "predicted_vs_observed_best_n",
    "record_breaking_points",
    "steps_to_target",
]

_LN10 = math.log(10.0)
# Relative tolerance under which reward / bin_width counts as sitting exactly on
# a bin edge: 0.3 / 0.1 == 2.9999999999999996 must land in bin 3, not bin 2.
_BIN_EDGE_RTOL = 1e-9

SIGMOID_MIN_POINTS = 4  # four parameters: R0, A, C_mid, beta
N_STAR_MIN_POINTS = 4  # four parameters: lo, hi, k, c0
STEPS_MIN_DISTINCT_B = 3  # two parameters, plus one degree of freedom


# ---------------------------------------------------------------------------
# input checks


def _vector(name: str, values: ArrayLike) -> NDArray[np.float64]:
    try:
        arr = np.asarray(values, dtype=float)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name}: expected a 1-D sequence of numbers ({exc})") from exc
    if arr.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D sequence of numbers, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name}: expected finite numbers, got {arr[~np.isfinite(arr)][:3].tolist()}")
    return arr


def _same_length(**arrays: NDArray[np.float64]) -> None:
    lengths = {name: len(a) for name, a in arrays.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"expected equal lengths, got {lengths}")


def _positive(name: str, arr: NDArray[np.float64]) -> None:
    if np.any(arr <= 0):
        raise ValueError(f"{name}: expected positive numbers, got {arr[arr <= 0][:3].tolist()}")


# ---------------------------------------------------------------------------
# shared fitting machinery


def _covariance(jac: NDArray[np.float64], residuals: NDArray[np.float64]) -> NDArray[np.float64]:
    """``s^2 (J^T J)^-1``; NaN without residual degrees of freedom, inf if singular."""
    n, p = jac.shape
    if n <= p:
        return np.full((p, p), np.nan)
    s2 = float(residuals @ residuals) / (n - p)
    try:
        inv = np.linalg.inv(jac.T @ jac)
    except np.linalg.LinAlgError:
        return np.full((p, p), np.inf)
    return s2 * inv


def _r2(y: NDArray[np.float64], residuals: NDArray[np.float64]) -> float:
    sst = float(np.sum((y - y.mean()) ** 2))
    if sst == 0.0:
        return math.nan
    return 1.0 - float(residuals @ residuals) / sst


def _se(cov: NDArray[np.float64], i: int) -> float:
    v = cov[i, i]
    return math.sqrt(v) if v >= 0 else math.nan


def _best_least_squares(
    residuals: Callable[[NDArray[np.float64]], NDArray[np.float64]],
    jacobian: Callable[[NDArray[np.float64]], NDArray[np.float64]],
    starts: Sequence[Sequence[float]],
    lower: Sequence[float],
    upper: Sequence[float],
) -> Any | None:
    """Run bounded least squares from several starts; the converged one with least cost."""
    lo, hi = np.asarray(lower, float), np.asarray(upper, float)
    best = None
    for x0 in starts:
        x0 = np.clip(np.asarray(x0, float), lo, hi)
        try:
            res = least_squares(residuals, x0, jac=jacobian, bounds=(lo, hi), x_scale="jac", method="trf")
        except (ValueError, np.linalg.LinAlgError):
            continue
        if res.success and np.all(np.isfinite(res.x)) and (best is None or res.cost < best.cost):
            best = res
    return best


def _too_few(n: int, needed: int, what: str = "points") -> str:
    return f"too few {what} ({n} < {needed})"


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
    c = _vector("compute", compute)
    r = _vector("reward", reward)
    _same_length(compute=c, reward=r)
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
    ``R0`` and ``A - R0``. Non-"ok" fits carry NaN parameters.
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
        out = _sigmoid_model(np.array([self.r0, self.a - self.r0, self.log10_c_mid, self.beta]), x)
        return float(out) if out.ndim == 0 else out

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _sigmoid_model(theta: NDArray[np.float64], x: ArrayLike) -> NDArray[np.float64]:
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
    c = _vector("compute", compute)
    y = _vector("reward", reward)
    _same_length(compute=c, reward=y)
    _positive("compute", c)
    n = len(y)
    if n < SIGMOID_MIN_POINTS:
        return _nan_sigmoid(n, _too_few(n, SIGMOID_MIN_POINTS))
    x = np.log10(c)
    n_c = len(np.unique(x))
    if n_c < SIGMOID_MIN_POINTS:
        return _nan_sigmoid(n, _too_few(n_c, SIGMOID_MIN_POINTS, "distinct compute values"))

    lower = [-np.inf, 0.0, x.min() - 3.0, 1e-3]
    upper = [np.inf, np.inf, x.max() + 3.0, 50.0]
    span = max(float(y.max() - y.min()), 1e-6)
    starts = [
        [float(y.min()), span, float(m0), b0]
        for m0 in np.quantile(x, [0.25, 0.5, 0.75])
        for b0 in (0.5, 1.0, 2.0)
    ]
    res = _best_least_squares(
        lambda t: _sigmoid_model(t, x) - y,
        lambda t: _sigmoid_jacobian(t, x),
        starts,
        lower,
        upper,
    )
    if res is None:
        return _nan_sigmoid(n, "fit did not converge")

    r0, delta, m, beta = (float(v) for v in res.x)
    cov = _covariance(_sigmoid_jacobian(res.x, x), res.fun)
    # A = R0 + delta: var(A) = var(R0) + var(delta) + 2 cov(R0, delta)
    var_a = cov[0, 0] + cov[1, 1] + 2.0 * cov[0, 1]
    a_se = math.sqrt(var_a) if var_a >= 0 else math.nan
    m_se = _se(cov, 2)
    c_mid = 10.0**m
    return SigmoidFit(
        r0=r0,
        a=r0 + delta,
        c_mid=c_mid,
        beta=beta,
        r0_se=_se(cov, 0),
        a_se=a_se,
        c_mid_se=c_mid * _LN10 * m_se,  # delta method on C_mid = 10^m
        beta_se=_se(cov, 3),
        log10_c_mid=m,
        log10_c_mid_se=m_se,
        r2=_r2(y, res.fun),
        n_points=n,
        status="ok",
    )


# ---------------------------------------------------------------------------
# frontier and n*(C)


def log_grid(c_min: float, c_max: float, points: int) -> NDArray[np.float64]:
    """``points`` compute values evenly spaced in log C from c_min to c_max (science §7)."""
    if not (math.isfinite(c_min) and c_min > 0):
        raise ValueError(f"c_min: expected a positive finite number, got {c_min!r}")
    if not (math.isfinite(c_max) and c_max > c_min):
        raise ValueError(f"c_max: expected a finite number above c_min={c_min!r}, got {c_max!r}")
    if int(points) != points or points < 2:
        raise ValueError(f"points: expected an integer >= 2, got {points!r}")
    return np.logspace(math.log10(c_min), math.log10(c_max), int(points))


def frontier(curves: Mapping[Hashable, SigmoidFit], c_grid: ArrayLike) -> pd.DataFrame:
    """The frontier ``F(C) = max_key R_key(C)`` and its argmax on a grid (science §7).

    ``curves`` maps a key (n, or B_problem) to its fitted sigmoid; fits whose
    status is not "ok" are ignored. Ties go to the key listed first. With no
    usable fit, ``frontier_reward`` is NaN and ``best_key`` None.
    Columns: ``c``, ``frontier_reward``, ``best_key``.
    """
    c = _vector("c_grid", c_grid)
    _positive("c_grid", c)
    usable = [(k, f) for k, f in curves.items() if f.ok]
    if not usable:
        return pd.DataFrame(
            {"c": c, "frontier_reward": np.full(len(c), np.nan), "best_key": pd.Series([None] * len(c), dtype=object)}
        )
    keys = [k for k, _ in usable]
    preds = np.vstack([np.atleast_1d(f.predict(c)) for _, f in usable])
    best = np.argmax(preds, axis=0)  # first maximum: ties go to the earlier key
    return pd.DataFrame(
        {
            "c": c,
            "frontier_reward": preds[best, np.arange(len(c))],
            "best_key": pd.Series([keys[i] for i in best], dtype=object),
        }
    )


def epochs_at_transitions(
    frontier_df: pd.DataFrame, epochs_lookup: Callable[[Hashable, float], float]
) -> pd.DataFrame:
    """Epochs completed by the new best run where the frontier's argmax changes (science §7).

    Walking the grid in the frame's order, a transition is the first grid point
    ``c`` where ``best_key`` differs from the previous non-missing one; the
    row reports ``epochs_lookup(to_key, c)``, the epochs the ``to_key`` run
    had completed at that compute. Columns: ``c``, ``from_key``, ``to_key``,
    ``epochs``.
    """
    missing = {"c", "best_key"} - set(frontier_df.columns)
    if missing:
        raise ValueError(f"frontier_df: expected columns c and best_key, missing {sorted(missing)}")
    rows = []
    prev: Any = None
    for c, key in zip(frontier_df["c"], frontier_df["best_key"], strict=True):
        if key is None or (isinstance(key, float) and math.isnan(key)):
            continue
        if prev is not None and key != prev:
            rows.append({"c": float(c), "from_key": prev, "to_key": key, "epochs": float(epochs_lookup(key, float(c)))})
        prev = key
    return pd.DataFrame(rows, columns=["c", "from_key", "to_key", "epochs"])


@dataclass(frozen=True)
class NStarFit:
    """``log2 n*(C) = lo + (hi - lo) / (1 + exp(-k (log10 C - c0)))`` (science §7).

    ``k >= 0``; ``hi < lo`` means n* falls with compute. Non-"ok" fits carry
    NaN parameters. ``r2`` is in log2 n*.
    """

    lo: float
    hi: float
    k: float
    c0: float
    lo_se: float
    hi_se: float
    k_se: float
    c0_se: float
    r2: float
    n_points: int
    status: str

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def predict_log2(self, log10_c: ArrayLike) -> Any:
        """Predicted log2 n* at log10 C."""
        out = _n_star_model(np.array([self.lo, self.hi, self.k, self.c0]), np.asarray(log10_c, float))
        return float(out) if out.ndim == 0 else out

    def predict(self, log10_c: ArrayLike) -> Any:
        """Predicted n* (not its log) at log10 C."""
        return np.exp2(self.predict_log2(log10_c))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _n_star_model(theta: NDArray[np.float64], x: NDArray[np.float64]) -> NDArray[np.float64]:
    lo, hi, k, c0 = theta
    return lo + (hi - lo) * expit(k * (x - c0))


def _n_star_jacobian(theta: NDArray[np.float64], x: NDArray[np.float64]) -> NDArray[np.float64]:
    lo, hi, k, c0 = theta
    s = expit(k * (x - c0))
    dz = (hi - lo) * s * (1.0 - s)
    return np.column_stack([1.0 - s, s, dz * (x - c0), -dz * k])


def _nan_n_star(n: int, status: str) -> NStarFit:
    nan = math.nan
    return NStarFit(nan, nan, nan, nan, nan, nan, nan, nan, nan, n, status)


def fit_n_star(log10_c: ArrayLike, n_star: ArrayLike) -> NStarFit:
    """Fit the logistic of log2 n* in log10 C (science §7).

    Bounds: ``k`` in [0, 100] per decade (``k >= 0`` makes the curve
    identifiable; a falling n* is ``hi < lo``); ``c0`` within two decades of
    the data; ``lo`` and ``hi`` within one data span (at least one doubling)
    beyond the observed range of log2 n*, so a transition outside the data
    cannot send a plateau off. Needs 4 points at 4 distinct C, and n* that is
    not constant (a constant n* has no transition to fit).
    """
    x = _vector("log10_c", log10_c)
    n_arr = _vector("n_star", n_star)
    _same_length(log10_c=x, n_star=n_arr)
    _positive("n_star", n_arr)
    n = len(x)
    if n < N_STAR_MIN_POINTS:
        return _nan_n_star(n, _too_few(n, N_STAR_MIN_POINTS))
    n_c = len(np.unique(x))
    if n_c < N_STAR_MIN_POINTS:
        return _nan_n_star(n, _too_few(n_c, N_STAR_MIN_POINTS, "distinct compute values"))
    y = np.log2(n_arr)
    if np.all(y == y[0]):
        return _nan_n_star(n, f"n* constant ({float(n_arr[0]):g}): no transition to fit")

    span = max(float(y.max() - y.min()), 1.0)
    y_lo, y_hi = float(y.min()) - span, float(y.max()) + span
    lower = [y_lo, y_lo, 0.0, x.min() - 2.0]
    upper = [y_hi, y_hi, 100.0, x.max() + 2.0]
    # plateau guesses: mean log2 n* over the lowest and highest quarter of C
    y_sorted, q = y[np.argsort(x)], max(1, n // 4)
    first, last = float(np.mean(y_sorted[:q])), float(np.mean(y_sorted[-q:]))
    starts = [
        [a, b, k0, float(c0)]
        for a, b in ((first, last), (float(y.min()), float(y.max())), (float(y.max()), float(y.min())))
        for c0 in np.quantile(x, [0.25, 0.5, 0.75])
        for k0 in (1.0, 5.0)
    ]
    res = _best_least_squares(
        lambda t: _n_star_model(t, x) - y,
        lambda t: _n_star_jacobian(t, x),
        starts,
        lower,
        upper,
    )
    if res is None:
        return _nan_n_star(n, "fit did not converge")
    cov = _covariance(_n_star_jacobian(res.x, x), res.fun)
    lo, hi, k, c0 = (float(v) for v in res.x)
    return NStarFit(
        lo=lo,
        hi=hi,
        k=k,
        c0=c0,
        lo_se=_se(cov, 0),
        hi_se=_se(cov, 1),
        k_se=_se(cov, 2),
        c0_se=_se(cov, 3),
        r2=_r2(y, res.fun),
        n_points=n,
        status="ok",
    )


# ---------------------------------------------------------------------------
# steps to target (critical batch size)


def steps_to_target(steps: ArrayLike, reward: ArrayLike, target: float) -> int | None:
    """First step whose validation reward is >= target, or None if never (science §7, S(B)).

    ``steps`` need not be sorted; the smallest qualifying step is returned.
    """
    s = _vector("steps", steps)
    r = _vector("reward", reward)
    _same_length(steps=s, reward=r)
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
    b = _vector("batch_sizes", batch_sizes)
    s = _vector("steps", steps)
    _same_length(batch_sizes=b, steps=s)
    _positive("batch_sizes", b)
    _positive("steps", s)
    n = len(b)
    n_b = len(np.unique(b))
    if n_b < STEPS_MIN_DISTINCT_B:
        nan = math.nan
        return StepsToTargetFit(
            nan, nan, nan, nan, nan, nan, nan, n, _too_few(n_b, STEPS_MIN_DISTINCT_B, "distinct batch sizes")
        )
    design = np.column_stack([np.ones_like(b), 1.0 / b])
    coef, *_ = np.linalg.lstsq(design, s, rcond=None)
    s_min, e_min = float(coef[0]), float(coef[1])
    resid = design @ coef - s
    cov = _covariance(design, resid)
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
        s_min_se=_se(cov, 0),
        b_crit_se=math.sqrt(var_b) if var_b >= 0 else math.nan,
        e_min_se=_se(cov, 1),
        r2=_r2(s, resid),
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
