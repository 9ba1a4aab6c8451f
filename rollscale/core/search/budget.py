"""The search that stops when the decision is made (science §9.4): the answer at C* for part of the grid.

``sweep.search.method: decision``. Runs advance in the rungs of §8
(:func:`rollscale.core.search.state.rung_budgets`); every key starts with the
group's seeds (``seeds_min``). After each rung :func:`decide_group` reads the
decision at the target budget C* (:func:`standing`: each key's reward
``R_k(C*)`` over refits, the leader L with the largest median, and the
one-sided 1 - alpha bounds of ``D_k = R_k(C*) - R_L(C*)``) and, per key:

* **stop**, rule ``epsilon``: settled, the upper bound of D_k is <= epsilon
  (``tolerance``): it cannot beat the leader at C* by more than epsilon;
* **stop**, rule ``a2``: settled on the rollout axis under A2, an n below the
  leader's n that the leader beats at the current rung in >= 1 - alpha of
  refits (it will not overtake at a larger budget);
* **stop**, rule ``decided``: the leader, once every other key is settled
  (the group is done: the answer is the leader);
* otherwise the leader and the unsettled keys **continue** to the next rung;
  at C_max they **finish** (rule ``budget``), and a **seed** (rule
  ``undecided``) goes to the leader and to the unsettled key with the
  largest upper bound of D_k, each up to ``seeds_max`` seeds, and the last
  rung is decided again; with both at the cap the leader's and that key's
  rows say "not decided" (rule ``undecided``) and the group is done;
* **add** (rule ``bracket``, not for rules): the first or last key in play
  is best at C* in >= 50 % of refits: the key beyond it joins with the
  group's seeds and catches up.

A key whose C* lies beyond eta times its data (A3) is unknown: it cannot be
settled. A key without a fit, or with fewer than :data:`MIN_POINTS` record
points (it or the leader), is not settled either. Every row carries C*
(``c_star``), the key's median reward there (``r_star``) and the bounds of
D_k (``d_lo``, ``d_hi``) beside §8's columns.

:func:`standing` is the one place the decision's numbers come from: it reads
the search's curve bank (:mod:`rollscale.core.fit.curve_bank`: each key's §7
sigmoid, its seeds resampled per key) at C*. That is the interval of §7, not
yet §9.3's (one shared R0, paired refits, the seed spread pooled across
keys), which is built apart (issue 28) and is meant to replace this
function's body with the same return value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from rollscale.core.fit.bootstrap import interval
from rollscale.core.fit.curve_bank import CurveBank
from rollscale.core.search.state import GroupState, SearchGroup, SearchSettings, leg_budget
from rollscale.core.search.view import BRACKET_SHARE, MIN_POINTS, group_view, level

__all__ = ["RULES", "Standing", "c_star", "decide_group", "seed_cap", "standing"]

# rule -> what it says (the `rule` column of a §9.4 row)
RULES = {"epsilon": "settled: the upper bound of D_k <= epsilon", "a2": "settled: below the leader's n, beaten at c_r",
         "decided": "the leader, every other key settled", "bracket": "the key beyond a winning edge at C*",
         "undecided": "a seed where the decision hangs, or not decided at the cap", "budget": "reached C_max",
         "none": "not settled"}


@dataclass(frozen=True)
class Standing:
    """The decision at C* for one group's keys with a fit (science §9.3, §9.4); arrays are per key."""

    keys: list
    leader: int | None  # index of L: the largest median R_k(C*) among keys C* is known for; None: none is
    r_star: NDArray[np.float64]  # median R_k(C*) over refits (the point fit without refits)
    d_lo: NDArray[np.float64]  # one-sided 1 - alpha bounds of D_k = R_k(C*) - R_L(C*); 0 for L; NaN: no interval
    d_hi: NDArray[np.float64]
    unknown: NDArray[np.bool_]  # C* beyond eta x the largest C the key saw (A3)
    beaten: NDArray[np.float64]  # share of refits in which L beats the key at the current rung
    best_share: NDArray[np.float64]  # share of refits whose best key at C* is this one
    points: NDArray[np.int64]  # record points behind the key's fit
    seeds: NDArray[np.int64]


def c_star(group: SearchGroup, settings: SearchSettings) -> float:
    """The target budget C* of ``group``: ``target_budget``, else its C_max."""
    return float(settings.target_budget) if settings.target_budget is not None else float(group.c_max)


def seed_cap(group: SearchGroup, settings: SearchSettings) -> int:
    """The most seeds a key may reach where the decision hangs (``seeds_max``)."""
    return settings.seeds_max if settings.seeds_max is not None else len(group.seeds) + settings.extra_seeds


