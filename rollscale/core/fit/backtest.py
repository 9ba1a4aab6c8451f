"""The study's own backtest of its forecast, at the answer's multiple (science §10.3, §11.4).

With ``m = C* / c_max`` (the multiple the answer is read past the data), every run of a group is cut at ``1 / m``
of the budget it reached; the forecast (:func:`rollscale.core.fit.forecast.bootstrap_surface`, the settings'
form) is fitted on what is left, and each trained key's reward is forecast at ``c_end``, the budget all its runs
reached. What the key reached there is its per-run §9.3 value (:func:`rollscale.core.fit.decision.key_rewards`
on the whole runs: each run's own sigmoid at the group's R0) with its t interval. A key is covered when that
value lies in the forecast's interval. Where ``m`` is more than the runs can cut (a key left with fewer than
:data:`MIN_CUT_BUDGETS` budgets past step 0), the backtest says so and tests the largest multiple it can
(``multiple`` is the one tested), and the answer's interval is widened further by the ratio of the doublings it is
read past the data to the doublings tested, ``log2 m / log2 m_tested`` (:func:`untested_factor`): a doubling no
backtest reached is not trusted as one it did. Measured on the long grids (docs/results.md 2e): from runs cut at
20,000 the backtest reaches 4x, not 8x; the forecasts' mean errors at 8x were 1.5 to 20 times those at 4x (the
curves still leaving their early regime), and intervals calibrated at 4x alone covered 11 of 15 keys (15 with it).

Reported: the signed mean error, RMSE and coverage, and ``widen``: the factor by which the forecast's half
widths must grow to have covered the backtest's errors (split-conformal, science §11.4: the errors over the
half width on the side of each miss, their ``ceil((n + 1) level) / n`` quantile, the largest with few keys;
never below 1). The answer's interval is read with it (``ForecastSettings.widen``). ``widen_d`` is the same
calibration of ``D_k = R_k - R_L`` to the cut forecast's leader, from the errors of D (forecast D minus reached
D): an error every key shares (the whole group forecast low, as on the embedded default) widens the rewards, not
their differences, so the keys' standing is read on D's own errors (``ForecastSettings.widen_d``; ``widen``
where no D error can be read).

The backtest fails, and the study's forecast is not to be trusted past its data, when

* the intervals cover fewer than 2/3 of the keys, or
* **A4 is contradicted**: some key's reached value lies off its forecast by more than the forecast allows for
  *these runs*: ``z = (reached - forecast) / se``, ``se`` the half width (on the side of the miss) over the
  normal quantile of the forecast's interval from refits that keep every run once
  (:func:`rollscale.core.fit.forecast.same_runs`: evaluation noise redrawn, the seeds not resampled), outside
  the family-wise ``level`` interval over the K keys (Bonferroni: ``|z| > z_{1 - (1 - level) / (2 K)}``). The
  reached value is read on the same runs as the forecast, so the seeds' spread, which the forecast's own
  interval holds to cover the key's true reward, is no part of a miss: measured with it (the forecast's interval
  as ``se``), the bent key of the simulated ``bend`` family (it stops rising past the cut) lay at |z| 0.9-1.8
  and no study was flagged. A familywise bound, not each key's 95 %: at 1.96, 8-50 % of the studies of families
  where A4 holds were flagged. Coverage is read on the forecast's own interval, the one the study reports.

Degenerate data (too few evaluations, a flat curve, validation solved at step 0) give a failed backtest whose
note says why, never an error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
from scipy.stats import norm
from scipy.stats import t as student_t

from rollscale.core.fit.decision import fit_runs, key_rewards
from rollscale.core.fit.forecast import (
    DEFAULT_MULTIPLE,
    ForecastSettings,
    SurfaceBootstrap,
    answer_multiple,
    bootstrap_surface,
    interval,
    leader_index,
    predict,
    same_runs,
    spread,
    to_leader,
)

__all__ = ["BACKTEST_COLUMNS", "Backtest", "DEFAULT_MULTIPLE", "MIN_CUT_BUDGETS", "answer_multiple", "backtest",
           "calibrated", "calibration", "cut_runs",
           "cuttable_multiple", "untested_factor"]

BACKTEST_COLUMNS = ["key", "c_cut", "c_end", "forecast", "forecast_lo", "forecast_hi", "reached", "reached_lo",
                    "reached_hi", "covered", "error", "z", "off_surface"]
COVERAGE_MIN = 2.0 / 3.0  # science §10.3
MIN_CUT_BUDGETS = 3  # budgets past step 0 a key keeps after the cut: fewer carry no rise per doubling


@dataclass(frozen=True)
class Backtest:
    """Per key the forecast from the cut runs against what the whole runs reached; the verdict and its words."""

    keys: pd.DataFrame  # BACKTEST_COLUMNS
    coverage: float
    mean_error: float  # forecast minus reached, averaged over keys
    mean_abs_error: float
    a4_contradicted: bool
    failed: bool
    note: str
    rmse: float = math.nan
    multiple: float = math.nan  # the multiple tested (the answer's, or the largest the runs can cut)
    widen: float = 1.0  # the interval's calibration (module docstring)
    widen_d: float = 1.0  # D's (module docstring)


def cut_runs(evals: pd.DataFrame, fraction: float = 0.5) -> pd.DataFrame:
    """Each run's evaluations up to ``fraction`` of the largest C it reached (its step 0 kept)."""
    if not 0 < fraction < 1:
        raise ValueError(f"backtest fraction: expected in (0, 1), got {fraction}")
    reach = evals.groupby("run_id")["c"].transform("max")
    return evals[evals["c"] <= fraction * reach * (1 + 1e-9)]


