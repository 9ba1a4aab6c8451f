"""Frontier search (science §8): the best key at every budget for a fraction of the grid's rollouts.

Runs advance together in rungs of budget c_1 < ... < c_R = C_max spaced by
eta. After each rung, :func:`decide` refits every key's §7 sigmoid and its
bootstrap over seeds on the points seen so far (:mod:`rollscale.core.fit.curve_bank`;
A <= 1 for rewards in [0, 1], A1) and decides, for every run in play:

* **stop** a key that cannot be best at any budget still to come, by the
  first rule that holds: (a) rollout axis only, under A2 (n* does not fall
  with budget): an n below the leader's n at c_r, beaten there by the leader
  in >= 1 - alpha of refits; (b) the upper bound of its asymptote A below the
  leader's lower bound at c_r; (c) when C_max <= eta c_r (A3: a fit is trusted
  eta times past its data), its upper bound below the leader's lower bound at
  every budget in [c_r, C_max]. Bounds are 1 - alpha bootstrap intervals
  (:func:`rollscale.core.fit.bootstrap.interval`). The leader at a budget is the
  argmax of the fitted curves there, each curve used within eta times its
  data (:func:`rollscale.core.fit.frontier.reach_mask`). A key without a fit (too
  few points), or before the frontier has risen by one record bin, is never
  stopped; its row says why. Otherwise **continue** to the next rung.
* **add** (the bracket; not for rules): where the grid's first or last key in
  play is the best key in >= 50 % of refits at some budget the fits reach
  (up to eta c_r), and its fit rests on :data:`MIN_POINTS` record points or
  more, the key beyond it (n / 2 or 2 n, within the group's bracket limits)
  joins with the group's seeds and catches up to the next rung.
* **seed** (last rung, with ``extra_seeds``): at a budget where no key is best
  in >= 1 - alpha of refits, the two keys sharing it each get one more seed
  (up to the cap); the runs train to the key's budget and the last rung is
  decided again. Runs at C_max **finish**.

Every decision is a row of the ``search`` table (:data:`DECISION_COLUMNS`)
with the numbers behind it. The search is deterministic: the state is read
back from the decision rows (:func:`rollscale.core.search.state.group_state`)
and the bootstrap draws are seeded per (group, key), so a rerun resumes to
the same decisions.

How the sweep stage drives it (one loop, any executor)::

    settings = SearchSettings(eta=s.eta, alpha=s.alpha, first_rung=s.first_rung, extra_seeds=s.extra_seeds,
                              resamples=fit.bootstrap_resamples, bootstrap_seed=fit.bootstrap_seed,
                              bin_width=fit.bin_width, grid_points=fit.grid_points,
                              eval_every=sweep.eval_every)          # s = params.sweep.search, fit = params.fit
    lo, hi = bracket_limits("rollout", b_problem, sweep.b_max, s.key_min, s.key_max)
    groups = [SearchGroup("easy/uniform/B_problem=16", "rollout", tuple(sweep.n), tuple(sweep.seeds),
                          sweep.c_max, fixed=b_problem, key_min=lo, key_max=hi)]   # one per family x fixed
    decisions, cache = empty_decisions(), {}
    while not (todo := plan(groups, decisions, settings)).empty:
        train each (group, key, seed) run of ``todo`` to budget ``c`` (a new key or seed starts from scratch; the
            run store resumes the others; a run stops at the first step with C >= c and evaluates there,
            which with ``eval_every`` set is one of its regular evaluations)
        points = every evaluation of the groups' runs so far: POINT_COLUMNS (+ ``b`` = n * B_problem)
        decisions = pd.concat([decisions, decide(points, groups, decisions, settings, cache)], ignore_index=True)
        write ``decisions`` (the ``search`` table) before training on: a crash resumes from it

Rungs are barriers per group only: every run of ``todo`` can start at once.
Axis and key per design: rollout (key n, ``fixed`` B_problem), prompt (key
B_problem, ``fixed`` n), iso_batch (key n, ``fixed`` the total batch B),
rule (key: the rule's name, ``fixed`` None, no bracket);
:func:`rollscale.core.search.replay.replay_groups` builds them from a
finished grid's tables. ``decide`` reads each run only up to the budget the
decisions trained it to, so a store holding more (a grid run earlier) gives
the same decisions. A run whose key was stopped is a finished run with a
shorter C: its last decision row (``action == "stop"``, ``rule``, ``c``,
``c_train``) says where and why. :func:`frontier_answer` gives the best key
per budget on final data (the simulation's and the replay's comparison of
search and grid); :func:`a2_contradicted` checks the final frontier against
the rule (a) stops (a report warning, beside the fit stage's ``a2_check`` row).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from rollscale.core.fit.bootstrap import interval
from rollscale.core.fit.columns import require
from rollscale.core.fit.curve_bank import POINT_COLUMNS, CurveBank
from rollscale.core.search.budget import decide_group as decide_at_budget
from rollscale.core.search.budget import standings
from rollscale.core.search.state import (
    ACTIONS,
    AXES,
    DECISION_COLUMNS,
    GroupState,
    SearchGroup,
    SearchSettings,
    bracket_limits,
    empty_decisions,
    group_state,
    leg_budget,
    plan,
    rung_budgets,
    run_budgets,
    states,
    truncate,
)
from rollscale.core.search.view import (
    BRACKET_SHARE,
    MIN_POINTS,
    View,
    a2_contradicted,
    fit_bank,
    frontier_answer,
    group_view,
    level,
)

__all__ = [
    "ACTIONS",
    "AXES",
    "DECISION_COLUMNS",
    "MIN_POINTS",
    "POINT_COLUMNS",
    "SearchGroup",
    "SearchSettings",
    "a2_contradicted",
    "bracket_limits",
    "decide",
    "empty_decisions",
    "frontier_answer",
    "group_state",
    "leg_budget",
    "plan",
    "rung_budgets",
    "run_budgets",
    "truncate",
]



def _numbers(view: View | None, k: int | None, j: int, later: NDArray[np.bool_] | None,
             settings: SearchSettings) -> dict[str, Any]:
    """The numbers a key's row carries at budget index ``j`` (its leader, bounds, its best share later)."""
    nan = math.nan
    out = {"leader": None, "beaten_share": nan, "margin_lo": nan, "a_hi": nan, "leader_lo": nan, "key_hi": nan,
           "best_share": nan, "at_c": nan}
    if view is None:
        return out
    lead = int(view.best[j])
    out.update(leader=str(view.keys[lead]), leader_lo=float(view.lo[lead, j]))
    if k is None:
        return out
    out.update(a_hi=float(view.a_hi[k]), key_hi=float(view.hi[k, j]))
    if later is not None and later.any() and np.isfinite(view.shares[k, later]).any():
        jj = np.flatnonzero(later)[int(np.nanargmax(view.shares[k, later]))]
        out.update(best_share=float(view.shares[k, jj]), at_c=float(view.c[jj]))
    if lead != k and view.seeds[k] >= 2 and view.seeds[lead] >= 2:
        a, b = view.refs[lead, :, j], view.refs[k, :, j]
        ok = np.isfinite(a) & np.isfinite(b)
        out["beaten_share"] = float(np.mean(a[ok] > b[ok])) if ok.any() else nan
        seeds = int(min(view.seeds[k], view.seeds[lead]))
        out["margin_lo"] = float(interval(a - b, seeds, level=level(settings))[0]) if ok.all() else nan
    return out