def standing(bank: CurveBank, group: SearchGroup, target: float, c_r: float,
             settings: SearchSettings) -> Standing | None:
    """Each key's reward at C* = ``target``, the leader, and the bounds of D_k (None: no key has a fit).

    Refit by refit from the bank's bootstrap (each key's seeds resampled), D_k
    is the key's refit minus the leader's; its bounds are the expanded
    percentile (:func:`rollscale.core.fit.bootstrap.interval`) at the fewer
    seeds of the two, one-sided 1 - alpha. A key C* is unknown for has the
    upper bound of its asymptote in place of D_k's upper bound (lower: NaN).
    """
    view = group_view(bank, group, [target, c_r], settings)
    if view is None:
        return None
    js, jr = view.at(target), view.at(c_r)
    ref = view.refs[:, :, js]  # keys x refits
    seen = bank.curves["c_seen"].to_numpy(float)[view.rows]
    unknown = target > settings.eta * seen * (1 + 1e-9)
    have = np.isfinite(ref).any(axis=1)
    with np.errstate(all="ignore"):
        r_star = np.where(have, np.nanmedian(np.where(np.isfinite(ref), ref, np.nan), axis=1), view.preds[:, js])
    nk = len(view.keys)
    d_lo, d_hi = np.full(nk, np.nan), np.full(nk, np.nan)
    beaten = np.full(nk, np.nan)
    known = np.flatnonzero(~unknown & np.isfinite(r_star))
    leader = int(known[np.argmax(r_star[known])]) if known.size else None
    if leader is not None:
        lvl = level(settings)
        for k in range(nk):
            if k == leader:
                d_lo[k] = d_hi[k] = 0.0
                continue
            seeds = int(min(view.seeds[k], view.seeds[leader]))
            diff = ref[k] - ref[leader]
            if unknown[k]:
                lead_lo = interval(ref[leader], int(view.seeds[leader]), level=lvl)[0]
                d_hi[k] = float(view.a_hi[k] - lead_lo) if np.isfinite(lead_lo) else math.nan
            elif np.isfinite(diff).sum() >= 2:
                d_lo[k], d_hi[k] = (float(v) for v in interval(diff, seeds, level=lvl))
            a, b = view.refs[leader, :, jr], view.refs[k, :, jr]
            ok = np.isfinite(a) & np.isfinite(b)
            if ok.any() and seeds >= 2:
                beaten[k] = float(np.mean(a[ok] > b[ok]))
    return Standing(view.keys, leader, r_star, d_lo, d_hi, unknown, beaten, view.shares[:, js],
                    view.points.astype(int), view.seeds.astype(int))


def _settled(s: Standing, k: int, group: SearchGroup, settings: SearchSettings) -> tuple[str | None, str]:
    """(rule, note) when key ``k`` is settled against the leader; (None, why not) otherwise."""
    lead = s.leader
    if lead is None:
        return None, "no key's fit reaches C*: nothing is settled"
    if k == lead:
        return None, "leader at C*"
    if s.unknown[k]:
        return None, "C* lies beyond eta times its data: unknown, cannot be settled"
    if min(s.points[k], s.points[lead]) < MIN_POINTS:
        return None, f"fits on fewer than {MIN_POINTS} record points: too thin to settle a key on"
    name, leader = s.keys[k], s.keys[lead]
    if s.d_hi[k] <= settings.tolerance:
        return "epsilon", (f"D = R({name}) - R({leader}) at C* has upper bound {s.d_hi[k]:+.3f} <= epsilon "
                           f"{settings.tolerance:g}: it cannot beat the leader by more")
    if group.axis == "rollout" and name < leader and s.beaten[k] >= 1.0 - settings.alpha:
        return "a2", (f"A2: n = {name} is below the leader n = {leader}, beaten by it at c_r in "
                      f"{s.beaten[k]:.0%} of refits")
    return None, f"D's upper bound {s.d_hi[k]:+.3f} > epsilon {settings.tolerance:g}: could still beat the leader"


def _numbers(s: Standing | None, k: int | None, target: float) -> dict[str, Any]:
    """The columns a row carries for key index ``k`` (§8's that apply, and the decision at C*)."""
    nan = math.nan
    out: dict[str, Any] = {"leader": None, "beaten_share": nan, "margin_lo": nan, "a_hi": nan, "leader_lo": nan,
                           "key_hi": nan, "best_share": nan, "at_c": nan, "c_star": target, "r_star": nan,
                           "d_lo": nan, "d_hi": nan}
    if s is None or s.leader is None:
        return out
    out["leader"] = str(s.keys[s.leader])
    if k is not None:
        out.update(beaten_share=float(s.beaten[k]), best_share=float(s.best_share[k]), at_c=target,
                   r_star=float(s.r_star[k]), d_lo=float(s.d_lo[k]), d_hi=float(s.d_hi[k]))
    return out