def _cut_budgets(evals: pd.DataFrame, key_col: str, fraction: float) -> int:
    """The fewest distinct budgets past step 0 any key keeps after the cut."""
    cut = cut_runs(evals, fraction)
    per_key = cut[cut["c"] > 0].groupby(key_col)["c"].nunique().reindex(evals[key_col].unique()).fillna(0)
    return int(per_key.min()) if len(per_key) else 0


def cuttable_multiple(evals: pd.DataFrame, key_col: str, multiple: float) -> float:
    """``multiple`` when every key keeps :data:`MIN_CUT_BUDGETS` budgets cut at ``1 / multiple``, else the largest
    quarter-doubling below it that does (NaN: not even a cut at 1.19)."""
    m = float(multiple)
    while m > 2 ** 0.25 - 1e-9:
        if _cut_budgets(evals, key_col, 1.0 / m) >= MIN_CUT_BUDGETS:
            return m
        m /= 2 ** 0.25
    return math.nan


def untested_factor(wanted: float, tested: float) -> float:
    """The widening for the doublings past the data the backtest could not reach (module docstring): ``log2 wanted
    / log2 tested``, 1 where the backtest reached the answer's multiple."""
    if not (math.isfinite(tested) and tested > 1.0) or wanted <= tested * (1 + 1e-9):
        return 1.0
    return math.log2(wanted) / math.log2(tested)


def calibration(errors: np.ndarray, half_widths: np.ndarray, level: float) -> float:
    """The split-conformal widening (module docstring): >= 1, 1 without errors to read."""
    ok = np.isfinite(errors) & np.isfinite(half_widths)
    if not ok.any():
        return 1.0
    ratio = np.abs(errors[ok]) / np.maximum(half_widths[ok], 1e-9)
    n = ratio.size
    rank = math.ceil((n + 1) * level)
    q = float(np.sort(ratio)[min(rank, n) - 1])
    return max(1.0, q)


def backtest(evals: pd.DataFrame, key_col: str, settings: ForecastSettings = ForecastSettings(),
             fraction: float | None = None, multiple: float | None = None) -> Backtest:
    """The backtest of one group (module docstring) at the answer's ``multiple`` (C* / c_max), or cut at
    ``fraction`` (§10.3's half when neither is given)."""
    wanted = multiple if multiple is not None else (1.0 / fraction if fraction is not None else DEFAULT_MULTIPLE)
    if not wanted > 1:
        raise ValueError(f"backtest multiple: expected > 1, got {wanted}")
    m = cuttable_multiple(evals, key_col, wanted)
    empty = pd.DataFrame(columns=BACKTEST_COLUMNS)
    if not math.isfinite(m):
        return Backtest(empty, math.nan, math.nan, math.nan, False, True,
                        f"no backtest: not enough evaluations to cut (fewer than {MIN_CUT_BUDGETS} budgets a key "
                        "past step 0 even at the smallest cut): not to be trusted past the data")
    cut = cut_runs(evals, 1.0 / m)
    boot = bootstrap_surface(cut, key_col, settings)
    if boot.reason:
        return Backtest(empty, math.nan, math.nan, math.nan, False, True, f"no backtest: {boot.reason}",
                        multiple=m)
    keys = boot.data.keys
    reach = evals.groupby("run_id")["c"].max()
    run_key = evals.drop_duplicates("run_id").set_index("run_id")[key_col]
    c_end = np.array([float(reach[run_key.index[run_key == k]].min()) for k in keys])
    c_cut = np.array([float(cut.loc[cut[key_col] == k, "c"].max()) for k in keys])
    point, refits = predict(boot, keys, c_end)
    top = settings.top
    lo, hi = interval(point, refits, spread(boot), settings.level, (0.0, top))
    reached, r_lo, r_hi = _reached(evals, key_col, keys, c_end, settings)
    own_point, own_refits = predict(same_runs(boot), keys, c_end)
    own_lo, own_hi = interval(own_point, own_refits, 1.0, settings.level, (0.0, top))
    z_half = norm.ppf(0.5 + settings.level / 2)
    with np.errstate(invalid="ignore", divide="ignore"):
        side = np.where(reached >= own_point, own_hi - own_point, own_point - own_lo)
        z = np.where(side > 1e-9, z_half * (reached - own_point) / side, math.nan)
    known = np.isfinite(reached) & np.isfinite(point)
    bound = norm.ppf(1 - (1 - settings.level) / (2 * max(int(known.sum()), 1)))
    off = known & (np.abs(z) > bound)
    covered = known & (reached >= lo) & (reached <= hi)
    table = pd.DataFrame({"key": keys, "c_cut": c_cut, "c_end": c_end, "forecast": point, "forecast_lo": lo,
                          "forecast_hi": hi, "reached": reached, "reached_lo": r_lo, "reached_hi": r_hi,
                          "covered": covered, "error": point - reached, "z": z, "off_surface": off})
    n = int(known.sum())
    err = (point - reached)[known]
    coverage = float(covered[known].mean()) if n else math.nan
    mean_error = float(err.mean()) if n else math.nan
    mae = float(np.abs(err).mean()) if n else math.nan
    rmse = float(np.sqrt(np.mean(err**2))) if n else math.nan
    half = np.where(reached >= point, hi - point, point - lo)[known]
    widen = calibration(err, half, settings.level)
    widen_d = _calibration_of_d(point, refits, reached, known, boot, settings.level, top, widen)
    untested = untested_factor(wanted, m)
    a4 = bool(off.any())
    failed = bool(n == 0 or coverage < COVERAGE_MIN - 1e-12 or a4)
    note = (f"forecast {m:.2g}x past 1/{m:.2g} of the data covered {int(covered.sum())} of {n} keys' final "
            f"rewards; mean error {mean_error:+.3f}, RMSE {rmse:.3f}")
    if m < wanted - 1e-9:
        note = f"the runs cannot be cut at 1/{wanted:.2g} (too few evaluations before); tested at {m:.2g}x: " + note
    if widen > 1.0 + 1e-9:
        note += f"; the interval widened {widen:.2f}x to cover these errors"
        note += f" (D to the leader {widen_d:.2f}x, on D's own errors)"
    if untested > 1.0 + 1e-9:
        widen, widen_d = widen * untested, widen_d * untested
        note += (f"; {untested:.2f}x more for the doublings past {m:.2g}x no backtest reached (the interval "
                 f"{widen:.2f}x in all)")
    if n == 0:
        note = "no key's runs could be fitted to compare the forecast with: not to be trusted past the data"
    elif failed:
        why = [f"coverage below {COVERAGE_MIN:.2f}"] if coverage < COVERAGE_MIN - 1e-12 else []
        why += [f"A4 contradicted: key {int(k)} off the forecast (z = {v:+.1f})"
                for k, v in zip(keys[off], z[off], strict=True)]
        note += "; not to be trusted past the data (" + "; ".join(why) + ")"
    return Backtest(table, coverage, mean_error, mae, a4, failed, note, rmse, m, widen, widen_d)