def _stop_rule(view: View, k: int, j: int, group: SearchGroup, c_r: float, settings: SearchSettings,
               nums: dict[str, Any]) -> tuple[str, str, str]:
    """(action, rule, note) for a usable key at rung budget ``c_r`` (index ``j``)."""
    lead = int(view.best[j])
    if view.start is None or c_r < view.start:
        return "continue", "none", "the frontier has not risen by one record bin by c_r: nothing is decided yet"
    if lead == k:
        return "continue", "none", "leader at c_r"
    if min(view.points[k], view.points[lead]) < MIN_POINTS:
        return "continue", "none", f"fits on fewer than {MIN_POINTS} record points: too thin to stop a key on"
    name, leader = view.keys[k], view.keys[lead]
    if group.axis == "rollout" and name < leader and nums["margin_lo"] > 0:
        return "stop", "a", (f"A2: n = {name} is below the leader n = {leader}, beaten by it at c_r in "
                             f"{nums['beaten_share']:.0%} of refits, the lower bound of the margin "
                             f"{nums['margin_lo']:.3g} > 0")
    if view.a_hi[k] < view.lo[lead, j]:
        return "stop", "b", (f"its asymptote's upper bound {view.a_hi[k]:.4g} is below the leader {leader}'s "
                             f"lower bound {view.lo[lead, j]:.4g} at c_r")
    if group.c_max <= settings.eta * c_r * (1 + 1e-9):
        rest = view.c >= c_r * (1 - 1e-9)
        leaders = view.best[rest]
        if (leaders != k).all() and (view.hi[k, rest] < view.lo[leaders, np.flatnonzero(rest)]).all():
            return "stop", "c", ("its upper bound is below the leader's lower bound at every budget in "
                                 "[c_r, C_max] (C_max <= eta c_r: the fits reach)")
    return "continue", "none", "could still be best at a budget to come"


