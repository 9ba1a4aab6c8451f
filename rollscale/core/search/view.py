"""What the search's fits say about a group: one view per decision, and the final answer (science §7, §8).

:func:`frontier_answer` reads the best key at each budget from final data, as
the search's fits see it (the simulation and the replay compare search and
grid with it); :func:`a2_contradicted` checks a final frontier against the
search's rule (a) stops. The decision rules themselves are in
:mod:`rollscale.core.search.decisions`, which re-exports both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from rollscale.core.fit.bootstrap import LEVEL, Bootstrap, interval
from rollscale.core.fit.columns import require
from rollscale.core.fit.curve_bank import POINT_COLUMNS, CurveBank, fit_curves
from rollscale.core.fit.frontier import a2_check, log_grid, pairwise_beats, reach_mask, refit_argmax, resolved_start
from rollscale.core.fit.tables import REWARD_MAX
from rollscale.core.search.state import SearchGroup, SearchSettings

__all__ = ["BRACKET_SHARE", "MIN_POINTS", "View", "a2_contradicted", "fit_bank", "frontier_answer", "group_view", "level"]

BRACKET_SHARE = 0.5  # science §8: an edge key best in >= 50 % of refits at some budget (§9.4: at C*)
# a stop or an add rests on fits with 2+ record points per parameter (benchmarks/search_sim.py: fewer let noise
# stop keys; the replay of the default grid: fewer added n = 32 on a 3-point fit of n = 16, docs/benchmarks.md)
MIN_POINTS = 8


@dataclass(frozen=True)
class View:
    """One group's fitted frontier on budgets ``c``: its usable keys, curves, refits and bounds."""

    keys: list
    rows: NDArray[np.int64]  # the keys' rows of the bank
    c: NDArray[np.float64]
    preds: NDArray[np.float64]  # keys x budgets
    refs: NDArray[np.float64]  # keys x refits x budgets
    allowed: NDArray[np.bool_]
    beyond: NDArray[np.bool_]
    best: NDArray[np.int64]  # index into keys, per budget
    shares: NDArray[np.float64]  # keys x budgets: share of refits whose argmax is the key (NaN below 2 seeds)
    lo: NDArray[np.float64]  # keys x budgets: one-sided 1 - alpha bounds of the curve (expanded percentile)
    hi: NDArray[np.float64]
    a_hi: NDArray[np.float64]
    seeds: NDArray[np.int64]
    points: NDArray[np.int64]  # record points behind each key's fit
    start: float | None  # where the frontier has risen by one record bin (None: not within the budgets)

    def at(self, c: float) -> int:
        return int(np.argmin(np.abs(np.log(self.c) - math.log(c))))


def group_view(bank: CurveBank, group: SearchGroup, extra: list[float], settings: SearchSettings) -> View | None:
    """``group``'s usable curves on a log grid of budgets (plus ``extra``); None when no key has a fit.

    Each key's curve counts up to eta times its data (A3,
    :func:`rollscale.core.fit.frontier.reach_mask`); bounds are one-sided
    1 - alpha (:func:`level`), shares of refits NaN below 2 seeds.
    """
    idx = bank.index(group.group)
    idx = idx[(bank.curves["status"].to_numpy()[idx] == "ok")]
    if not idx.size:
        return None
    c_low = float(np.nanmin(bank.curves["c_low"].to_numpy(float)[idx]))
    grid = log_grid(c_low, group.c_max, settings.grid_points) if c_low < group.c_max else np.array([group.c_max])
    c = np.unique(np.concatenate([grid, extra]))
    lvl = level(settings)
    preds, refs = bank.predict(idx, c), bank.predict_refits(idx, c)
    seeds = bank.curves["runs"].to_numpy(int)[idx]
    a_hi = bank.a_upper(idx, lvl, settings.eta)
    allowed, beyond = reach_mask(c, settings.eta * bank.curves["c_seen"].to_numpy(float)[idx], preds, a_hi)
    best = np.argmax(np.where(allowed, preds, -np.inf), axis=0)
    picked, _ = refit_argmax(refs, allowed)
    valid = picked >= 0
    with np.errstate(invalid="ignore"):
        shares = np.stack([(picked == i).sum(axis=0) / valid.sum(axis=0) for i in range(idx.size)])
    if seeds.min() < 2 or not settings.resamples:
        shares[:] = np.nan
    lo, hi = np.full(preds.shape, np.nan), np.full(preds.shape, np.nan)
    for k in np.unique(seeds):  # the interval's width depends on the seeds
        lo[seeds == k], hi[seeds == k] = interval(refs[seeds == k], int(k), axis=1, level=lvl)
    frontier = np.max(np.where(allowed, preds, -np.inf), axis=0)
    start = resolved_start(c, frontier, settings.bin_width)
    keys = [group.key_of(k) for k in bank.curves["key"].to_numpy()[idx]]
    points = bank.curves["n_points"].to_numpy(int)[idx]
    return View(keys, idx, c, preds, refs, allowed, beyond, best, shares, lo, hi, a_hi, seeds, points, start)