def _calibration_of_d(point: np.ndarray, refits: np.ndarray, reached: np.ndarray, known: np.ndarray,
                      boot: SurfaceBootstrap, level: float, top: float, fallback: float) -> float:
    """``widen_d`` (module docstring): the split-conformal widening of D to the cut forecast's leader, from each
    other key's error of D; ``fallback`` (the rewards' widening) where the leader or no other key was reached."""
    finite = np.flatnonzero(np.isfinite(point))
    if not finite.size:
        return fallback
    lead = leader_index(refits, finite)
    others = known & (np.arange(point.size) != lead)
    if not (known[lead] and others.any()):
        return fallback
    d_point, d_lo, d_hi = to_leader(point, refits, lead, boot, level, top)
    d_reached = reached - reached[lead]
    half = np.where(d_reached >= d_point, d_hi - d_point, d_point - d_lo)
    return calibration((d_point - d_reached)[others], half[others], level)


def calibrated(boot: SurfaceBootstrap, evals: pd.DataFrame, key_col: str, c_star: float
               ) -> tuple[SurfaceBootstrap, Backtest]:
    """``boot`` with its interval widened by the group's backtest at the answer's multiple (science §11.4), and
    that backtest: the fit stage and track call this, so that both read one interval. The search settles keys, at
    C_max only, on the uncalibrated interval (calibrated there too, simulated: fewer studies decided and more seeds
    spent; docs/journal/2026-11-29-calibrated-search.md)."""
    bt = backtest(evals, key_col, replace(boot.settings, widen=1.0, widen_d=1.0),
                  multiple=answer_multiple(evals, c_star))
    return replace(boot, settings=replace(boot.settings, widen=bt.widen, widen_d=bt.widen_d)), bt


def _reached(evals: pd.DataFrame, key_col: str, keys: np.ndarray, c_end: np.ndarray,
             settings: ForecastSettings) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each key's per-run §9.3 value at its ``c_end`` on the whole runs, with its t interval (NaN: no fit)."""
    curves = fit_runs(evals, key_col, settings.a_max)
    out = np.full((3, keys.size), math.nan)
    for c in np.unique(c_end):
        est = key_rewards(curves, float(c))
        q = float(student_t.ppf(0.5 + settings.level / 2, est.df)) if est.df else math.nan
        for i in np.flatnonzero(c_end == c):
            j = np.flatnonzero(est.keys == keys[i])
            if j.size:
                r, half = est.reward[j[0]], q * math.sqrt(est.var[j[0]])
                out[:, i] = r, r - half, r + half
    return out[0], out[1], out[2]
