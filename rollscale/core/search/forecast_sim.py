"""The forecast's proof by simulation (science §10, "what it must show"): per family, at 2x, 4x, 8x C_max.

The studies are :mod:`rollscale.core.search.simulate`'s (rollout axis, B_problem 16, C_max 40,000, every key of
``UNIVERSE`` = 2-16 trained to C_max; each seed moves a key's curve; evaluations Binomial(draws, R) / draws on the
§9.1 schedule), in all its families, plus two that break A4 (:data:`A4_BREAKING`), made from ``cross`` studies:

* ``tie_top``: n = 8 and n = 16 share n = 8's true curve: A(k) bends flat at the top, a kink no line follows;
* ``bend``: n = 16 bends away from the trend late: past C_max / 2 (:data:`BEND_AT`) its runs stop rising (their
  evaluations lowered by their curve's rise since then), a plateau no sigmoid of the family has. The half of the
  data the backtest keeps does not show it; the whole runs do. (A key that bends away early, a sigmoid with half
  the gain and the trend's rise at small C, is followed by its own deviation: measured, the surface covers it.)

Per study and multiple m the forecast at C* = m C_max (:func:`rollscale.core.fit.forecast.forecast_group`,
the trained keys) is judged against the true curves (a median seed's, as
:func:`rollscale.core.search.simulate_budget.true_reward`): coverage of each key's interval, whether the leader's
true reward is within epsilon of the true best ("right"), the share of keys "unknown"; the same of the interval
the fit stage and the report read (``*_cal``: the forecast at the answer's multiple, widened by the study's own
backtest there, :func:`rollscale.core.fit.backtest.calibrated`, science §11.4); the backtest
(:func:`rollscale.core.fit.backtest.backtest`) once per study; and whether the cap
(:func:`rollscale.core.fit.climb.climb_caps`) says the true best key at C* cannot catch up (it never should).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pandas as pd

from rollscale.core.fit.backtest import backtest, calibrated
from rollscale.core.fit.climb import climb_caps
from rollscale.core.fit.decision import fit_runs
from rollscale.core.fit.forecast import ForecastSettings, bootstrap_surface, forecast_group
from rollscale.core.search.simulate import (
    FAMILIES,
    MORE_FAMILIES,
    RISING_FAMILIES,
    UNIVERSE,
    SimStudy,
    grid_tables,
    make_studies,
    seed_curve,
)
from rollscale.core.search.simulate_budget import true_reward

__all__ = ["A4_BREAKING", "ALL_FAMILIES", "BEND_AT", "BENT_KEY", "forecast_studies", "judge_study", "study_evals",
           "summarise_forecast", "true_at"]

A4_BREAKING = ("tie_top", "bend")
BEND_AT = 0.5  # the bend family's key stops rising past this fraction of C_max
BENT_KEY = max(UNIVERSE)
ALL_FAMILIES = (*FAMILIES, *MORE_FAMILIES, *RISING_FAMILIES, *A4_BREAKING)


def _broken(study: SimStudy, family: str, i: int) -> SimStudy:
    curves = dict(study.curves)
    if family == "tie_top":
        curves[16] = curves[8]
    return replace(study, name=f"{family}-{i}", family=family, curves=curves)


def forecast_studies(families: tuple[str, ...], per_family: int, seed: int = 0, seeds: tuple[int, ...] = (0, 1),
                     eval_draws: int = 1600, schedule: tuple[float, int] = (500.0, 4)) -> list[SimStudy]:
    """``per_family`` studies of each family (:data:`ALL_FAMILIES`), ``seeds`` runs per key, evaluations of
    ``eval_draws`` samples (1,600: avg@16 over 100 problems) on the §9.1 schedule ``(c_first, per doubling)``."""
    out = []
    for j, family in enumerate(families):
        if family in A4_BREAKING:
            base = make_studies(per_family, seed + 1000 * (j + 1), ("cross",), seeds, schedule, eval_draws)
            out += [_broken(s, family, i) for i, s in enumerate(base)]
        elif family in FAMILIES or family in MORE_FAMILIES or family in RISING_FAMILIES:
            out += make_studies(per_family, seed + 1000 * (j + 1), (family,), seeds, schedule, eval_draws)
        else:
            raise ValueError(f"forecast simulation: unknown family {family!r} (one of {', '.join(ALL_FAMILIES)})")
    return out


def study_evals(studies: list[SimStudy]) -> pd.DataFrame:
    """Every study's full grid as evaluations with ``bucket`` (the study), ``n`` and ``seed`` (the ``bend``
    family's key flattened past :data:`BEND_AT` of C_max)."""
    runs, evals = grid_tables(studies)
    out = evals.merge(runs[["run_id", "bucket", "n", "seed"]], on="run_id")
    for s in studies:
        if s.family != "bend":
            continue
        c_bend = BEND_AT * s.c_max
        for seed in s.seeds:
            (r0, a, c_mid, beta), _ = seed_curve(s, BENT_KEY, seed)
            rows = (out["bucket"] == s.name) & (out["n"] == BENT_KEY) & (out["seed"] == seed) & (out["c"] > c_bend)
            c = out.loc[rows, "c"].to_numpy(float)
            rise = (min(a, 1.0) - r0) * (1 / (1 + (c_mid / c) ** beta) - 1 / (1 + (c_mid / c_bend) ** beta))
            out.loc[rows, "avg_at_k"] = out.loc[rows, "avg_at_k"] - rise
    return out