def _bracket(view: View | None, group: SearchGroup, st: GroupState, c_r: float, settings: SearchSettings,
             ) -> list[tuple[Any, int, dict[str, Any], str]]:
    """Keys to add beyond a grid edge: (key, edge index, numbers, note)."""
    if view is None or group.axis == "rule" or len(view.keys) < 2 or view.start is None:
        return []
    reach = (view.c >= view.start) & (view.c <= min(group.c_max, settings.eta * c_r) * (1 + 1e-9))
    out = []
    for edge, cand in ((min(st.keys), min(st.keys) // 2), (max(st.keys), max(st.keys) * 2)):
        if edge not in view.keys or cand in st.keys or cand == edge or not group.allows(cand):
            continue
        k = view.keys.index(edge)
        if view.points[k] < MIN_POINTS:  # as for a stop: a thin fit's edge win is noise as often as not
            continue
        share = view.shares[k, reach] if reach.any() else np.array([])
        if not share.size or not np.isfinite(share).any() or np.nanmax(share) < BRACKET_SHARE:
            continue
        jj = np.flatnonzero(reach)[int(np.nanargmax(share))]
        nums = {"leader": str(edge), "best_share": float(view.shares[k, jj]), "at_c": float(view.c[jj])}
        side = "first" if cand < edge else "last"
        out.append((cand, k, nums, f"{edge}, the {side} key in play, is best at C = {view.c[jj]:,.0f} in "
                                   f"{view.shares[k, jj]:.0%} of refits: add {cand}"))
    return out


def _extra_seeds(view: View | None, group: SearchGroup, st: GroupState, settings: SearchSettings,
                 ) -> list[tuple[Any, int, dict[str, Any], str]]:
    """(key, new seed, numbers, note) where the last rung leaves a budget undecided."""
    if view is None or not settings.extra_seeds or view.start is None or np.isnan(view.shares).all():
        return []
    cap = len(group.seeds) + settings.extra_seeds
    span = view.c >= view.start
    top = np.nanmax(view.shares, axis=0)
    undecided = np.flatnonzero(span & (top < 1.0 - settings.alpha))
    wanted: dict[int, int] = {}
    for j in undecided:
        for k in np.argsort(-np.nan_to_num(view.shares[:, j]), kind="stable")[:2]:
            if view.shares[k, j] > 0 and int(k) not in wanted:
                wanted[int(k)] = int(j)
    out = []
    for k, j in sorted(wanted.items()):
        key = view.keys[k]
        if len(st.seeds[key]) >= cap:
            continue
        others = ", ".join(f"{view.keys[i]}: {view.shares[i, j]:.0%}" for i in np.flatnonzero(view.shares[:, j] > 0))
        nums = {"best_share": float(view.shares[k, j]), "at_c": float(view.c[j])}
        out.append((key, max(st.seeds[key]) + 1, nums, f"undecided at C = {view.c[j]:,.0f} ({others} of refits)"))
    return out


def _decide_group(group: SearchGroup, st: GroupState, bank: CurveBank, settings: SearchSettings) -> list[dict]:
    r, budgets = int(st.rung), st.budgets  # type: ignore[arg-type]
    c_r, last = float(budgets[r - 1]), r == len(budgets)
    next_c = float(group.c_max if last else budgets[r])  # c_train: each run's leg budget (leg_budget)
    view = group_view(bank, group, [c_r], settings)
    j = view.at(c_r) if view is not None else 0
    mine = bank.index(group.group)
    keys = bank.curves["key"].to_numpy()[mine]
    points = dict(zip(keys, bank.curves["n_points"].to_numpy()[mine], strict=True))
    status = dict(zip(keys, bank.curves["status"].to_numpy()[mine], strict=True))
    base = {"group": group.group, "decision": st.decision, "rung": r, "c": c_r}
    rows: list[dict] = []

    def emit(key: Any, seeds: Any, action: str, rule: str, c_train: float, nums: dict, note: str) -> None:
        n_points = int(points.get(key, 0))
        for seed in seeds:
            rows.append({**base, "key": str(key), "seed": int(seed), "action": action, "rule": rule,
                         "c_train": c_train, **nums, "n_points": n_points, "note": note})

    later = view.c >= c_r * (1 - 1e-9) if view is not None else None
    for key in st.keys:
        if key in st.stopped:
            continue
        k = view.keys.index(key) if view is not None and key in view.keys else None
        nums = _numbers(view, k, j, later, settings)
        here, ahead = leg_budget(group, key, c_r, settings), leg_budget(group, key, next_c, settings)
        if last:
            emit(key, st.seeds[key], "finish", "budget", here, nums, "reached C_max")
        elif k is None:
            why = status.get(key, "no evaluations yet")
            emit(key, st.seeds[key], "continue", "none", ahead, nums, f"no fit ({why}): never stopped")
        else:
            action, rule, note = _stop_rule(view, k, j, group, c_r, settings, nums)  # type: ignore[arg-type]
            emit(key, st.seeds[key], action, rule, here if action == "stop" else ahead, nums, note)
    for key, _, nums, note in _bracket(view, group, st, c_r, settings):
        emit(key, group.seeds, "add", "bracket", leg_budget(group, key, next_c, settings),
             {**_numbers(None, None, 0, None, settings), **nums}, note)
    if last:
        for key, seed, nums, note in _extra_seeds(view, group, st, settings):
            budget = st.stopped.get(key, float(group.c_max))
            emit(key, [seed], "seed", "undecided", budget, {**_numbers(None, None, 0, None, settings), **nums}, note)
    return rows


def decide(points: pd.DataFrame, groups: list[SearchGroup], decisions: pd.DataFrame,
           settings: SearchSettings, cache: dict | None = None) -> pd.DataFrame:
    """The next decision of every group whose search is not done: new rows of the ``search`` table.

    ``points``: the groups' evaluations, :data:`POINT_COLUMNS` (``key`` as
    the group types it), optionally ``b`` (rollouts per step, for
    :func:`rollscale.core.search.state.truncate`). Each run is read only up to
    the budget the decisions so far trained it to, so extra rows (a run
    trained further earlier, a grid replayed) change nothing. With
    ``settings.method == "decision"`` the rows are science §9.4's
    (:func:`rollscale.core.search.budget.decide_group`, on the decision's own
    fits, :mod:`rollscale.core.fit.decision`); the loop around it is the same.
    """
    require(points, "points", POINT_COLUMNS)
    names = [g.group for g in groups]
    if len(set(names)) != len(names):
        raise ValueError(f"groups: names must be unique, got {names}")
    budgets = run_budgets(groups, decisions, settings)
    pending = [g for g in groups if (budgets["group"] == g.group).any()]
    if not pending:
        return empty_decisions()
    pts = truncate(points[points["group"].isin([g.group for g in pending])], budgets)
    sts = states(pending, decisions, settings)
    if settings.method == "decision":  # science §9.4: the decision at C* (rollscale.core.search.budget)
        rungs = {g.group: float(st.budgets[int(st.rung) - 1]) for g, st in zip(pending, sts, strict=True)}
        tables = standings(pts, pending, rungs, settings)
        rows = [r for g, st in zip(pending, sts, strict=True)
                for r in decide_at_budget(g, st, tables.get(g.group), settings)]
    else:  # science §8
        bank = fit_bank(pts, settings, cache)
        rows = [r for g, st in zip(pending, sts, strict=True) for r in _decide_group(g, st, bank, settings)]
    out = pd.DataFrame(rows, columns=DECISION_COLUMNS)
    return out.astype({"decision": int, "rung": int, "seed": int, "n_points": int})
