"""Replay a finished grid rung by rung: what the sweep's search would have decided and spent (science §9.4).

The proof by replay: the grid's own stored runs are read as the search would
have seen them. At each decision every run is truncated at the budget the
search would have trained it to (:func:`rollscale.core.search.state.truncate`:
its evaluations up to the budget, and the one that crosses it within one
step), so a run the search stopped keeps only its points up to the stop
rung. Keys or seeds the search would add that the grid lacks are reported
("would add, not in grid") and have no points: they are never stopped and
never decide anything. The search's decision at C* (science §9) is compared
with the grid's by :func:`rollscale.core.search.agreement.decision_agreement`
on the grid's evaluations the search kept (:attr:`ReplayResult.evals`). Every key starts
with the seeds the method starts it with (``sweep.search.method: decision``:
the grid's first ``seeds_min``); the grid's other seeds come in only where a
``seed`` decision asks for them.

Designs (:data:`DESIGNS`): ``n`` (rollout axis: key n, per family and
B_problem), ``b_problem`` (prompt axis: key B_problem, per n), ``iso_batch``
(key n, per total batch B) and ``rule`` (key: the allocation rule, per n and
B_problem; no bracket).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import pandas as pd

from rollscale.core.fit.analysis import run_evals
from rollscale.core.search.decisions import decide, search_method
from rollscale.core.search.state import SearchGroup, SearchSettings, bracket_limits, empty_decisions, plan, truncate

__all__ = ["DESIGNS", "ReplayResult", "replay", "replay_groups"]

# design -> (search axis, the key column, what each group holds fixed)
DESIGNS: dict[str, tuple[str, str, list[str]]] = {
    "n": ("rollout", "n", ["bucket", "rule", "b_problem"]),
    "b_problem": ("prompt", "b_problem", ["bucket", "rule", "n"]),
    "iso_batch": ("iso_batch", "n", ["bucket", "rule", "b"]),
    "rule": ("rule", "rule", ["bucket", "n", "b_problem"]),
}


@dataclass(frozen=True)
class ReplayResult:
    """The search's decisions on a grid, each grid run's rollouts both ways, and what the search kept.

    ``runs``: group, key, seed, run_id, grid_c (rollouts the grid run
    generated), search_c (what the search would have). ``summary``: one
    row per group (rollouts spent against the grid's, stops by rule, keys
    and seeds it would add that the grid lacks, the search's own answer: its
    last decision's leader and whether it was decided). ``evals``: the grid's
    :func:`rollscale.core.fit.analysis.run_evals` rows the search would have
    (what the fit stage reads after it; :func:`rollscale.core.search.agreement.decision_agreement`).
    """

    decisions: pd.DataFrame
    runs: pd.DataFrame
    summary: pd.DataFrame
    evals: pd.DataFrame


def replay_groups(evals: pd.DataFrame, design: str, b_max: int, start_keys: dict[str, tuple] | None = None,
                  ) -> tuple[list[SearchGroup], pd.DataFrame]:
    """The search groups of a grid's :func:`rollscale.core.fit.analysis.run_evals` table (every seed), and its
    points.

    ``start_keys`` (group -> keys) starts a group's search from a subset of
    the grid's keys (the rest can only come in through the bracket).
    """
    if design not in DESIGNS:
        raise ValueError(f"design: expected one of {list(DESIGNS)}, got {design!r}")
    axis, key_col, fixed_cols = DESIGNS[design]
    groups, points = [], []
    for ids, g in evals.groupby(fixed_cols, sort=True):
        if g[key_col].nunique() < 2:
            continue
        name = f"{design}:" + "/".join(f"{c}={v}" for c, v in zip(fixed_cols, ids, strict=True))
        fixed = None if axis == "rule" else int(ids[-1])
        lo, hi = bracket_limits(axis, fixed, b_max)
        c_max = float(g["c_max"].max()) if g["c_max"].notna().any() else float(g["c"].max())
        keys = start_keys.get(name, tuple(g[key_col].unique())) if start_keys else tuple(g[key_col].unique())
        seeds = tuple(sorted(int(s) for s in g["seed"].unique()))
        groups.append(SearchGroup(name, axis, keys, seeds, c_max, fixed=fixed, key_min=lo, key_max=hi))
        points.append(pd.DataFrame({"group": name, "key": g[key_col].to_numpy() if axis == "rule" else
                                    g[key_col].to_numpy(int), "run_id": g["run_id"].to_numpy(),
                                    "seed": g["seed"].to_numpy(int), "c": g["c"].to_numpy(float),
                                    "avg_at_k": g["avg_at_k"].to_numpy(float), "b": g["b"].to_numpy(float)}))
    cols = ["group", "key", "run_id", "seed", "c", "avg_at_k", "b"]
    return groups, (pd.concat(points, ignore_index=True) if points else pd.DataFrame(columns=cols))


def replay(runs: pd.DataFrame, evals: pd.DataFrame, design: str, settings: SearchSettings, b_max: int = 1024,
           start_keys: dict[str, tuple] | None = None) -> ReplayResult:
    """Replay the finished runs of a grid through the search (module docstring); pure, no files.

    ``runs`` / ``evals`` are the sweep's tables (finished runs are used); ``settings`` the search's (its
    ``eval_every`` should be the sweep's): its method decides, and says which of the grid's seeds each key
    starts with, as the sweep's search does (:func:`rollscale.sweep.groups.search_plan`).
    """
    ev = run_evals(runs, evals)
    groups, points = replay_groups(ev, design, b_max, start_keys)
    method = search_method(settings.method)
    groups = [dataclasses.replace(g, seeds=method.start_seeds(g.seeds, settings.search)) for g in groups]
    decisions = empty_decisions()
    have = set(zip(points["group"], points["key"], points["seed"], strict=True))
    while not plan(groups, decisions, settings).empty:
        decisions = pd.concat([decisions, decide(points, groups, decisions, settings)], ignore_index=True)
    final = decisions.drop_duplicates(["group", "key", "seed"], keep="last")
    budgets = pd.DataFrame({"group": final["group"], "seed": final["seed"].astype(int), "c": final["c_train"],
                            "key": [g.key_of(k) for g, k in zip(_lookup(groups, final["group"]), final["key"],
                                                                  strict=True)]})
    budgets["in_grid"] = [(g, k, s) in have for g, k, s in zip(budgets["group"], budgets["key"], budgets["seed"],
                                                                strict=True)]
    kept = truncate(points, budgets[budgets["in_grid"]])
    per_run = _runs(points, kept)
    kept_evals = ev.merge(kept[["run_id", "c"]].drop_duplicates(), on=["run_id", "c"], how="inner")
    return ReplayResult(decisions, per_run, _summary(groups, decisions, budgets, per_run), kept_evals)


def _lookup(groups: list[SearchGroup], names: pd.Series) -> list[SearchGroup]:
    by_name = {g.group: g for g in groups}
    return [by_name[n] for n in names]


def _runs(points: pd.DataFrame, kept: pd.DataFrame) -> pd.DataFrame:
    """Per grid run: the rollouts it generated (its last evaluation) and those the search's run would have."""
    ids = ["group", "key", "seed", "run_id"]
    grid = points.groupby(ids, sort=True)["c"].max().rename("grid_c")
    search = kept.groupby(ids, sort=True)["c"].max().rename("search_c")
    return pd.concat([grid, search], axis=1).fillna({"search_c": 0.0}).reset_index()


def _summary(groups: list[SearchGroup], decisions: pd.DataFrame, budgets: pd.DataFrame, runs: pd.DataFrame,
             ) -> pd.DataFrame:
    rows = []
    for g in groups:
        d = decisions[decisions["group"] == g.group]
        stops = d[d["action"] == "stop"].drop_duplicates("key")
        adds = d[d["action"] == "add"].drop_duplicates("key")["key"]
        grid_keys = {str(k) for k in runs.loc[runs["group"] == g.group, "key"]}
        missing_seeds = budgets[(budgets["group"] == g.group) & ~budgets["in_grid"]
                                & budgets["key"].astype(str).isin(grid_keys)]
        r = runs[runs["group"] == g.group]
        last = d[d["decision"] == d["decision"].max()] if len(d) else d  # science §9.4: the search's own answer
        rows.append({
            "group": g.group, "keys": ", ".join(str(k) for k in g.keys), "rungs": int(d["rung"].max()) if len(d) else 0,
            "stops": "; ".join(f"{k} at C = {c:,.0f} ({rule})" for k, c, rule in
                               zip(stops["key"], stops["c"], stops["rule"], strict=True)),
            "adds_in_grid": ", ".join(k for k in adds if k in grid_keys),
            "would_add_not_in_grid": ", ".join(k for k in adds if k not in grid_keys),
            "seeds_not_in_grid": int(len(missing_seeds)),
            "grid_rollouts": float(r["grid_c"].sum()), "search_rollouts": float(r["search_c"].sum()),
            "spent": float(r["search_c"].sum() / r["grid_c"].sum()) if r["grid_c"].sum() else math.nan,
            "search_leader": last["leader"].dropna().iloc[-1] if last["leader"].notna().any() else None,
            "search_decided": bool((last["rule"] == "decided").any()),
        })
    return pd.DataFrame(rows)
