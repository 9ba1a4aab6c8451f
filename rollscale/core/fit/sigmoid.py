"""The monotonic sigmoid of reward in compute and its least-squares fit (science §7, A1 of §8).

``R(C) = R0 + (A - R0) / (1 + (C_mid / C)^beta)``, fitted in ``x = log10 C``
with parameters ``theta = (R0, A - R0, log10 C_mid, beta)``. For rewards that
are means of 0/1 rewards, A is at most 1 (science §8, A1): a fit that exceeds
it is redone in ``u = (A - R0) / (a_max - R0)`` (:func:`to_delta`,
:func:`to_u`, :func:`u_jacobian`), which the vectorised bootstrap refits
(:func:`rollscale.core.fit.bootstrap.sigmoid_refits`) share. Re-exported by
:mod:`rollscale.core.fit.curves`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.special import expit

from rollscale.core.fit.least_squares import best_curve_fit, positive, r2, same_length, se, too_few_points, vector

__all__ = ["SIGMOID_MIN_POINTS", "SigmoidFit", "fit_sigmoid", "sigmoid_bounds", "sigmoid_jacobian", "sigmoid_model",
           "sigmoid_starts", "to_delta", "to_u", "u_jacobian"]

_LN10 = math.log(10.0)
SIGMOID_MIN_POINTS = 4  # four parameters: R0, A, C_mid, beta


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


def sigmoid_jacobian(theta: NDArray[np.float64], x: NDArray[np.float64]) -> NDArray[np.float64]:
    """``(points, 4)`` derivatives of :func:`sigmoid_model` with respect to ``theta`` at ``x``."""
    _, delta, m, beta = theta
    s = expit(beta * _LN10 * (x - m))
    ds = delta * s * (1.0 - s) * _LN10
    return np.column_stack([np.ones_like(x), s, -ds * beta, ds * (x - m)])


def _nan_sigmoid(n: int, status: str) -> SigmoidFit:
    nan = math.nan
    return SigmoidFit(nan, nan, nan, nan, nan, nan, nan, nan, nan, nan, nan, n, status)


def sigmoid_bounds(x: NDArray[np.float64]) -> tuple[list[float], list[float]]:
    """Bounds of ``(R0, A - R0, log10 C_mid, beta)`` for points at ``x = log10 C`` (science §7)."""
    return [-np.inf, 0.0, float(x.min()) - 3.0, 1e-3], [np.inf, np.inf, float(x.max()) + 3.0, 50.0]


def sigmoid_starts(x: NDArray[np.float64], y: NDArray[np.float64]) -> list[list[float]]:
    """The nine starting points of :func:`fit_sigmoid`: C_mid at the quartiles of x, beta 0.5, 1, 2."""
    span = max(float(y.max() - y.min()), 1e-6)
    return [[float(y.min()), span, float(m0), b0] for m0 in np.quantile(x, [0.25, 0.5, 0.75]) for b0 in (0.5, 1.0, 2.0)]


# A1 (science §8): for 0/1 rewards A <= a_max = 1. A - R0 <= a_max - R0 is no box bound, so a bounded
# fit is made in u = (A - R0) / (a_max - R0) in [0, 1] with R0 <= a_max, and mapped back.


def to_delta(theta_u: NDArray[np.float64], a_max: float) -> NDArray[np.float64]:
    """``(R0, u, log10 C_mid, beta)`` to ``(R0, A - R0, ...)``, parameters on the last axis."""
    out = np.array(theta_u, float, copy=True)
    out[..., 1] = theta_u[..., 1] * (a_max - theta_u[..., 0])
    return out


def to_u(theta: NDArray[np.float64], a_max: float) -> NDArray[np.float64]:
    """The start of a bounded fit: R0 <= a_max, u = (A - R0) / (a_max - R0) clipped to [0, 1]."""
    out = np.array(theta, float, copy=True)
    out[..., 0] = np.minimum(theta[..., 0], a_max - 1e-6)
    with np.errstate(divide="ignore", invalid="ignore"):
        out[..., 1] = np.clip(theta[..., 1] / (a_max - out[..., 0]), 0.0, 1.0)
    return out


def u_jacobian(jac: NDArray[np.float64], theta_u: NDArray[np.float64], a_max: float) -> NDArray[np.float64]:
    """Chain rule from the Jacobian in ``(R0, A - R0, ...)`` (parameters on the last axis) to u's."""
    out = np.array(jac, float, copy=True)
    u, r0 = theta_u[..., 1][..., None], theta_u[..., 0][..., None]  # broadcast over the points axis
    out[..., 0] = jac[..., 0] - u * jac[..., 1]
    out[..., 1] = (a_max - r0) * jac[..., 1]
    return out