def level(settings: SearchSettings) -> float:
    """Two-sided level whose interval ends are one-sided 1 - alpha bounds."""
    return 1.0 - 2.0 * settings.alpha


def fit_bank(points: pd.DataFrame, settings: SearchSettings, cache: dict | None) -> CurveBank:
    """Every curve of ``points`` fitted (A <= 1 where the rewards lie in [0, 1], science §8 A1)."""
    a_max = REWARD_MAX if points["avg_at_k"].between(0.0, REWARD_MAX).all() else None
    return fit_curves(points, settings.bin_width, Bootstrap(settings.resamples, settings.bootstrap_seed), a_max,
                      cache)


def a2_contradicted(c: Any, best_key: Any, decisions: pd.DataFrame, group: str) -> str | None:
    """Whether a final frontier contradicts a rule (a) stop of the search (science §8, A2); None if not.

    Rule (a) stopped an n below the leader at its rung on the strength of A2
    (n* does not fall with budget). A final frontier whose best key at a
    later budget lies below that leader says n* fell after all, so the stop
    may have been wrong: the reason is returned for the report's warning.
    ``c`` / ``best_key`` are the final frontier's budgets and n*;
    ``decisions`` the ``search`` table.
    """
    cc, kk = np.asarray(c, float), np.asarray(best_key, float)
    mine = decisions[decisions["group"].to_numpy() == group] if len(decisions) else decisions
    stops = mine[(mine["action"].to_numpy() == "stop") & (mine["rule"].to_numpy() == "a")]
    for key, at, leader in sorted(set(zip(stops["key"], stops["c"].astype(float), stops["leader"], strict=True)),
                                  key=lambda t: t[1]):
        later = np.flatnonzero((cc > at) & (kk < float(leader)))
        if later.size:
            j = later[0]
            return (f"A2 contradicted: n = {key} was stopped at C = {at:,.0f} by rule (a) (n = {leader} "
                    f"led there), yet n* = {kk[j]:g} at C = {cc[j]:,.0f}: n* fell, the stop may have been wrong")
    return None


def frontier_answer(points: pd.DataFrame, groups: list[SearchGroup], settings: SearchSettings,
                    budgets: dict[str, NDArray[np.float64]] | None = None, cache: dict | None = None) -> pd.DataFrame:
    """The best key at each budget from final data, as the search's fits see it (science §7, §8).

    Per group, on ``budgets[group]`` (default: the budgets of a log grid of
    ``grid_points`` from the lowest record point to C_max, from where the
    frontier has risen by one record bin): ``best_key`` (text),
    ``best_share`` (share of refits that pick it; NaN below 2 seeds),
    ``extrapolated`` (a key beyond its reach could still beat
    it there), ``resolved`` (at or past the frontier's start) and, on the
    rollout axis, ``a2_holds`` (:func:`rollscale.core.fit.frontier.a2_check` on
    these budgets at the §7 level, 95 %; the same for every row of a group).
    """
    require(points, "points", POINT_COLUMNS)
    bnk = fit_bank(points[points["group"].isin([g.group for g in groups])], settings, cache)
    rows = []
    for g in groups:
        extra = list(budgets[g.group]) if budgets is not None else []
        v = group_view(bnk, g, extra, settings)
        if v is None:
            continue
        if budgets is not None:
            pick = np.searchsorted(v.c, np.asarray(extra, float))
        else:  # the view's log grid from where the frontier has risen by one record bin
            pick = np.flatnonzero(v.c >= (v.start if v.start is not None else v.c[0]))
        holds = None
        if g.axis == "rollout":
            one = v.seeds.min() < 2 or v.refs.shape[1] == 0
            beats = pairwise_beats((v.preds[:, None, :] if one else v.refs)[:, :, pick], v.allowed[:, pick])
            holds = a2_check(v.c[pick], v.keys, v.best[pick], beats, LEVEL).holds
        for j in pick:
            b = int(v.best[j])
            rows.append({"group": g.group, "c": float(v.c[j]), "best_key": str(v.keys[b]),
                         "best_share": float(v.shares[b, j]), "extrapolated": bool(v.beyond[:, j].any()),
                         "resolved": v.start is not None and v.c[j] >= v.start, "a2_holds": holds})
    columns = ["group", "c", "best_key", "best_share", "extrapolated", "resolved", "a2_holds"]
    return pd.DataFrame(rows, columns=columns)