def true_at(study: SimStudy, n: int, c: float) -> float:
    """The study's true reward of key n at C (a median seed's curve; the bent key flat past its bend)."""
    if study.family == "bend" and n == BENT_KEY:
        c = min(c, BEND_AT * study.c_max)
    return true_reward(study, n, c)


def judge_study(study: SimStudy, evals: pd.DataFrame, settings: ForecastSettings,
                multiples: tuple[float, ...] = (2.0, 4.0, 8.0), tolerance: float = 0.02,
                with_backtest: bool = True, with_calibrated: bool = False) -> list[dict]:
    """One row per multiple (module docstring): ``covered`` and ``keys`` (counts), ``answered`` (a leader not unknown),
    ``right`` (NaN when none), ``unknown`` (share), with ``with_calibrated`` the same of the fit stage's interval
    (``covered_cal``, ``answered_cal``, ``right_cal``, ``width_cal``, ``widen``: the backtest's factor),
    ``width`` (median), ``regret``, ``backtest_failed``, ``a4_contradicted``, ``backtest_coverage``,
    ``backtest_max_z`` (the largest |z| of the backtest's keys; NaN without ``with_backtest``), ``cap_stops_best``, ``cap_stops``."""
    boot = bootstrap_surface(evals, "n", settings)
    bt = backtest(evals, "n", settings) if with_backtest else None
    curves = fit_runs(evals, "n", settings.a_max)
    keys = np.array(UNIVERSE)
    rows = []
    for m in multiples:
        c_star = m * study.c_max
        truth = np.array([true_at(study, int(k), c_star) for k in keys])
        judged = _judge(forecast_group(evals, "n", c_star, keys, settings, boot, curves), keys, truth, tolerance)
        if with_calibrated:  # as the fit stage reads it (rollscale.core.fit.horizon.horizon_tables)
            at = settings.at_answer(evals, c_star)
            cal = calibrated(bootstrap_surface(evals, "n", at), evals, "n", c_star)[0]
            judged |= {f"{k}_cal": v for k, v in _judge(forecast_group(evals, "n", c_star, keys, cal.settings, cal,
                                                                       curves), keys, truth, tolerance).items()}
            judged["widen"] = cal.settings.widen
        caps = climb_caps(evals, "n", c_star, tolerance, curves=curves)
        best = int(keys[int(np.argmax(truth))])
        rows.append({"group": study.name, "family": study.family, "multiple": m, "keys": len(keys), **judged,
                     "backtest_failed": bt.failed if bt else math.nan,
                     "a4_contradicted": bt.a4_contradicted if bt else math.nan,
                     "backtest_coverage": bt.coverage if bt else math.nan,
                     "backtest_max_z": float(np.nanmax(np.abs(bt.keys["z"]))) if bt else math.nan,
                     "cap_stops_best": bool(caps.loc[caps["key"] == best, "cannot_catch_up"].any()),
                     "cap_stops": int(caps["cannot_catch_up"].sum())})
    return rows


def _judge(table: pd.DataFrame, keys: np.ndarray, truth: np.ndarray, tolerance: float) -> dict:
    """One forecast table at C* against the truth there: keys covered, answered, right, regret, unknown, width."""
    covered = (table["reward_lo"].to_numpy() <= truth) & (truth <= table["reward_hi"].to_numpy())
    leader = table["leader"].iloc[0]
    # an answer: a leader whose own interval is narrow enough (else the group answers "unknown" at C*)
    if leader is not None and bool(table.loc[table["key"] == leader, "unknown"].iloc[0]):
        leader = None
    regret = float(truth.max() - truth[list(keys).index(int(leader))]) if leader is not None else math.nan
    return {"covered": int(covered.sum()), "answered": leader is not None,
            "right": bool(regret <= tolerance + 1e-12) if leader is not None else math.nan, "regret": regret,
            "unknown": float(table["unknown"].mean()), "width": float(table["width"].median())}


def summarise_forecast(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per family and multiple: studies, coverage (over keys x studies), answered (the leader's interval
    narrow enough), right (over the answered), unknown, median width, backtest failed and A4-contradicted shares,
    studies where the cap stopped the true best, keys the cap stopped; where judged (``judge_study``'s
    ``with_calibrated``) the same of the fit stage's calibrated interval and the backtest's median ``widen``."""
    def agg(t: pd.DataFrame) -> pd.Series:
        return pd.Series({"studies": len(t), "coverage": t["covered"].sum() / t["keys"].sum(),
                          "answered": t["answered"].mean(), "right": t["right"].astype(float).mean(),
                          "unknown": t["unknown"].mean(), "width": t["width"].median(),
                          "backtest_failed": t["backtest_failed"].mean(), "a4_flag": t["a4_contradicted"].mean(),
                          "cap_stops_best": int(t["cap_stops_best"].sum()), "cap_stops": t["cap_stops"].mean(),
                          **({"coverage_cal": t["covered_cal"].sum() / t["keys"].sum(),
                              "answered_cal": t["answered_cal"].mean(),
                              "right_cal": t["right_cal"].astype(float).mean(),
                              "width_cal": t["width_cal"].median(), "widen": t["widen"].median()}
                             if "covered_cal" in t else {})})
    return rows.groupby(["family", "multiple"], sort=False).apply(agg).reset_index()