def _bounded_fit(x: NDArray[np.float64], y: NDArray[np.float64], theta: NDArray[np.float64],
                 starts: list[list[float]], lower: list[float], upper: list[float], a_max: float) -> Any:
    """The fit of :func:`fit_sigmoid` with A <= a_max: (params, covariance, residuals) in (R0, A - R0, ...)."""
    lo_u, hi_u = [lower[0], 0.0, lower[2], lower[3]], [a_max, 1.0, upper[2], upper[3]]
    starts_u = [to_u(np.asarray(t, float), a_max) for t in [theta, *starts]]
    best = best_curve_fit(lambda t, xx: sigmoid_model(to_delta(t, a_max), xx),
                          lambda t, xx: u_jacobian(sigmoid_jacobian(to_delta(t, a_max), xx), t, a_max),
                          x, y, starts_u, lo_u, hi_u)
    if best is None:
        return None
    theta_u, cov_u, resid = best
    r0, u = theta_u[0], theta_u[1]
    grad = np.eye(4)
    grad[1, :2] = [-u, a_max - r0]  # d(A - R0) / d(R0, u)
    return to_delta(theta_u, a_max), grad @ cov_u @ grad.T, resid


def fit_sigmoid(compute: ArrayLike, reward: ArrayLike, a_max: float | None = None) -> SigmoidFit:
    """Fit the monotonic sigmoid of reward in compute (science §7).

    Least squares over ``x = log10 C`` (residuals in reward) with bounded
    parameters ``(R0, delta = A - R0 >= 0, log10 C_mid, beta > 0)``;
    ``log10 C_mid`` is kept within three decades of the data and
    ``beta`` in [1e-3, 50]. Several starting points; the converged one with the
    least squared error wins. Needs at least 4 points at 4 distinct C.

    With ``a_max`` (1 for rewards that are means of 0/1 rewards; science §8,
    A1), a fit whose A exceeds it is redone with A <= a_max; a fit already
    within the bound is left as it is, and ``at_bound`` names ``a`` when A
    ends on the bound.
    """
    c = vector("compute", compute)
    y = vector("reward", reward)
    same_length(compute=c, reward=y)
    positive("compute", c)
    n, x = len(y), np.log10(c)
    if (why := too_few_points(x, SIGMOID_MIN_POINTS)) is not None:
        return _nan_sigmoid(n, why)

    lower, upper = sigmoid_bounds(x)
    starts = sigmoid_starts(x, y)
    best = best_curve_fit(sigmoid_model, sigmoid_jacobian, x, y, starts, lower, upper)
    if best is None:
        return _nan_sigmoid(n, "fit did not converge")
    if a_max is not None and best[0][0] + best[0][1] > a_max:
        best = _bounded_fit(x, y, best[0], starts, lower, upper, a_max)
        if best is None:
            return _nan_sigmoid(n, f"fit with A <= {a_max:g} did not converge")
    theta, cov, resid = best
    r0, delta, m, beta = (float(v) for v in theta)
    # A = R0 + delta: var(A) = var(R0) + var(delta) + 2 cov(R0, delta)
    var_a = cov[0, 0] + cov[1, 1] + 2.0 * cov[0, 1]
    a_se = math.sqrt(var_a) if var_a >= 0 else math.nan
    m_se = se(cov, 2)
    c_mid = 10.0**m
    # within 1e-3 of a bound's scale: least squares stops at the bound, not exactly on it
    at_bound = [name for name, v, lo, hi in (("log10_c_mid", m, lower[2], upper[2]), ("beta", beta, lower[3], upper[3]),
                                             ("a", r0 + delta, -np.inf, np.inf if a_max is None else a_max))
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
