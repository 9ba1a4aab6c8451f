"""A sweep's search groups (science §9.4): which runs compete for which key, and the search's settings.

A sweep design becomes one or more :class:`~rollscale.core.search.state.SearchGroup`,
each a set of runs the search picks a best key in, holding the rest fixed:

* ``rollout_axis`` (and ``grid`` with several n): key n, one group per rule and B_problem;
* ``prompt_axis`` (and ``grid`` with one n): key B_problem, one group per rule and n;
* ``iso_batch``: key n at the fixed total batch B, one group per rule;
* one n and one B_problem with several rules: key the rule, no bracket.

Group names are the replay's (:func:`rollscale.core.search.replay.replay_groups`),
so a replay of the grid and the sweep's own search name the same groups. Runs
of a grid point that is alone in its group (nothing to compare) train to
C_max as in the grid.
"""

from __future__ import annotations

from dataclasses import dataclass

from rollscale.config import DecisionParams, SweepParams
from rollscale.core.grpo.allocation import RuleParams
from rollscale.core.search.decisions import search_method
from rollscale.core.search.replay import DESIGNS
from rollscale.core.search.state import SearchGroup, SearchSettings, bracket_limits
from rollscale.sweep.grid import GridPoint, plan_runs

__all__ = ["SearchPlan", "search_design", "search_plan", "search_settings"]


def search_settings(sweep: SweepParams, study: DecisionParams | None = None,
                    val_size: int | None = None) -> SearchSettings:
    """The search's settings: ``sweep.search`` itself with the sweep's evaluation interval and seeds, and the
    decision's C* and tolerance (``study``; its defaults when None). On the shared budget schedule (science
    §9.1) a run evaluates at the first step past each rung's budget, so a leg ends there (``eval_every`` None).
    ``val_size``: the validation problems (``bucket.val_size``), whose avg@eval_k the forecast's refits redraw."""
    return SearchSettings(sweep.search, study if study is not None else DecisionParams(),
                          eval_every=None if sweep.eval_per_doubling else sweep.eval_every,
                          sweep_seeds=len(set(sweep.seeds)),
                          eval_draws=val_size * sweep.eval_k if val_size else None)


def search_design(sweep: SweepParams) -> str | None:
    """The replay design (:data:`rollscale.core.search.replay.DESIGNS`) the sweep's grid searches over, or None
    when its grid has one point per rule and one rule (nothing to choose)."""
    if sweep.design == "iso_batch":
        return "iso_batch"
    several_n, several_b = len(set(sweep.n)) > 1, len(set(sweep.b_problem)) > 1
    if sweep.design == "rollout_axis" and several_n or sweep.design == "grid" and several_n:
        return "n"
    if sweep.design in ("prompt_axis", "grid") and several_b:
        return "b_problem"
    return "rule" if len(sweep.rules) > 1 else None


@dataclass(frozen=True)
class SearchPlan:
    """The groups of a sweep's search and how a (group, key, seed) becomes a grid point."""

    design: str | None
    groups: list[SearchGroup]
    # group -> (its rule, what it holds fixed: B_problem, n or B; for the rule axis (n, B_problem))
    fixed: dict[str, tuple[RuleParams | None, int | tuple[int, int]]]
    alone: list[GridPoint]  # grid points in no group: trained to C_max
    rules: tuple[RuleParams, ...]

    def point(self, group: str, key: object, seed: int) -> GridPoint:
        """The grid point of ``key``'s run with ``seed`` in ``group`` (a bracket key or seed the grid lacks too)."""
        rule, fixed = self.fixed[group]
        axis = next(g.axis for g in self.groups if g.group == group)
        if axis == "rule":
            n, b = fixed  # type: ignore[misc]
            return GridPoint(n, b, next(r for r in self.rules if r.rule == str(key)), seed)
        k, held = int(key), int(fixed)  # type: ignore[call-overload, arg-type]
        n, b = {"rollout": (k, held), "prompt": (held, k), "iso_batch": (k, held // k)}[axis]
        return GridPoint(n, b, rule, seed)  # type: ignore[arg-type]


def search_plan(sweep: SweepParams) -> SearchPlan:
    """The search groups of ``sweep``'s grid (module docstring); bracket limits from ``sweep.search``."""
    design = search_design(sweep)
    points = [p for p, _ in plan_runs(sweep).runs]
    rules = tuple(sweep.rules)
    if design is None:
        return SearchPlan(None, [], {}, points, rules)
    axis, key_col, fixed_cols = DESIGNS[design]
    value = {"bucket": lambda p: sweep.bucket, "rule": lambda p: p.rule.rule, "n": lambda p: p.n,
             "b_problem": lambda p: p.b_problem, "b": lambda p: p.n * p.b_problem}
    key_of = {"n": lambda p: p.n, "b_problem": lambda p: p.b_problem, "rule": lambda p: p.rule.rule}[key_col]
    members: dict[str, list[GridPoint]] = {}
    for p in points:
        name = f"{design}:" + "/".join(f"{c}={value[c](p)}" for c in fixed_cols)
        members.setdefault(name, []).append(p)
    groups, fixed, alone = [], {}, []
    # the method's start (science §9.4: keys start with seeds_min seeds, more where the decision hangs)
    seeds = search_method(sweep.search.method).start_seeds(tuple(sorted(set(sweep.seeds))), sweep.search)
    for name, ps in sorted(members.items()):
        keys = sorted({key_of(p) for p in ps}, key=str if axis == "rule" else int)
        if len(keys) < 2:
            alone += ps
            continue
        held = None if axis == "rule" else int(value[fixed_cols[-1]](ps[0]))
        lo, hi = bracket_limits(axis, held, sweep.b_max, sweep.search.key_min, sweep.search.key_max)
        groups.append(SearchGroup(name, axis, tuple(keys), seeds, float(sweep.c_max), fixed=held,
                                  key_min=lo, key_max=hi))
        fixed[name] = (None, (ps[0].n, ps[0].b_problem)) if axis == "rule" else (ps[0].rule, held)
    return SearchPlan(design, groups, fixed, alone, rules)
