"""The sweep grid: which GRPO runs a study trains (science §1, §3, §4).

Turns the ``sweep`` section of params into :class:`~rollscale.train.trainer.RunConfig`
objects with readable, stable run ids, for the three designs of the
CBS-in-RLVR framework and a full grid.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass

from rollscale.config import SweepParams
from rollscale.core.allocation import RuleNotApplicable, RuleParams, rule_class
from rollscale.core.rollouts import SamplingConfig
from rollscale.train.run_config import RunConfig

log = logging.getLogger("rollscale.train.sweep")

@dataclass(frozen=True)
class GridPoint:
    n: int
    b_problem: int
    rule: RuleParams  # the rule's entry of sweep.rules: its name (``rule``) and hyperparameters
    seed: int


def grid_points(sweep: SweepParams) -> list[GridPoint]:
    """(n, B_problem, rule, seed) of every run, within the hardware bound B <= b_max."""
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
    for n, b in sorted(set(shapes) - set(kept)):
        log.warning("sweep: skipping n=%d x B_problem=%d: B = %d exceeds sweep.b_max = %d", n, b, n * b, sweep.b_max)
    if not kept:
        raise ValueError(f"sweep: every grid point exceeds sweep.b_max = {sweep.b_max}")
    return [GridPoint(n, b, rule, seed) for (n, b), rule, seed in itertools.product(kept, sweep.rules, sweep.seeds)]


def run_configs(sweep: SweepParams, sampling: SamplingConfig) -> list[RunConfig]:
    """One :class:`RunConfig` per grid point, ids like ``np16_nr8_uniform_s0``."""
    train = sweep.train.for_bucket(sweep.bucket)  # the validated section itself, recipe resolved
    configs = []
    for point in grid_points(sweep):
        name = point.rule.rule
        try:
            rule = rule_class(name).for_grid_point(point.rule, point.n, point.b_problem)
        except RuleNotApplicable as why:
            log.warning("sweep: skipping rule %r at n=%d, B_problem=%d: %s", name, point.n, point.b_problem, why)
            continue
        config = RunConfig(
            n=point.n,
            b_problem=point.b_problem,
            rule=name,
            rule_args=rule.run_args(),
            c_max=sweep.c_max,
            seed=point.seed,
            train=train,
            sampling=sampling,
            eval_every=sweep.eval_every,
            eval_k=sweep.eval_k,
            eval_temperature=sweep.eval_temperature,
            checkpoint_every=sweep.checkpoint_every,
            noise_every=sweep.noise_every,
        )
        configs.append(config)
    return configs
