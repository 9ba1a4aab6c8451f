"""Proof of the search of science §9.4 by simulation: per family, the key it names at C* against the truth.

The studies are :mod:`rollscale.core.search.simulate`'s (rollout axis,
B_problem 16, C_max 40,000, validation avg@4 over 100 problems), in its five
families and the three of :data:`rollscale.core.search.simulate.MORE_FAMILIES`
(a late bloomer, a close race, curves unbent at C_max). Each study runs the
search its settings name (``decision``) through the same
:func:`~rollscale.core.search.state.plan` /
:func:`~rollscale.core.search.decisions.decide` loop the sweep uses, every
study at once. Its answer (the leader of the last decision) is judged against
the study's true curves at C* (the curve of a median seed): the regret is
the true best reward at C* minus the answer's; the search is right when the
regret is at most epsilon. Rollouts spent are against the grid's: every key
a study may train (:data:`rollscale.core.search.simulate.UNIVERSE`, the
bracket's key included), ``seeds_max`` seeds, to C_max.

The search cannot be more right than the grid it saves: :func:`grid_decision`
reads the same decision (the fit stage's, science §9.3) from that whole grid,
and ``grid_right`` is its answer judged the same way. At the embedded
default's validation noise (avg@4 over 100 problems) the grid itself is right
in 90-95 % of ``cross`` and ``edge_low`` studies (docs/benchmarks.md): a run's
fitted reward at C_max is off its true curve by sd 0.012-0.019, as much as the
seeds differ, and two keys 0.02-0.03 apart are not resolved by 4 seeds of
such runs. ``SimStudy.eval_draws`` sets that noise.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from rollscale.core.fit.analysis import run_evals
from rollscale.core.fit.decision import decide as decide_at, fit_groups
from rollscale.core.fit.decision_table import decision_table
from rollscale.core.fit.verdict import SETTLING_RULES, search_verdict
from rollscale.core.search.decisions import decide
from rollscale.core.search.methods.decision import c_star, seed_cap
from rollscale.core.search.state import SearchSettings, empty_decisions, plan
from rollscale.core.search.simulate import UNIVERSE, Runs, SimStudy, grid_tables, seed_curve

__all__ = ["BudgetResult", "first_lines", "grid_decision", "seeds_oracle", "simulate_decision", "summarise_decision",
           "true_reward"]


def true_reward(study: SimStudy, n: int, c: float) -> float:
    """The reward of key ``n`` at budget ``c`` on the study's true curve (a median seed's)."""
    r0, a, c_mid, beta = study.curves[n]
    return float(r0 + (min(a, 1.0) - r0) / (1.0 + (c_mid / c) ** beta))


def seeds_oracle(study: SimStudy, seeds: int) -> bool:
    """Whether the key whose first ``seeds`` runs' true curves have the best mean at C_max is within the tolerance
    0.02 of the true best: the most a study of that many seeds can be right, with no evaluation noise and no fit."""
    def mean_at(n: int) -> float:
        curves = [seed_curve(study, n, j)[0] for j in range(seeds)]
        return float(np.mean([r0 + (min(a, 1.0) - r0) / (1.0 + (m / study.c_max) ** b) for r0, a, m, b in curves]))
    truth = {n: true_reward(study, n, study.c_max) for n in UNIVERSE}
    pick = max(UNIVERSE, key=mean_at)
    return bool(max(truth.values()) - truth[pick] <= 0.02 + 1e-12)


def a2_holds(study: SimStudy, points: int = 60) -> bool:
    """Whether the study's true best n is non-decreasing in C up to C_max (A2, science §9.4's rule ``a2``)."""
    c = np.geomspace(study.c_max / 64, study.c_max, points)
    best = [max(UNIVERSE, key=lambda n: true_reward(study, n, x)) for x in c]
    return bool(np.all(np.diff(best) >= 0))


def grid_decision(studies: list[SimStudy], settings: SearchSettings) -> pd.DataFrame:
    """The decision at C* from each study's whole grid (every key of :data:`UNIVERSE`, ``seeds_max`` seeds, to
    C_max), as the fit stage reads it: one row per study, the grid's answer (its leader), its regret and
    whether it is right (regret <= epsilon)."""
    cap = seed_cap(studies[0].group(), settings)
    full = [replace(s, seeds=tuple(range(cap))) for s in studies]
    runs, evals = grid_tables(full)
    points = evals.merge(runs[["run_id", "bucket", "n"]], on="run_id")
    curves = fit_groups(points, "n", "bucket")
    rows = []
    for s in full:
        target = c_star(s.group(), settings)
        table = decide_at(curves[s.name], target, settings.tolerance, settings.eta, rollout_axis=True,
                          resamples=max(settings.resamples, 1), seed=settings.bootstrap_seed)
        lead = table["leader"].iloc[0]
        answer = int(lead) if lead is not None else None  # None: C* beyond every fit's reach (science §9.3)
        truth = {n: true_reward(s, n, target) for n in UNIVERSE}
        regret = max(truth.values()) - truth[answer] if answer is not None else math.nan
        rows.append({"group": s.name, "grid_answer": answer, "grid_regret": regret,
                     "grid_right": regret <= settings.tolerance + 1e-12})
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class BudgetResult:
    """Per study the answer, its regret at C*, the rollouts spent, and the decisions behind them."""

    studies: pd.DataFrame
    decisions: pd.DataFrame
    legs: dict  # (study, n, seed) -> the leg-end steps each run was trained through


def simulate_decision(studies: list[SimStudy], settings: SearchSettings, grid: bool = False) -> BudgetResult:
    """Run every study through the search ``settings.method`` names (module docstring; the default, science
    §9.4's ``decision``). ``grid``: also the whole grid's own decision (:func:`grid_decision`: columns
    ``grid_answer``, ``grid_regret``, ``grid_right``)."""
    every = None if studies[0].schedule is not None else studies[0].eval_every
    # legs end at evaluations, as the stage's; a forecast's refits redraw the studies' evaluation noise
    settings = replace(settings, eval_every=every, eval_draws=settings.eval_draws or studies[0].eval_draws)
    runs = Runs(studies)
    groups = [s.group() for s in studies]
    decisions, legs = empty_decisions(), {}
    while not (todo := plan(groups, decisions, settings)).empty:
        for group, key, seed, c in zip(todo["group"], todo["key"], todo["seed"], todo["c"], strict=True):
            legs.setdefault((group, int(key), int(seed)), set()).add(runs.steps(runs.studies[group], int(key), c))
        decisions = pd.concat([decisions, decide(runs.points(legs), groups, decisions, settings)],
                              ignore_index=True)
    spent = runs.spent(legs)
    last = decisions.groupby("group").tail(1).set_index("group")
    rules = decisions.drop_duplicates(["group", "key"], keep="last")
    rows = []
    for s, g in zip(studies, groups, strict=True):
        target = c_star(g, settings)
        truth = {n: true_reward(s, n, target) for n in UNIVERSE}
        best = max(truth.values())
        answer = last["leader"].get(s.name)
        answer = int(answer) if isinstance(answer, str) else None
        grid_c = sum(runs.steps(s, n, s.c_max) * s.b_problem * n for n in UNIVERSE) * seed_cap(g, settings)
        mine = decisions[decisions["group"] == s.name]
        final = rules[rules["group"] == s.name]
        lead, _, decided = search_verdict(mine)
        # the answer a key the search had stopped on a settling rule (against another leader): science §11.3 says never
        ended = final[final["key"] == lead]
        stopped_answer = bool(((ended["action"] == "stop") & ended["rule"].isin(SETTLING_RULES)).any())
        rows.append({
            "group": s.name, "family": s.family, "c_star": target, "answer": answer,
            "true_best": max(truth, key=truth.get), "regret": best - truth[answer] if answer else math.nan,
            # not decided: the cap reached with keys open (a seed row's rule is "undecided" too: not this)
            "decided": decided, "stopped_answer": stopped_answer,
            "stops": ", ".join(f"{k}@{c:,.0f}({r})" for k, c, r, a in
                               zip(final["key"], final["c"], final["rule"], final["action"], strict=True) if a == "stop"),
            "stopped_early": int(((final["action"] == "stop") & (final["c_train"] < s.c_max)).sum()),
            "seeds_added": int((mine["action"] == "seed").sum()), "added": ",".join(mine.loc[mine["action"] == "add",
                                                                                          "key"].unique()),
            "search_rollouts": float(spent.get(s.name, 0.0)), "grid_rollouts": float(grid_c), "a2_holds": a2_holds(s)})
    out = pd.DataFrame(rows)
    out["spent"] = out["search_rollouts"] / out["grid_rollouts"]
    out["spent_c_star"] = out["search_rollouts"] / (2.0 * out["c_star"])  # science §10's cost: at most 2 x C*
    out["right"] = out["regret"] <= settings.tolerance + 1e-12
    if grid:
        out = out.merge(grid_decision(studies, settings), on="group", how="left")
    return BudgetResult(out, decisions, legs)


def first_lines(studies: list[SimStudy], result: BudgetResult, settings: SearchSettings,
                headline: Callable[[pd.DataFrame], tuple[str, bool, list[str]]]) -> pd.DataFrame:
    """The report's first line of every study, as the fit stage and the report make it from the search's runs
    (each to where it stopped) and its table (science §11.5: one verdict), beside the search's own verdict: one row
    per study, ``search_answer``, ``search_decided``, ``line``, ``line_answer`` (the n after "Use n = ", else
    None), ``line_answered``, and ``agree`` (the same key, and answered exactly where the search decided).
    ``headline``: the report's first line from a decision table
    (:func:`rollscale.report.decision_text.decision_headline`, passed by the caller: the core does not import the
    report)."""

    names = {s.name for s in studies}
    runs, evals = grid_tables(studies, {run: ends for run, ends in result.legs.items() if run[0] in names})
    # the sweep names a rollout-axis group by what it holds fixed (rollscale.core.search.replay.DESIGNS)
    label = {s.name: f"n:bucket={s.name}/rule=uniform/b_problem={s.b_problem}" for s in studies}
    search = result.decisions.assign(group=result.decisions["group"].map(label)).dropna(subset=["group"])
    rows = []
    for c_target, group in {c: [s for s in studies if c_star(s.group(), settings) == c]
                            for c in {c_star(s.group(), settings) for s in studies}}.items():
        keep = runs["bucket"].isin([s.name for s in group])
        table = decision_table(run_evals(runs[keep], evals[evals["run_id"].isin(runs.loc[keep, "run_id"])], None),
                               c_target, settings.tolerance, settings.eta, max(settings.resamples, 1),
                               settings.bootstrap_seed, search=search)
        for s in group:
            lead, _, decided = search_verdict(result.decisions[result.decisions["group"] == s.name])
            line, answered, _ = headline(table[table["bucket"] == s.name])
            named = line.removeprefix("Use n = ").split(" ", 1)[0] if line.startswith("Use n = ") else None
            rows.append({"group": s.name, "family": s.family, "search_answer": None if lead is None else int(lead),
                         "search_decided": decided, "line": line, "line_answered": answered,
                         "line_answer": None if named is None else int(named)})
    out = pd.DataFrame(rows)
    out["agree"] = (out["line_answered"] == out["search_decided"]) & (
        ~out["line_answered"] | (out["line_answer"] == out["search_answer"]))
    return out


def summarise_decision(result: BudgetResult) -> pd.DataFrame:
    """One row per family: studies, share right (regret <= epsilon), share decided, median / max spent, seeds added,
    whether A2 holds in every study, and (where the grid was decided too) the grid's share right; and an ``all``
    row."""
    s = result.studies

    def row(t: pd.DataFrame) -> dict:
        grid = {"grid_right": float(t["grid_right"].mean())} if "grid_right" in t else {}
        return {"studies": len(t), "right": float(t["right"].mean()), **grid, "decided": float(t["decided"].mean()),
                "median_spent": float(t["spent"].median()), "max_spent": float(t["spent"].max()),
                "mean_regret": float(t["regret"].mean()), "seeds_added": float(t["seeds_added"].mean()),
                "median_spent_c_star": float(t["spent_c_star"].median()),
                "max_spent_c_star": float(t["spent_c_star"].max()),
                "stopped_early": float(t["stopped_early"].mean()), "a2_holds": bool(t["a2_holds"].all()),
                "stopped_answer": float(t["stopped_answer"].mean())}

    table = pd.DataFrame({f: row(t) for f, t in s.groupby("family", sort=False)}).T
    table.loc["all"] = row(s)
    return table
