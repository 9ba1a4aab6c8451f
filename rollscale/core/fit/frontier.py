"""The frontier F(C) = max_n R_n(C), its argmax n*(C) and the logistic fit of n* (science §7).

Also what the frontier may use of each curve (science §8, A3: a fit is trusted
at most eta times beyond the largest C it saw, :func:`reach_mask`), the
argmax under bootstrap refits (:func:`refit_argmax`), and the check of A2,
n* does not fall with budget (:func:`a2_check`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike, NDArray
from scipy.special import expit

from rollscale.core.fit.bootstrap import interval
from rollscale.core.fit.least_squares import best_curve_fit, positive, r2, same_length, se, too_few_points, vector

if TYPE_CHECKING:
    from rollscale.core.fit.curves import SigmoidFit

__all__ = ["N_STAR_MIN_POINTS", "A2Check", "NStarFit", "a2_check", "epochs_at_transitions", "fit_n_star", "frontier",
           "asymptote_upper", "log_grid", "pairwise_beats", "reach_mask", "refit_argmax",
           "resolved_start"]

N_STAR_MIN_POINTS = 4  # four parameters: lo, hi, k, c0


def log_grid(c_min: float, c_max: float, points: int) -> NDArray[np.float64]:
    """``points`` compute values evenly spaced in log C from c_min to c_max (science §7)."""
    if not (math.isfinite(c_min) and c_min > 0):
        raise ValueError(f"c_min: expected a positive finite number, got {c_min!r}")
    if not (math.isfinite(c_max) and c_max > c_min):
        raise ValueError(f"c_max: expected a finite number above c_min={c_min!r}, got {c_max!r}")
    if int(points) != points or points < 2:
        raise ValueError(f"points: expected an integer >= 2, got {points!r}")
    return np.logspace(math.log10(c_min), math.log10(c_max), int(points))


def frontier(curves: Mapping[Hashable, SigmoidFit], c_grid: ArrayLike,
             allowed: NDArray[np.bool_] | None = None) -> pd.DataFrame:
    """The frontier ``F(C) = max_key R_key(C)`` and its argmax on a grid (science §7).

    ``curves`` maps a key (n, or B_problem) to its fitted sigmoid; fits whose
    status is not "ok" are ignored. Ties go to the key listed first. With no
    usable fit, ``frontier_reward`` is NaN and ``best_key`` None. ``allowed``
    (usable keys x grid, from :func:`reach_mask`) leaves a key out of the max
    where it is False. Columns: ``c``, ``frontier_reward``, ``best_key``.
    """
    c = vector("c_grid", c_grid)
    positive("c_grid", c)
    usable = [(k, f) for k, f in curves.items() if f.ok]
    if not usable:
        return pd.DataFrame(
            {"c": c, "frontier_reward": np.full(len(c), np.nan), "best_key": pd.Series([None] * len(c), dtype=object)}
        )
    keys = [k for k, _ in usable]
    preds = np.vstack([np.atleast_1d(f.predict(c)) for _, f in usable])
    if allowed is not None:
        preds = np.where(allowed, preds, -np.inf)
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


def resolved_start(c_grid: ArrayLike, frontier_reward: ArrayLike, min_gain: float) -> float | None:
    """The lowest budget where the frontier has risen by ``min_gain`` above its first value; None if never.

    Below it every curve is still at the base reward, and which is highest is
    fit noise, not a best key (science §7 as the fit stage applies it).
    """
    c, f = np.asarray(c_grid, float), np.asarray(frontier_reward, float)
    risen = np.flatnonzero(f - f[0] >= min_gain)
    return float(c[risen[0]]) if len(risen) else None


def reach_mask(c_grid: ArrayLike, reach: ArrayLike, preds: NDArray[np.float64],
               a_hi: ArrayLike) -> tuple[NDArray[np.bool_], NDArray[np.bool_]]:
    """Which keys the frontier may use at each budget: ``(allowed, extrapolated)``, keys x budgets (science §8, A3).

    ``reach`` is how far each key's curve is trusted: eta times the largest C
    its points saw. Within reach a key competes with its curve ``preds``
    (keys x budgets). Beyond it, only its asymptote's upper bound ``a_hi``
    speaks: the key stays in the max (``extrapolated``) only where ``a_hi``
    reaches the best curve within reach there, that is where it could still
    be best; else it is left out. A key with no ``a_hi`` (NaN: one seed, no
    bootstrap) could be anything and stays. A budget no key reaches keeps
    every key. A grid study (every key trained to C_max) has every key within
    reach everywhere, so nothing changes there.
    """
    c = np.asarray(c_grid, float)
    within = c[None, :] <= np.asarray(reach, float)[:, None] * (1.0 + 1e-9)
    best_within = np.max(np.where(within, preds, -np.inf), axis=0)
    with np.errstate(invalid="ignore"):
        below = np.asarray(a_hi, float)[:, None] < best_within[None, :]
    allowed = within | ~below
    return allowed, allowed & ~within


def asymptote_upper(refits: NDArray[np.float64], c_seen: ArrayLike, seeds: ArrayLike, level: float,
                    a_max: float | None, eta: float = 1.0) -> NDArray[np.float64]:
    """Upper bound of each key's asymptote A where the data can speak for it (science §8, A3).

    ``refits`` is keys x refits x (R0, A - R0, log10 C_mid, beta). A refit whose
    midpoint C_mid lies beyond 1 / ``eta`` of the largest C the key saw
    (``c_seen``) has not shown its bend within its data: its A is an
    extrapolation and counts as ``a_max`` (infinite without one). The bound is the upper end of the ``level``
    expanded-percentile interval over ``seeds`` (NaN with fewer than 2).
    """
    a = refits[..., 0] + refits[..., 1]
    unbent = refits[..., 2] > np.log10(np.asarray(c_seen, float) / eta)[:, None]
    a = np.where(unbent, np.inf if a_max is None else a_max, a)
    seeds = np.asarray(seeds, int)
    out = np.full(a.shape[0], np.nan)
    for k in np.unique(seeds):  # the interval's width depends on the seeds
        out[seeds == k] = interval(a[seeds == k].T, int(k), level=level)[1]
    return out


def refit_argmax(preds: NDArray[np.float64], allowed: NDArray[np.bool_]) -> tuple[NDArray[np.int64], NDArray]:
    """Argmax key index and frontier reward under each bootstrap refit (science §7).

    ``preds`` is keys x refits x budgets, ``allowed`` keys x budgets
    (:func:`reach_mask`). A refit in which an allowed key's fit failed (NaN)
    has index -1 and reward NaN there; ties go to the first key.
    """
    masked = np.where(allowed[:, None, :], preds, -np.inf)
    failed = (np.isnan(preds) & allowed[:, None, :]).any(axis=0)
    clean = np.nan_to_num(masked, nan=-np.inf)
    picked = np.where(failed, -1, np.argmax(clean, axis=0))
    return picked, np.where(failed, np.nan, np.max(clean, axis=0))


@dataclass(frozen=True)
class A2Check:
    """Whether the best n falls with budget along a frontier (science §8, A2), and where."""

    holds: bool
    c_from: float
    c_to: float
    from_key: float
    to_key: float
    status: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def pairwise_beats(preds: NDArray[np.float64], allowed: NDArray[np.bool_]) -> NDArray[np.float64]:
    """``beats[i, j, g]``: the share of refits in which key i's curve is above key j's at budget g.

    ``preds`` is keys x refits x budgets (one refit: the point fit, shares 0
    or 1); NaN where either key is not ``allowed`` there or no refit of both
    succeeded.
    """
    a, b = preds[:, None], preds[None, :]
    ok = np.isfinite(a) & np.isfinite(b)
    with np.errstate(invalid="ignore"):
        out = (ok & (a > b)).sum(axis=2) / ok.sum(axis=2)
    both = allowed[:, None, :] & allowed[None, :, :]
    return np.where(both, out, np.nan)


def a2_check(c: ArrayLike, keys: ArrayLike, best: ArrayLike, beats: NDArray[np.float64], level: float = 0.95,
             note: str = "") -> A2Check:
    """A2 of science §8: n*(C) does not fall with budget C, checked on a final frontier.

    ``c`` are the frontier's budgets, ``keys`` its n values, ``best`` the
    index of n* at each budget and ``beats`` :func:`pairwise_beats`. A2 fails
    where n* falls confidently: an earlier budget's n* n1 is above a later
    budget's n* n2, n1 beats n2 at the earlier budget and n2 beats n1 at the
    later one, each in at least ``level`` of refits (pairwise, so a third key
    sharing the argmax does not hide it). The largest such fall is reported.
    The search's A2 stops (science §9.4: a smaller n the leader beats where
    both ran is settled) assume it: a failure means one may have stopped an n
    too early. ``note`` is added to the status (e.g. "1 seed": the shares are
    then the point fit's, 0 or 1).
    """
    cc, kk, bb = np.asarray(c, float), np.asarray(keys, float), np.asarray(best, int)
    nan = math.nan
    suffix = f" ({note})" if note else ""
    worst: tuple[float, int, int] | None = None
    for g1 in range(len(cc)):
        i = bb[g1]
        for g2 in range(g1 + 1, len(cc)):
            j = bb[g2]
            if kk[j] >= kk[i] or not (beats[i, j, g1] >= level and beats[j, i, g2] >= level):
                continue
            fall = math.log2(kk[i] / kk[j])
            if worst is None or fall > worst[0]:
                worst = (fall, g1, g2)
    if worst is None:
        return A2Check(True, nan, nan, nan, nan,
                       f"A2 holds: n* does not fall with budget in >= {level:.0%} of refits{suffix}")
    _, g1, g2 = worst
    i, j = bb[g1], bb[g2]
    return A2Check(False, float(cc[g1]), float(cc[g2]), float(kk[i]), float(kk[j]),
                   f"A2 violated: n* falls from {kk[i]:g} at C = {cc[g1]:,.0f} to {kk[j]:g} at C = {cc[g2]:,.0f} "
                   f"(each beats the other there in {beats[i, j, g1]:.0%} and {beats[j, i, g2]:.0%} of refits)"
                   f"{suffix}: a search's A2 stop (science §9.4) may have stopped an n too early")


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
    x = vector("log10_c", log10_c)
    n_arr = vector("n_star", n_star)
    same_length(log10_c=x, n_star=n_arr)
    positive("n_star", n_arr)
    n = len(x)
    if (why := too_few_points(x, N_STAR_MIN_POINTS)) is not None:
        return _nan_n_star(n, why)
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
    best = best_curve_fit(_n_star_model, _n_star_jacobian, x, y, starts, lower, upper)
    if best is None:
        return _nan_n_star(n, "fit did not converge")
    theta, cov, resid = best
    lo, hi, k, c0 = (float(v) for v in theta)
    return NStarFit(
        lo=lo,
        hi=hi,
        k=k,
        c0=c0,
        lo_se=se(cov, 0),
        hi_se=se(cov, 1),
        k_se=se(cov, 2),
        c0_se=se(cov, 3),
        r2=r2(y, resid),
        n_points=n,
        status="ok",
    )
