"""``sweep.search.method: forecast``: the search with forecasts (science §10.5), §9.4's search read at a C* that may
lie past the data (``study.target_budget`` up to :data:`FORECAST_REACH` x ``sweep.c_max``).

Runs advance in the same rungs as ``decision`` (:func:`rollscale.core.search.state.rung_budgets`, up to C_max;
C_max may be below C*). After each rung, per group with a numeric key (n or B_problem), on every run's
evaluations so far:

* the forecast (:func:`rollscale.core.fit.forecast.forecast_group`, science §10.1-10.2: one surface over the
  group's keys, its refits resampling seed slots paired across keys and redrawing the evaluation noise) at C*,
  for the trained keys and the keys just beyond the edges the bracket allows; its interval at the two-sided level
  1 - 2 alpha, so that its ends are the one-sided 1 - alpha bounds of §9.4;
* the cap (:func:`rollscale.core.fit.climb.climb_caps`, §10.4: the steepest rise per doubling seen in the group
  times the doublings left, above the key's upper bound where its runs are).

Per key in play (rows of the ``search`` table, :data:`RULES`):

* **stop**, rule ``cap``: its cap at C* is below the best other key's lower bound at the budget it reached, minus
  epsilon: it cannot catch up, whatever the surface (no A4);
* **stop**, rule ``forecast``: the upper bound of ``D_k = R_k(C*) - R_leader(C*)`` is <= epsilon: it cannot beat
  the leader at C* by more than epsilon (read past the data too: the surface's interval speaks, §10.2), once
  the data of the key and the leader reach the group's C_max: a forecast from fewer doublings has not seen a
  late winner rise. Settled from C* / 8 at C* = 4 x C_max, a key that overtakes late had not shown it (simulated
  ``late_flip`` right in 83-92 %, 95.8-100 % from C_max); settled from C* / 4 where that is below C_max, at
  C* = C_max simulated ``late`` was right in 70.8 % of studies and ``late_flip`` in 75.0 %, from C_max 95.8 and
  91.7 % (docs/journal/2026-11-29-edge-hang.md), for 4-34 % more rollouts. Neither rule settles a key
  before its runs and the leader's have :data:`MIN_POINTS` evaluations each, nor (``forecast``) with one seed a
  key (no seed spread: science §9.3); the cap, at any rung, on its own 95 % bounds;
* the leader and the keys not settled **continue** to C_max, the leader also once every other key is settled
  (its runs carry the forecast at C*; it stops, rule ``decided``, at C_max); at C_max seeds go where the decision
  hangs (rule ``undecided``, up to ``seeds_max``), as in §9.4 (:func:`rollscale.core.search.methods.decision.group_rows`),
  and to an answer whose reward at C* is unknown (its 95 % interval wider than the widest answer, §10.2) where one
  more seed is expected to make it known (:func:`unknown_answer`);
* **add**, rule ``bracket``: the key beyond the first or last key in play, only when that edge leads at C* by more
  than noise: the forecast of the key beyond it beats the leader (its D has a lower bound > 0), or the edge's inner
  neighbour is below the edge (its D has an upper bound < 0). On the embedded default, §9.4's bracket added n = 32
  at 2,561 rollouts and n = 64 at 5,091 while every evaluation lay within 0.32-0.41 around a step-0 mean of 0.364
  (issue 39): there the forecast at C* is wide and adds nothing. And where every other key is settled and the
  answer is the first or last key in play, the key beyond it is added as in §9.4
  (:func:`rollscale.core.search.methods.decision.beyond_answer`): an answer is not the edge of the keys untested
  (simulated ``edge_high``: n = 8 answered with n = 2 and 4 settled at 20,120 rollouts, n = 16, best at C*, never
  trained; the surface's line through n = 2-8 forecast it no better).

A group keyed by the allocation rule (no order for a surface, science §10.1) is decided as §9.4 decides it
(:class:`rollscale.core.search.methods.decision.Decision`). Every row carries C* (``c_star``), the key's
forecast there (``r_star``) and the bounds of its D (``d_lo``, ``d_hi``); the numbers are pure functions of the
runs' evaluations and the settings (seeded refits), so a rerun resumes to the same decisions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from rollscale.config import SearchParams
from rollscale.core.fit.climb import climb_caps
from rollscale.core.fit.decision import fit_runs
from rollscale.core.fit.forecast import bootstrap_surface, forecast_group
from rollscale.core.fit.tables import REWARD_MAX
from rollscale.core.fit.verdict import ANSWER_WIDTH, forecast_settings
from rollscale.core.search.methods.decision import MIN_POINTS, Decision, c_star, group_rows, level
from rollscale.core.search.state import GroupState, SearchGroup, SearchSettings
from rollscale.registry import SEARCH_METHODS

__all__ = ["FORECAST_REACH", "RULES", "Forecast", "Reading", "forecast_adds", "forecast_standing", "forecast_verdicts",
           "unknown_answer"]

FORECAST_REACH = 8.0  # C* up to 8 x C_max: how far the forecast is tested (science §10, "what it must show")
ANSWER_LEVEL = 0.95  # the level of the answer's interval in the fit's decision (science §10.2)

RULES = {"forecast": "settled: the upper bound of D_k at C* (the forecast's) <= epsilon; stopped once its own upper "
                     "bound is below the leader's lower bound minus epsilon, or the group is decided",
         "resume": "a stopped key the revised forecast says could beat the leader by more than epsilon",
         "cap": "settled: its climb cap at C* is below the best other key's lower bound minus epsilon",
         "decided": "the leader, every other key settled, at C_max", "bracket": "the key beyond an edge that leads at C*",
         "undecided": "a seed where the decision hangs, or not decided at the cap", "budget": "reached C_max",
         "none": "not settled"}


def forecast_standing(points: pd.DataFrame, group: SearchGroup, st: GroupState, settings: SearchSettings,
                      ) -> tuple[pd.DataFrame, pd.DataFrame] | None:
    """(the forecast at C* indexed by key, with ``evals`` and ``leader_share``; the caps) of one group from its
    ``points`` (the decisions' truncated evaluations); None without evaluations past C = 0."""
    pts = points[points["group"] == group.group]
    if not (pts["c"] > 0).any():
        return None
    evals = pts.assign(key=pts["key"].astype(int))
    a_max = REWARD_MAX if evals["avg_at_k"].between(0, REWARD_MAX).all() else None
    fs = forecast_settings(settings.resamples, settings.bootstrap_seed, settings.eval_draws, level(settings), a_max,
                           form=settings.study.forecast_form)
    trained = sorted(int(k) for k in evals["key"].unique())
    beyond = [k for k in (min(trained) // 2, max(trained) * 2) if k not in trained and group.allows(k)]
    target = c_star(group, settings)
    curves = fit_runs(evals, "key", a_max)
    fs = fs.at_answer(evals, target)
    boot = bootstrap_surface(evals, "key", fs)
    table = forecast_group(evals, "key", target, np.array(trained + beyond), fs, boot, curves)
    # the answer's own interval, at the fit's 95 % (the same refits): wider than the widest answer, it is unknown.
    # Read only at the last rung, where an answer can get seeds (group_rows): not a second forecast every rung
    table["answer_width"] = math.nan
    if st.rung is not None and int(st.rung) == len(st.budgets):
        answer = forecast_group(evals, "key", target, np.array(trained), replace(fs, level=ANSWER_LEVEL), boot,
                                curves).set_index("key")
        table["answer_width"] = table["key"].map(answer["width"])
    counts = evals[evals["c"] > 0].groupby(["key", "run_id"]).size().groupby(level=0).min()
    table = table.assign(evals=table["key"].map(counts).fillna(0).astype(int), leader_share=float("nan"))
    # the cap's own 95 % bounds (what science §10's simulation measured: it never stopped the true best key)
    caps = climb_caps(evals, "key", target, settings.tolerance, a_max=a_max, curves=curves)
    return table.set_index("key", drop=False), caps.set_index("key", drop=False)


@dataclass(frozen=True)
class Reading:
    """What one decision reads of a group's keys at C* (science §11.3): per key in play and not stopped, (rule,
    note) where it stops now, (None, why) otherwise; ``held``: keys settled against the leader (their D's upper
    bound <= epsilon) whose own upper bound is not yet below the leader's lower bound minus epsilon: not open, but
    they train on until the group is decided (key -> (rule, note) of their stop then); ``resumed``: stopped keys the
    forecast now says could beat the leader by more than epsilon, (key, note), trained on from their checkpoints."""

    verdict: dict
    held: dict
    resumed: list


def _trusted(row: pd.Series, lead_row: pd.Series, spread: bool, c_max: float,
             stopped: bool = False) -> tuple[str, str] | None:
    """Why the forecast of a key against the leader cannot be read at C*, (``thin``: too few evaluations for
    either rule, ``reach`` or ``spread``: the cap may still settle it; the words), None where it can. The reach is
    the key's and the leader's, or for a ``stopped`` key the leader's alone: its own data do not grow, and a key
    stopped before C_max (by the cap) is still read against the leader for a resume (science §11.3)."""
    seen = lead_row["c_seen"] if stopped else min(row["c_seen"], lead_row["c_seen"])
    if min(row["evals"], lead_row["evals"]) < MIN_POINTS:
        return "thin", f"runs with fewer than {MIN_POINTS} evaluations: too thin to settle a key on"
    if seen < c_max * (1 - 1e-9):
        return "reach", (f"the data of it or the leader (C = {seen:,.0f}) do not reach C_max: the forecast settles a "
                         "key at C_max (a key that overtakes late shows it later)")
    if not spread:
        return "spread", ("one seed a key so far: no seed spread to pool, no bounds; seeds go where the decision hangs "
                          "at C_max")
    return None


def forecast_verdicts(table: pd.DataFrame, caps: pd.DataFrame, live: list[Any], settings: SearchSettings,
                      stopped: list[Any] = (), *, c_max: float) -> Reading:
    """The keys' standing against the forecast's leader at C* (science §11.3, :class:`Reading`). A key stops when
    its cap at C* is below the best other key's lower bound minus epsilon (``cap``), or when its own upper bound at
    C* (the forecast's ``reward_hi``, its continuation included) is below the leader's lower bound minus epsilon
    (``forecast``). A stopped key never leads: where the forecast's leader is a stopped key, or a stopped key's D
    has an upper bound above epsilon, it is resumed."""
    lead = table["leader"].iloc[0]
    spread = bool((table.loc[table["trained"], "seeds"] >= 2).any())
    eps, out, held, resumed = settings.tolerance, {}, {}, []
    lead_row = table.loc[lead] if lead is not None and lead in table.index else None
    for key in stopped:
        if key not in table.index or lead_row is None:
            continue
        if key == lead:
            resumed.append((key, f"the forecast at C* puts it first (median {table.loc[key, 'reward']:.3f}): a "
                                 "stopped key never leads"))
            continue
        row = table.loc[key]
        if _trusted(row, lead_row, spread, c_max, stopped=True) is None and not row["d_hi"] <= eps \
                and not (key in caps.index and bool(caps.loc[key, "cannot_catch_up"])):
            resumed.append((key, f"the forecast now says it could beat {lead} by more than epsilon {eps:g} at C* "
                                 f"(upper bound of D {row['d_hi']:+.3f})"))
    for key in live:
        if key == lead:
            out[key] = (None, "leader at C*")
            continue
        if key not in table.index or lead_row is None:  # added, not trained yet (a replayed grid that lacks it)
            out[key] = (None, "no evaluations yet")
            continue
        row = table.loc[key]
        thin = _trusted(row, lead_row, spread, c_max)
        if thin is not None and thin[0] == "thin":
            out[key] = (None, thin[1])
        elif key in caps.index and bool(caps.loc[key, "cannot_catch_up"]):
            cap = caps.loc[key]
            out[key] = ("cap", f"its cap at C* {cap['cap']:.3f} (s_max {cap['s_max']:.3f} a doubling from "
                               f"C = {cap['c']:,.0f}) is below the best other key's lower bound "
                               f"{cap['best_floor']:.3f} minus epsilon: it cannot catch up")
        elif thin is not None:
            out[key] = (None, thin[1])
        elif row["d_hi"] <= eps:
            settled = (f"D = R({key}) - R({lead}) forecast at C* has upper bound {row['d_hi']:+.3f} <= epsilon "
                       f"{eps:g}: it cannot beat the leader by more")
            if row["reward_hi"] < lead_row["reward_lo"] - eps:
                out[key] = ("forecast", f"{settled}; its upper bound {row['reward_hi']:.3f} is below the leader's "
                                        f"lower bound {lead_row['reward_lo']:.3f} minus epsilon: it stops")
            else:
                out[key] = (None, f"{settled}; its upper bound {row['reward_hi']:.3f} is not below the leader's "
                                  f"lower bound {lead_row['reward_lo']:.3f} minus epsilon: it trains on until the "
                                  "decision is made")
                held[key] = ("forecast", settled)
        else:
            out[key] = (None, f"D's upper bound at C* {row['d_hi']:+.3f} > epsilon {eps:g}: could still beat the "
                              "leader")
    return Reading(out, held, resumed)


def forecast_adds(table: pd.DataFrame, group: SearchGroup, st: GroupState) -> list[tuple[Any, str]]:
    """The bracket's (key, note): the key beyond an edge in play that leads at C* by more than noise (module
    docstring)."""
    lead = table["leader"].iloc[0]
    if lead is None or len(st.keys) < 2 or table.loc[lead, "evals"] < MIN_POINTS:
        return []
    out = []
    keys = sorted(st.keys)
    for edge, inner, cand in ((keys[0], keys[1], keys[0] // 2), (keys[-1], keys[-2], keys[-1] * 2)):
        if edge != lead or cand in st.keys or cand not in table.index or inner not in table.index:
            continue
        beyond, below = float(table.loc[cand, "d_lo"]), float(table.loc[inner, "d_hi"])
        if beyond > 0 or below < 0:
            why = (f"the forecast of {cand} beats it (lower bound of D {beyond:+.3f})" if beyond > 0 else
                   f"{inner} is below it (upper bound of D {below:+.3f})")
            out.append((cand, f"{edge}, the {'first' if cand < edge else 'last'} key in play, leads at C*: {why}; "
                              f"add {cand}"))
    return out


def unknown_answer(table: pd.DataFrame, lead: Any) -> str | None:
    """Why the answer ``lead`` gets one more seed, None where it does not: its reward at C* is unknown (its 95 %
    interval, the fit's, wider than the widest answer, science §10.2) and one more seed is expected to make it
    known (the seed spread's share of the width falls as 1 / sqrt(seeds); the rest, the surface's reach past the
    data, no seed narrows: simulated ``cross`` at 4 x C_max, 0.248 wide with 2 seeds, 0.257 with 3). The default
    study at C* = 160,000 answered "unknown, in [0.48, 0.63]" (0.153 wide) with 2 seeds a key (2026-11-27)."""
    if lead not in table.index:
        return None
    width, seeds = float(table.loc[lead, "answer_width"]), int(table.loc[lead, "seeds"])
    if not width > ANSWER_WIDTH or seeds < 2:
        return None
    expected = width * math.sqrt(seeds / (seeds + 1))
    if expected > ANSWER_WIDTH:
        return None
    return (f"its 95 % interval is {width:.3f} wide, wider than {ANSWER_WIDTH:g}; one more seed is expected to make it "
            f"{expected:.3f}")


@SEARCH_METHODS.register("forecast")
class Forecast(Decision):
    """The search with forecasts (module docstring; science §10.5)."""

    name = "forecast"
    words = "search with forecasts to the decision at C* (science §10.5)"
    starts_with = "seeds_min"  # as the decision's search

    def reach(self, search: SearchParams) -> float:
        return FORECAST_REACH

    def decide(self, points: pd.DataFrame, groups: list[SearchGroup], states: list[GroupState],
               settings: SearchSettings) -> list[dict]:
        rules = [(g, st) for g, st in zip(groups, states, strict=True) if g.axis == "rule"]
        rows = super().decide(points, [g for g, _ in rules], [st for _, st in rules], settings) if rules else []
        for g, st in zip(groups, states, strict=True):
            if g.axis == "rule":
                continue
            live = [key for key in st.keys if key not in st.stopped]
            standing = forecast_standing(points, g, st, settings)
            if standing is None:
                verdict = {key: (None, "no evaluations yet") for key in live}
                rows += group_rows(g, st, None, verdict, [], settings, leader_to_c_max=True)
                continue
            table, caps = standing
            reading = forecast_verdicts(table, caps, live, settings, [k for k in st.keys if k in st.stopped],
                                        c_max=g.c_max)
            rows += group_rows(g, st, table, reading.verdict, forecast_adds(table, g, st), settings,
                               leader_to_c_max=True, edge_answer=True,
                               unknown_answer=lambda lead, t=table: unknown_answer(t, lead), held=reading.held,
                               resumed=reading.resumed)
        return rows

    def measured_spent(self, search: SearchParams, grid_seeds: int) -> float | None:
        # keys settle at C_max only (science §11.3), so every key's seeds_min seeds reach it: the default study
        # spent 320,000 of its 480,000-rollout grid (2 of 3 seeds; docs/results.md), the simulated families a
        # median 1.00 x 2 C* at C* = 4 x C_max (docs/benchmarks.md). With one seed a key the bootstrap has no seed
        # spread and the decision hangs: not measured
        return min(1.0, search.seeds_min / grid_seeds) if search.seeds_min >= 2 else None