def _bracket(s: Standing | None, group: SearchGroup, st: GroupState) -> list[tuple[Any, str]]:
    """Keys to add beyond a grid edge that is best at C* in >= 50 % of refits: (key, note)."""
    if s is None or group.axis == "rule" or len(s.keys) < 2:
        return []
    out = []
    for edge, cand in ((min(st.keys), min(st.keys) // 2), (max(st.keys), max(st.keys) * 2)):
        if edge not in s.keys or cand in st.keys or cand == edge or not group.allows(cand):
            continue
        k = s.keys.index(edge)
        if s.points[k] < MIN_POINTS or not s.best_share[k] >= BRACKET_SHARE:
            continue
        side = "first" if cand < edge else "last"
        out.append((cand, f"{edge}, the {side} key in play, is best at C* in {s.best_share[k]:.0%} of refits: "
                          f"add {cand}"))
    return out


def decide_group(group: SearchGroup, st: GroupState, bank: CurveBank, settings: SearchSettings) -> list[dict]:
    """The next decision of one group (module docstring): rows of the ``search`` table, as §8's decide makes."""
    r, budgets = int(st.rung), st.budgets  # type: ignore[arg-type]
    c_r, last = float(budgets[r - 1]), r == len(budgets)
    next_c = float(group.c_max if last else budgets[r])
    target = c_star(group, settings)
    s = standing(bank, group, target, c_r, settings)
    mine = bank.index(group.group)
    status = dict(zip(bank.curves["key"].to_numpy()[mine], bank.curves["status"].to_numpy()[mine], strict=True))
    base = {"group": group.group, "decision": st.decision, "rung": r, "c": c_r, "margin_lo": math.nan}
    rows: list[dict] = []

    def emit(key: Any, seeds: Any, action: str, rule: str, c_train: float, k: int | None, note: str) -> None:
        nums = _numbers(s, k, target)
        n_points = int(s.points[k]) if s is not None and k is not None else 0
        for seed in seeds:
            rows.append({**base, **nums, "key": str(key), "seed": int(seed), "action": action, "rule": rule,
                         "c_train": c_train, "n_points": n_points, "note": note})

    live = [key for key in st.keys if key not in st.stopped]
    index = {key: (s.keys.index(key) if s is not None and key in s.keys else None) for key in live}
    verdict = {}
    for key in live:
        k = index[key]
        verdict[key] = (None, f"no fit ({status.get(key, 'no evaluations yet')})") if k is None else \
            _settled(s, k, group, settings)  # type: ignore[arg-type]
    adds = _bracket(s, group, st)
    lead = s.keys[s.leader] if s is not None and s.leader is not None else None
    open_keys = [key for key in live if verdict[key][0] is None and key != lead]
    decided = lead in live and not open_keys and not adds
    cap = seed_cap(group, settings)
    seeds_to: list[Any] = []
    if last and not decided and lead in live:
        contender = max(open_keys, key=lambda q: -math.inf if index[q] is None or not np.isfinite(
            s.d_hi[index[q]]) else s.d_hi[index[q]], default=None)  # type: ignore[union-attr]
        seeds_to = [q for q in (lead, contender) if q is not None and len(st.seeds[q]) < cap]
    hangs = last and not decided and not seeds_to and not adds
    for key in live:
        k, (rule, note) = index[key], verdict[key]
        here, ahead = leg_budget(group, key, c_r, settings), leg_budget(group, key, next_c, settings)
        if rule is not None:
            emit(key, st.seeds[key], "stop", rule, here, k, note)
        elif decided:
            emit(key, st.seeds[key], "stop", "decided", here, k,
                 f"every other key is settled at C* = {target:,.0f}: the answer is {key}")
        elif last:
            emit(key, st.seeds[key], "finish", "undecided" if hangs else "budget", here, k,
                 f"not decided at C* = {target:,.0f} with {cap} seeds: {note}" if hangs else f"reached C_max; {note}")
        else:
            emit(key, st.seeds[key], "continue", "none", ahead, k, note)
    for key, note in adds:
        emit(key, group.seeds, "add", "bracket", leg_budget(group, key, next_c, settings), None, note)
    for key in seeds_to:
        emit(key, [max(st.seeds[key]) + 1], "seed", "undecided", float(group.c_max), index[key],
             f"the decision at C* = {target:,.0f} hangs between {lead} and the keys {open_keys}: one more seed")
    return rows
