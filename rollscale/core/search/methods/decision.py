"""``sweep.search.method: decision``: the search that stops when the decision is made (science
§9.4), the answer at C* for part of the grid.

Runs advance in rungs of budget (:func:`rollscale.core.search.state.rung_budgets`); every key starts with the
group's seeds (``seeds_min``). After each rung :func:`decide_group` reads the decision
(:func:`rollscale.core.search.standing.standings`) at the
target budget C* (each key's reward ``R_k(C*)``, the leader L with the largest median over paired refits, the
one-sided 1 - alpha bounds of ``D_k = R_k(C*) - R_L(C*)``), at the rung's budget c_r, and as far toward C* as the
fits reach (min(C*, eta c_r)), and per key:

* **stop**, rule ``epsilon``: settled, the upper bound of D_k is <= epsilon
  (``tolerance``): it cannot beat the leader at C* by more than epsilon; read
  at C* within the data of the key and the leader (their runs reached C*): a
  read past the data is biased where the bound does not see it (late bloomers
  read 0.02-0.03 low at C* from 0.71 C*), and training on reads it within data;
* **stop**, rule ``a2`` (rollout axis, A2: n* does not fall with budget): an
  n below the leader at c_r that loses to it there by more than epsilon (the
  upper bound of its D at c_r below -epsilon), once that leader has risen a
  record bin (``bin_width``) above R0; or, at C*, an n below the leader
  beaten where both ran (the decision's own A2). At the rung, a margin of
  epsilon and the risen leader keep the curves pinned at R0 at small C, whose
  differences look sure and are not, from stopping keys (docs/benchmarks.md);
* **stop**, rule ``decided``: the leader, once every other key in play is
  settled (the group is done: the answer is the leader; before C* is in
  reach, the one key every other was settled against by A2);
* **resume** (science §11.3): a stopped key that leads at C* (a stopped key
  never leads), and, where every key in play but the answer is settled, a
  stopped key the same rules do not settle against that answer: settling is
  checked against the final leader, never transitively (a key stopped
  against a leader that was itself settled later); it trains on from its
  checkpoint and the group is not decided meanwhile;
* an answer at the first or last key in play is not decided while the
  bracket allows a key beyond it not yet run: that key is **add**-ed (rule
  ``bracket``) first; and where the decision hangs at C_max with its leader
  at that edge, the key beyond it is added before any seed, within
  ``spend_max`` (what lies past the edge no seed of the keys in play shows:
  simulated ``edge_high``, docs/journal/2026-11-29-edge-hang.md);
* otherwise the leader and the unsettled keys **continue** to the next rung;
  at C_max they **finish** (rule ``budget``), and a **seed** (rule
  ``undecided``) goes to the leader and to the unsettled key with the
  largest upper bound of D_k, each up to ``seeds_max`` seeds, and the last
  rung is decided again; with both at the cap every row left says "not
  decided" (rule ``undecided``) and the group is done;
* **add** (rule ``bracket``, not for rules): the first or last key in play
  leads in >= 50 % of paired refits at C*, or as far toward it as the fits
  reach while C* is beyond them: the key beyond it joins with the group's
  seeds and catches up.

Seeds go where the decision hangs (science §9.4). With one seed a key
(``seeds_min: 1``, the embedded default) there is no seed spread to pool
(§9.3) and so no bound: no key is settled until the seeds added at C_max
(the leader and, with no bounds yet, the key with the largest median D) give
the spread, pooled over the group, that settles the keys of one seed too;
the bracket reads the single runs' leader (docs/benchmarks.md, "One seed a key to start").

A key whose C* lies beyond eta times its data (A3) is unknown: it cannot be
settled. A curve not bent within its data (a run's fitted C_mid past its
largest C) is not read past its data at all (simulated family ``unbent``:
its extrapolations settled keys wrongly). A key whose runs have fewer than
:data:`MIN_POINTS` evaluations each (it or the leader) is not settled
either. Every row carries C* (``c_star``), the key's reward there
(``r_star``) and the one-sided 1 - alpha bounds of D_k (``d_lo``, ``d_hi``)
beside the columns of the ``search`` table that apply (:data:`rollscale.core.search.state.DECISION_COLUMNS`).

The numbers are the decision's own (:func:`rollscale.core.fit.decision.decide`,
science §9.2-9.3: one shared R0, every run fitted at it, the seed spread
pooled across the group's keys, paired refits for the leader), asked at the
two-sided level 1 - 2 alpha so that its interval ends are the one-sided
1 - alpha bounds of §9.4: one interval method for the search and the answer.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pandas as pd

from rollscale.config import SearchParams
from rollscale.core.fit.verdict import group_verdict
from rollscale.core.search.methods.base import SearchMethod
from rollscale.core.search.standing import Standing, c_star, level, seed_cap, spend_budget, spend_left, standings
from rollscale.core.search.state import GroupState, SearchGroup, SearchSettings, leg_budget
from rollscale.registry import SEARCH_METHODS

__all__ = ["BRACKET_SHARE", "MIN_POINTS", "RULES", "Decision", "Standing", "answer_key", "c_star", "beyond_answer",
           "decide_group",
           "group_rows", "level", "seed_cap", "standings"]

BRACKET_SHARE = 0.5  # an edge key leading at C* in >= 50 % of paired refits: the key beyond it joins
# a key is settled on runs of MIN_POINTS evaluations or more (it and the leader), 2+ a parameter of the §7 sigmoid:
# fewer let noise settle keys (simulated; the replay of the default grid added n = 32 on 3 points of n = 16,
# docs/benchmarks.md)
MIN_POINTS = 8

# rule -> what it says (the `rule` column of a §9.4 row)
RULES = {"epsilon": "settled: the upper bound of D_k <= epsilon", "a2": "settled: below the leader's n, beaten at c_r",
         "decided": "the leader, every other key settled", "bracket": "the key beyond a winning edge at C*",
         "undecided": "a seed where the decision hangs, or not decided at the cap", "budget": "reached C_max",
         "resume": "a stopped key that leads at C*, or is not settled against the answer", "none": "not settled"}


def _spread(t: pd.DataFrame) -> bool:
    """Whether a decision table has a seed spread to pool (some key with two seeds or more: science §9.3)."""
    return bool(t["df"].iloc[0] >= 1) if "df" in t and len(t) else False


def _settled(s: Standing, key: Any, group: SearchGroup, settings: SearchSettings) -> tuple[str | None, str]:
    """(rule, note) when ``key`` is settled; (None, why not) otherwise."""
    t, r = s.star, s.rung
    if not _spread(t) and not _spread(r):
        return None, ("one seed a key so far: no seed spread to pool, no bounds; seeds go where the decision "
                      "hangs at C_max")
    lead, lead_r = t["leader"].iloc[0], r["leader"].iloc[0]
    if (group.axis == "rollout" and key in r.index and lead_r is not None and key < lead_r and r.loc[key, "d_hi"] < -settings.tolerance
            and s.rise >= settings.bin_width and min(r.loc[key, "evals"], r.loc[lead_r, "evals"]) >= MIN_POINTS):
        # A2: the best n does not fall with budget, so an n below the leader at c_r is not best at C* >= c_r
        return "a2", (f"A2: n = {key} is below n = {lead_r}, the leader at c_r, which beats it there "
                      f"(upper bound of D {r.loc[key, 'd_hi']:+.3f} < 0)")
    if lead is None:
        return None, "no key's fit reaches C*: nothing is settled by epsilon yet"
    if key == lead:
        return None, "leader at C*"
    row = t.loc[key]
    if row["unknown"]:
        return None, "C* lies beyond eta times its data: unknown, cannot be settled"
    if min(row["evals"], t.loc[lead, "evals"]) < MIN_POINTS:
        return None, f"runs with fewer than {MIN_POINTS} evaluations: too thin to settle a key on"
    if row["settled_by"] == "tolerance" and (row["extrapolated"] or t.loc[lead, "extrapolated"]):
        # the search can still read C* within data by training on: it does not stop a key on a read past its
        # data (simulated, 40 studies per family: right in 87.5 / 92.5 % of cross / unbent studies with such
        # stops, 90 / 95 % without, for 4 points more of the grid's rollouts; docs/benchmarks.md)
        return None, (f"D's upper bound {row['d_hi']:+.3f} at C* read past the data (A3): settled only within "
                      "its data")
    if row["settled_by"] == "tolerance":
        return "epsilon", (f"D = R({key}) - R({lead}) at C* has upper bound {row['d_hi']:+.3f} <= epsilon "
                           f"{settings.tolerance:g}: it cannot beat the leader by more")
    if row["settled_by"] == "a2":
        return "a2", f"A2: n = {key} is below the leader n = {lead}, beaten by it where both ran (upper bound < 0)"
    if row["extrapolated"] or t.loc[lead, "extrapolated"]:
        return None, (f"D's upper bound {row['d_hi']:+.3f} > 0 on curves read past their data (A3): the decision "
                      "settles such a key only below the leader, the search only within its data")
    return None, f"D's upper bound {row['d_hi']:+.3f} > epsilon {settings.tolerance:g}: could still beat the leader"


def _numbers(t: pd.DataFrame | None, key: Any, target: float) -> dict[str, Any]:
    """The columns a row carries for ``key`` (the decision at C*)."""
    nan = math.nan
    out: dict[str, Any] = {"leader": None, "leader_lo": nan, "key_hi": nan, "best_share": nan, "at_c": nan,
                           "c_star": target, "r_star": nan, "d_lo": nan, "d_hi": nan}
    if t is None or t["leader"].iloc[0] is None:
        return out
    lead = t["leader"].iloc[0]
    out.update(leader=str(lead), leader_lo=float(t.loc[lead, "reward_lo"]), best_share=float(t["leader_share"].iloc[0]),
               at_c=target)
    if key is not None and key in t.index:
        row = t.loc[key]
        out.update(r_star=float(row["reward"]), d_lo=float(row["d_lo"]), d_hi=float(row["d_hi"]),
                   key_hi=float(row["reward_hi"]))
    return out


def _bracket(s: Standing | None, group: SearchGroup, st: GroupState) -> list[tuple[Any, str]]:
    """The key beyond a grid edge that leads at C* (or as far toward it as the fits reach) in >= 50 % of paired
    refits: (key, note)."""
    t = s.reach if s is not None else None
    # with one seed a key every refit is the same runs: the edge's reading leads or not, and the key beyond it
    # joins early, an insurance of one run (simulated edge_low / edge_high, 80 studies each: right in 98.8 / 95 %
    # of studies, against 91.3 / 90 % when the bracket waits for the seeds added at C_max)
    if t is None or group.axis == "rule" or t["leader"].iloc[0] is None or len(st.keys) < 2:
        return []
    lead, share = t["leader"].iloc[0], float(t["leader_share"].iloc[0])
    out = []
    for edge, cand in ((min(st.keys), min(st.keys) // 2), (max(st.keys), max(st.keys) * 2)):
        if edge != lead or cand in st.keys or cand == edge or not group.allows(cand):
            continue
        if t.loc[edge, "evals"] < MIN_POINTS or share < BRACKET_SHARE:
            continue
        side = "first" if cand < edge else "last"
        out.append((cand, f"{edge}, the {side} key in play, leads toward C* in {share:.0%} of refits: add {cand}"))
    return out


def beyond_answer(lead: Any, group: SearchGroup, st: GroupState, hangs: bool = False) -> list[tuple[Any, str]]:
    """The key beyond an answer at the edge of the keys in play, where the bracket allows one not yet tried:
    an answer is never the grid's edge untested against its neighbour (simulated ``edge_high``: n = 8 decided
    on A2 stops of n = 2 and 4 at c_r, n = 16 never trained, in 2 of 40 studies). ``hangs``: the leader of a
    decision that hangs at C_max, not an answer (:func:`group_rows`)."""
    if group.axis == "rule" or len(st.keys) < 2:
        return []
    out = []
    for edge, cand in ((min(st.keys), min(st.keys) // 2), (max(st.keys), max(st.keys) * 2)):
        if edge == lead and cand not in st.keys and cand != edge and group.allows(cand):
            side = "first" if cand < edge else "last"
            what = "the leader of a decision that hangs at C_max" if hangs else "the answer"
            out.append((cand, f"{edge}, {what}, is the {side} key in play: add {cand}"))
    return out


def answer_key(table: pd.DataFrame | None, verdict: dict[Any, tuple[str | None, str]]) -> Any:
    """The key a decision would answer: the leader at C*, or, where every other key in play is settled (by A2
    before C* is in reach), the one left."""
    lead = table["leader"].iloc[0] if table is not None else None
    unsettled = [key for key, (rule, _) in verdict.items() if rule is None]
    return unsettled[0] if lead not in unsettled and len(unsettled) == 1 else lead


def _stopped_against(standing: Standing | None, group: SearchGroup, st: GroupState,
                     verdict: dict[Any, tuple[str | None, str]], settings: SearchSettings) -> list[tuple[Any, str]]:
    """The stopped keys to resume, (key, note), where every key in play but the answer is settled: settling is
    checked against the final leader, never transitively (science §11.3). A key stopped against a leader that was
    itself settled later counts only where the same rules settle it against the answer now; else, as the answer
    itself (a stopped key never leads), it trains on from its checkpoint."""
    lead = answer_key(standing.star if standing is not None else None, verdict)
    if standing is None or lead is None:
        return []
    if lead in st.stopped:
        return [(lead, f"it leads at C* = {c_star(group, settings):,.0f}: a stopped key never leads")]
    if any(rule is None for key, (rule, _) in verdict.items() if key != lead):
        return []  # not decided: no answer to check the stopped keys against yet
    t, out = standing.star, []
    for key in sorted(st.stopped):
        if (key in t.index and t["leader"].iloc[0] == lead and t.loc[key, "settled_by"] == "a2"
                and min(t.loc[key, "evals"], t.loc[lead, "evals"]) >= MIN_POINTS):
            continue  # A2 against the answer itself: a smaller n it beats where both ran, read at C* or not
        rule, why = _settled(standing, key, group, settings) if key in t.index else (None, "no fit at C*")
        if rule is None:
            out.append((key, f"stopped earlier, not settled against the answer {lead} ({why}): settling is checked "
                             "against the final leader"))
    return out


def decide_group(group: SearchGroup, st: GroupState, standing: Standing | None, settings: SearchSettings,
                 ) -> list[dict]:
    """The next decision of one group (module docstring) from its :class:`Standing` (None: no evaluations yet):
    rows of the ``search`` table."""
    live = [key for key in st.keys if key not in st.stopped]
    verdict = {key: (_settled(standing, key, group, settings) if standing is not None and key in standing.star.index
                     else (None, "no fit at C*: no evaluations yet, or C* beyond its data and its curve not bent"))
               for key in live}
    return group_rows(group, st, standing.star if standing is not None else None, verdict,
                      _bracket(standing, group, st), settings,
                      rung_leader=standing.rung["leader"].iloc[0] if standing is not None else None,
                      edge_answer=True,
                      resumed=_stopped_against(standing, group, st, verdict, settings))


def group_rows(group: SearchGroup, st: GroupState, table: pd.DataFrame | None, verdict: dict[Any, tuple[str | None, str]],
               adds: list[tuple[Any, str]], settings: SearchSettings, rung_leader: Any = None,
               edge_answer: bool = False,
               leader_to_c_max: bool = False, unknown_answer: Callable[[Any], str | None] | None = None,
               held: dict[Any, tuple[str, str]] | None = None, resumed: list[tuple[Any, str]] | None = None,
               ) -> list[dict]:
    """The rows of one group's decision (module docstring) from what the method read: ``table`` the decision at
    C* (one row per key, indexed by key: ``leader``, ``leader_share``, ``reward``, ``reward_lo``, ``reward_hi``,
    ``d``, ``d_lo``, ``d_hi``, ``evals``; None: no fit yet), ``verdict`` per key in play and not stopped (rule or
    None, note), ``adds`` the bracket's (key, note). ``rung_leader``: the leader at c_r, named where C* is out of
    reach; ``edge_answer``: add the key beyond an edge (:func:`beyond_answer`) where every key but the leader is
    settled and the answer is that edge, or where the decision hangs at C_max with its leader there;
    ``leader_to_c_max``: a decided leader trains on to C_max before it stops (science §10.5); ``unknown_answer``:
    why the answer gets seeds at C_max as a decision that hangs does (its reward at C* unknown), else None;
    ``held``: keys settled against the leader that train on until the decision is made, then stop with their (rule,
    note); ``resumed``: stopped keys trained on again, (key, note): while there are any the group is not decided
    (science §11.3)."""
    held, resumed = held or {}, resumed or []
    r, budgets = int(st.rung), st.budgets  # type: ignore[arg-type]
    c_r, last = float(budgets[r - 1]), r == len(budgets)
    next_c = float(group.c_max if last else budgets[r])
    target = c_star(group, settings)
    base = {"group": group.group, "decision": st.decision, "rung": r, "c": c_r}
    rows: list[dict] = []

    def emit(key: Any, seeds: Any, action: str, rule: str, c_train: float, note: str) -> None:
        nums = _numbers(table, key, target)
        if nums["leader"] is None and rung_leader is not None:
            nums["leader"] = str(rung_leader)  # C* out of reach: the leader at c_r
        n_points = int(table.loc[key, "evals"]) if table is not None and key in table.index else 0
        for seed in seeds:
            rows.append({**base, **nums, "key": str(key), "seed": int(seed), "action": action, "rule": rule,
                         "c_train": c_train, "n_points": n_points, "note": note})

    live = [key for key in st.keys if key not in st.stopped]
    lead = answer_key(table, {key: verdict[key] for key in live})
    # the group's standing read by the one verdict (science §11.5): every key in play but the leader settled, by a
    # rule of this decision, held (settled, training on), or stopped earlier and not resumed (checked against this
    # leader where the method can: science §11.3)
    standing = pd.DataFrame({"key": list(st.keys)})
    settled = {key: verdict[key][0] for key in live if verdict[key][0] is not None}
    settled |= {key: rule for key, (rule, _) in held.items()} | {
        key: "stopped" for key in st.stopped if key not in {k for k, _ in resumed}}
    v = group_verdict(standing, settings.tolerance, target, lead, settled, only=True)
    open_keys = [key for key in v.open if key in live]
    if edge_answer and lead is not None and v.answered and not adds and not resumed:
        adds = beyond_answer(lead, group, st)
    # decided: answered; never while a key is added or a stopped key resumed (a stopped key that leads, or is not
    # settled against this leader, is resumed by the method: science §11.3)
    decided = v.answered and not adds and not resumed
    cap = seed_cap(group, settings)
    # seeds (each a run to C_max) only within the search's budget, sweep.search.spend_max x C* (science §11): at
    # most the two a decision adds (the leader's and a contender's), none where the cap is passed
    affordable = max(0, int(min(2.0, spend_left(group, st, settings) / group.c_max + 1e-9))) if last else 0
    # an answer whose reward at C* is wide gets seeds while one is expected to narrow it; at the cap it is the
    # answer still, marked uncertain (science §11.5)
    too_wide = unknown_answer(lead) if (decided and last and lead in live and unknown_answer is not None
                                        and len(st.seeds[lead]) < cap and affordable) else None
    if too_wide:  # every other key settled, but what the answer reaches at C* is unknown: seeds narrow it
        decided, verdict = False, {**verdict, lead: (None, f"the answer, its reward at C* unknown: {too_wide}")}
    # a decision that hangs at C_max with its leader at the edge of the keys in play: the key beyond it before any
    # seed, within the budget (its seeds to C_max), for what lies past the edge no seed of the keys in play can show
    # (simulated edge_high at C* = 4 x C_max: n = 8 led, n = 4 open by 0.001 with 3 seeds, n = 16, 0.08 better at
    # C*, never trained)
    if last and not decided and lead in live and not adds and not resumed and edge_answer \
            and spend_left(group, st, settings) >= len(group.seeds) * group.c_max * (1 - 1e-9):
        adds = beyond_answer(lead, group, st, hangs=True)
    seeds_to: list[Any] = []
    cap_words = f"with {cap} seeds"
    # a key just added, or resumed, is the next step, not a seed
    if last and not decided and lead in live and not adds and not resumed:
        def upper(q: Any) -> tuple[float, float]:
            # the largest upper bound of D; where no key has bounds yet (one seed each: no seed spread to pool),
            # the largest median D
            row = table.loc[q] if table is not None and q in table.index else None
            d_hi, d = (float(row["d_hi"]), float(row["d"])) if row is not None else (math.nan, math.nan)
            return (d_hi if math.isfinite(d_hi) else -math.inf, d if math.isfinite(d) else -math.inf)
        contender = max(open_keys, key=upper, default=None)
        seeds_to = [q for q in (lead, contender) if q is not None and len(st.seeds[q]) < cap]
        unaffordable, seeds_to = seeds_to[affordable:], seeds_to[:affordable]
        if unaffordable and not seeds_to:
            cap_words = (f"within the search's budget (sweep.search.spend_max {settings.search.spend_max:g} x C* = "
                         f"{spend_budget(group, settings):,.0f} rollouts; a seed of "
                         f"{' and '.join(str(q) for q in unaffordable)} would pass it)")
    hangs = last and not decided and not seeds_to and not adds and not resumed
    for key in live:
        rule, note = verdict[key]
        if rule is None and decided and key in held:
            rule, note = held[key]
        here, ahead = leg_budget(group, key, c_r, settings), leg_budget(group, key, next_c, settings)
        if rule is not None:
            emit(key, st.seeds[key], "stop", rule, here, note)
        elif decided and key == lead and leader_to_c_max and not last:
            emit(key, st.seeds[key], "continue", "none", ahead,
                 f"every other key is settled at C* = {target:,.0f}: the answer {key} trains on to C_max")
        elif decided and key == lead:
            emit(key, st.seeds[key], "stop", "decided", here,
                 f"every other key is settled at C* = {target:,.0f}: the answer is {key}")
        elif last:
            emit(key, st.seeds[key], "finish", "undecided" if hangs else "budget", here,
                 f"not decided at C* = {target:,.0f} {cap_words}: {note}" if hangs else f"reached C_max; {note}")
        else:
            emit(key, st.seeds[key], "continue", "none", ahead, note)
    for key, note in adds:
        emit(key, group.seeds, "add", "bracket", leg_budget(group, key, next_c, settings), note)
    for key, note in resumed:
        emit(key, st.seeds[key], "resume", "resume", leg_budget(group, key, next_c, settings),
             f"resumed from its checkpoint: {note}")
    for key in seeds_to:
        why = f"the answer {lead}'s reward at C* = {target:,.0f} is unknown ({too_wide})" if too_wide else \
            f"the decision at C* = {target:,.0f} hangs between {lead} and {open_keys}"
        emit(key, [max(st.seeds[key]) + 1], "seed", "undecided", float(group.c_max), f"{why}: one more seed")
    if decided:  # the answer is the leader, also where the decision at C* had none
        for row in rows:
            row["leader"] = str(lead)
    return rows


@SEARCH_METHODS.register("decision")
class Decision(SearchMethod):
    """Stop once the decision at C* is made (module docstring; science §9.4)."""

    name = "decision"
    adds_seeds = True
    words = "search to the decision at C* (science §9.4)"
    starts_with = "seeds_min"  # each key starts with the first seeds_min seeds; more come where the decision hangs

    def decide(self, points: pd.DataFrame, groups: list[SearchGroup], states: list[GroupState],
               settings: SearchSettings) -> list[dict]:
        rungs = {g.group: float(st.budgets[int(st.rung) - 1]) for g, st in zip(groups, states, strict=True)}
        tables = standings(points, groups, rungs, settings)
        return [r for g, st in zip(groups, states, strict=True) for r in decide_group(g, st, tables.get(g.group),
                                                                                     settings)]

    def measured_spent(self, search: SearchParams, grid_seeds: int) -> float | None:
        # of the grid's rollouts (sweep.seeds seeds), replayed on the default study's grid: with 2 seeds to start
        # 55.9 % ("The decision at C* replayed on the default grid"), with 1 (the default) 50.0 %, 240,256
        # rollouts ("One seed a key to start"; docs/benchmarks.md)
        return 0.500 if search.seeds_min == 1 else 0.559

    def seeds_added(self, group: SearchGroup, settings: SearchSettings) -> int:
        # a seed each for the leader and one other key, up to the cap, where the decision hangs; within spend_max x
        # C* where every key of the group reached C_max
        added = 2 * max(0, seed_cap(group, settings) - len(group.seeds))
        room = spend_budget(group, settings) / group.c_max - len(group.keys) * len(group.seeds)
        return added if math.isinf(room) else min(added, max(0, int(room + 1e-9)))
