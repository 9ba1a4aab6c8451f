"""The next decision of every group of a sweep's search, made by the method ``sweep.search.method`` names
(:data:`rollscale.registry.SEARCH_METHODS`; science §9.4 for the default, ``decision``).

One dispatch for the sweep (:class:`rollscale.sweep.rungs.SweepSearch`), the replay
(:mod:`rollscale.core.search.replay`) and the simulation (:mod:`rollscale.core.search.simulate_budget`).
How the sweep stage drives it (one loop, any executor)::

    settings = search_settings(sweep, study)             # rollscale.sweep.groups: sweep.search, study.*
    groups = search_plan(sweep).groups                  # one per family x what it holds fixed
    decisions = empty_decisions()
    while not (todo := plan(groups, decisions, settings)).empty:
        train each (group, key, seed) run of ``todo`` to budget ``c`` (a new key or seed starts from scratch; the
            run store resumes the others; a run stops at the first step with C >= c and evaluates there)
        points = every evaluation of the groups' runs so far: POINT_COLUMNS (+ ``b`` = n * B_problem)
        decisions = pd.concat([decisions, decide(points, groups, decisions, settings)], ignore_index=True)
        write ``decisions`` (the ``search`` table) before training on: a crash resumes from it

Rungs are barriers per group only. ``decide`` reads each run only up to the budget the decisions trained it
to (:func:`rollscale.core.search.state.truncate`), so a store holding more (a grid run earlier) gives the same
decisions; the state is read back from the decision rows, so a rerun resumes to the same decisions.
"""

from __future__ import annotations

import pandas as pd

from rollscale.core.fit.columns import require
from rollscale.core.search.methods.base import SearchMethod
from rollscale.core.search.state import (
    DECISION_COLUMNS,
    SearchGroup,
    SearchSettings,
    empty_decisions,
    run_budgets,
    states,
    truncate,
)
from rollscale.registry import SEARCH_METHODS

__all__ = ["POINT_COLUMNS", "decide", "search_method"]

# search_method loads a module of this package by name (SEARCH_METHODS is lazy): a literal that
# rollscale.pipeline.stages.deps reads as an import, so the stages that run this module depend on the folder
PLUGIN_PACKAGES = ("rollscale.core.search.methods",)

POINT_COLUMNS = ("group", "key", "run_id", "seed", "c", "avg_at_k")  # a run's evaluations, as ``decide`` reads them


def search_method(name: str) -> SearchMethod:
    """The method ``sweep.search.method`` names (one module of :mod:`rollscale.core.search.methods`)."""
    return SEARCH_METHODS.get(name)()


def decide(points: pd.DataFrame, groups: list[SearchGroup], decisions: pd.DataFrame,
           settings: SearchSettings) -> pd.DataFrame:
    """The next decision of every group whose search is not done: new rows of the ``search`` table.

    ``points``: the groups' evaluations, :data:`POINT_COLUMNS` (``key`` as the group types it), optionally
    ``b`` (rollouts per step, for :func:`rollscale.core.search.state.truncate`). Each run is read only up to
    the budget the decisions so far trained it to, so extra rows (a run trained further earlier, a grid
    replayed) change nothing. The rows are the method's (``settings.method``).
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
    rows = search_method(settings.method).decide(pts, pending, states(pending, decisions, settings), settings)
    out = pd.DataFrame(rows, columns=DECISION_COLUMNS)
    return out.astype({"decision": int, "rung": int, "seed": int, "n_points": int})
