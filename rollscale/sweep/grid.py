"""The sweep grid: which GRPO runs a study trains (science §1, §3, §4).

Turns the ``sweep`` section of params into :class:`~rollscale.train.trainer.RunConfig`
objects with readable, stable run ids, for the three designs of the
CBS-in-RLVR framework and a full grid.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rollscale.config import SweepParams
from rollscale.core.grpo.allocation import AllocationRule, RuleNotApplicable, RuleParams, rule_class
from rollscale.core.rollouts import SamplingConfig

if TYPE_CHECKING:  # RunConfig pulls in torch: planning the grid (rollscale check) does not need it
    from rollscale.train.run_config import RunConfig

log = logging.getLogger("rollscale.sweep.grid")


@dataclass(frozen=True)
class GridPoint:
    n: int
    b_problem: int
    rule: RuleParams  # the rule's entry of sweep.rules: its name (``rule``) and hyperparameters
    seed: int


@dataclass(frozen=True)
class RunPlan:
    """The runs a sweep section trains (each a grid point with its rule at that point) and why
    the others are skipped (B over b_max; a rule that cannot run there, e.g. PODS keeping m >= n)."""

    runs: list[tuple[GridPoint, AllocationRule]]
    skipped: list[str]


def plan_runs(sweep: SweepParams) -> RunPlan:
    """(n, B_problem, rule, seed) of every run within the hardware bound B <= b_max, with its
    rule (science §1, §4); raises ValueError when the design cannot be laid out."""
    if sweep.design == "prompt_axis":
        shapes = [(sweep.n[0], b) for b in sweep.b_problem]
    elif sweep.design == "rollout_axis":
        shapes = [(n, sweep.b_problem[0]) for n in sweep.n]
    elif sweep.design == "iso_batch":
        bad = [n for n in sweep.n if sweep.b_total % n]
        if bad:
            raise ValueError(f"sweep.n: iso_batch needs each n to divide sweep.b_total = {sweep.b_total}, not {bad}")
        shapes = [(n, sweep.b_total // n) for n in sweep.n]
    else:
        shapes = list(itertools.product(sweep.n, sweep.b_problem))
    kept = [(n, b) for n, b in shapes if n * b <= sweep.b_max]
    skipped = [f"n={n} x B_problem={b}: B = {n * b} exceeds sweep.b_max = {sweep.b_max}"
               for n, b in sorted(set(shapes) - set(kept))]
    if not kept:
        raise ValueError(f"sweep: every grid point exceeds sweep.b_max = {sweep.b_max}")
    runs: list[tuple[GridPoint, AllocationRule]] = []
    for (n, b), params in itertools.product(kept, sweep.rules):
        try:
            rule = rule_class(params.rule).for_grid_point(params, n, b)
        except RuleNotApplicable as why:
            skipped.append(f"rule {params.rule!r} at n={n}, B_problem={b}: {why}")
            continue
        runs += [(GridPoint(n, b, params, seed), rule) for seed in sweep.seeds]
    return RunPlan(runs, skipped)


def point_config(sweep: SweepParams, sampling: SamplingConfig, point: GridPoint) -> RunConfig:
    """The :class:`RunConfig` of one grid point (also a key or seed the search adds, science §9.4);
    raises :class:`~rollscale.core.grpo.allocation.RuleNotApplicable` where its rule cannot run there."""
    from rollscale.train.run_config import RunConfig

    rule = rule_class(point.rule.rule).for_grid_point(point.rule, point.n, point.b_problem)
    return RunConfig(
        n=point.n,
        b_problem=point.b_problem,
        rule=point.rule.rule,
        rule_args=rule.run_args(),
        c_max=sweep.c_max,
        seed=point.seed,
        train=sweep.train.for_bucket(sweep.bucket),  # the validated section itself, recipe resolved
        sampling=sampling,
        **sweep.run_record(),  # evaluations, checkpoints, noise: the sweep's own (RunRecordParams)
    )


def run_configs(sweep: SweepParams, sampling: SamplingConfig) -> list[RunConfig]:
    """One :class:`RunConfig` per planned run, ids like ``np16_nr8_uniform_s0``."""
    plan = plan_runs(sweep)
    for why in plan.skipped:
        log.warning("sweep: skipping %s", why)
    return [point_config(sweep, sampling, point) for point, _ in plan.runs]
