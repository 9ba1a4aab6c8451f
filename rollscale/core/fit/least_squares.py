"""Shared machinery of the §7 fits: input checks and multi-start ``scipy.optimize.curve_fit``.

Parameter covariances are curve_fit's (``s^2 (J^T J)^-1`` from the Jacobian
at the optimum, with ``s^2 = SSR / (n - p)``): least-squares standard errors
that treat every point as independent, which pooled record-breaking points
are not (science §7). The honest intervals are the bootstrap's
(:mod:`rollscale.core.fit.bootstrap`); the ``_se`` columns are labelled as
least-squares SEs. Without residual degrees of freedom (n <= p) they are NaN.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.optimize import OptimizeWarning, curve_fit

__all__ = ["best_curve_fit", "positive", "r2", "same_length", "se", "too_few", "too_few_points", "vector"]


def vector(name: str, values: ArrayLike) -> NDArray[np.float64]:
    try:
        arr = np.asarray(values, dtype=float)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name}: expected a 1-D sequence of numbers ({exc})") from exc
    if arr.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D sequence of numbers, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name}: expected finite numbers, got {arr[~np.isfinite(arr)][:3].tolist()}")
    return arr


def same_length(**arrays: NDArray[np.float64]) -> None:
    lengths = {name: len(a) for name, a in arrays.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"expected equal lengths, got {lengths}")


def positive(name: str, arr: NDArray[np.float64]) -> None:
    if np.any(arr <= 0):
        raise ValueError(f"{name}: expected positive numbers, got {arr[arr <= 0][:3].tolist()}")


def best_curve_fit(
    model: Callable[..., NDArray[np.float64]],
    jacobian: Callable[..., NDArray[np.float64]],
    x: NDArray[np.float64],
    y: NDArray[np.float64],
    starts: Sequence[Sequence[float]],
    lower: Sequence[float],
    upper: Sequence[float],
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]] | None:
    """Bounded ``curve_fit`` from several starts: (params, covariance, residuals) of the least SSR, or None.

    ``model(theta, x)`` and ``jacobian(theta, x)`` take the parameter vector first.
    """
    lo, hi = np.asarray(lower, float), np.asarray(upper, float)
    best: tuple[Any, Any, Any] | None = None
    for x0 in starts:
        p0 = np.clip(np.asarray(x0, float), lo, hi)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", OptimizeWarning)
                popt, pcov = curve_fit(
                    lambda xx, *t: model(np.asarray(t), xx), x, y, p0=p0, bounds=(lo, hi),
                    jac=lambda xx, *t: jacobian(np.asarray(t), xx), method="trf", x_scale="jac",
                )
        except (RuntimeError, ValueError, np.linalg.LinAlgError):
            continue
        resid = model(popt, x) - y
        if np.all(np.isfinite(popt)) and (best is None or resid @ resid < best[2] @ best[2]):
            best = (popt, pcov, resid)
    if best is None:
        return None
    popt, pcov, resid = best
    if len(y) <= len(popt):
        pcov = np.full_like(pcov, np.nan)
    return popt, pcov, resid


def r2(y: NDArray[np.float64], residuals: NDArray[np.float64]) -> float:
    sst = float(np.sum((y - y.mean()) ** 2))
    if sst == 0.0:
        return math.nan
    return 1.0 - float(residuals @ residuals) / sst


def se(cov: NDArray[np.float64], i: int) -> float:
    v = cov[i, i]
    return math.sqrt(v) if v >= 0 else math.nan


def too_few(n: int, needed: int, what: str = "points") -> str:
    return f"too few {what} ({n} < {needed})"


def too_few_points(x: NDArray[np.float64], needed: int) -> str | None:
    """Why a fit of ``needed`` parameters cannot be made on points at ``x`` (too few, or at too few distinct
    compute values), or None when it can."""
    if len(x) < needed:
        return too_few(len(x), needed)
    distinct = len(np.unique(x))
    return too_few(distinct, needed, "distinct compute values") if distinct < needed else None


