"""Pilot-Commit: a pilot round over a larger pool, then the rest of the rollouts on the most informative prompts (science §4)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from pydantic import Field

from rollscale.core.grpo.allocation import (
    AllocationRule,
    Group,
    NextPrompts,
    RuleNotApplicable,
    RuleParams,
    SampleFn,
    StepAllocation,
    all_equal,
    draw,
    sample_groups,
)
from rollscale.core.checks import is_finite_number, is_int
from rollscale.registry import ALLOCATION_RULES


def pilot_scores(successes, n_pilot: int) -> np.ndarray:
    """Pilot-Commit informativeness score (science §4).

    Beta(1,1) posterior mean of the success rate ``q = (s + 1) / (n_pilot + 2)``
    and the score ``q (1 - q)``, the Bernoulli reward variance at ``q``.
    ``successes`` may be fractional (sum of rewards in [0, 1]).
    """
    if not is_int(n_pilot) or n_pilot < 1:
        raise ValueError(f"n_pilot must be a positive int, got {n_pilot!r}")
    s = np.asarray(successes, dtype=np.float64)
    if not np.all(np.isfinite(s)) or np.any(s < 0) or np.any(s > n_pilot):
        raise ValueError(f"successes must lie in [0, n_pilot={n_pilot}]")
    q = (s + 1.0) / (n_pilot + 2.0)
    return q * (1.0 - q)


class PilotParams(RuleParams):
    n_pilot: int = Field(2, ge=1)  # pilot rollouts per pool prompt
    pool_factor: float = Field(2.0, ge=1)  # pool size / B_problem


@ALLOCATION_RULES.register("pilot")
@dataclass
class PilotCommit(AllocationRule):
    """Pilot-Commit (science §4, our precise version).

    A pool of ``ceil(pool_factor * B_problem)`` prompts gets ``n_pilot`` rollouts
    each. Score each by ``pilot_scores`` (Beta(1,1) posterior reward variance,
    successes = sum of pilot rewards, rewards expected in [0, 1]). Prompts whose
    pilot rewards are all equal are skipped unless fewer than B_problem others
    remain, in which case the best-scored of them fill the gap. The top B_problem
    (ties by pool order) get ``n - n_pilot`` more rollouts; their pilot rollouts
    join the group (pilot first). Groups are returned in pool order. Skipped
    prompts are consumed from the data order; their pilot rollouts count in C
    and are not trained on.
    """

    n_pilot: int
    pool_factor: float = 2.0
    name: ClassVar[str] = "pilot"
    Params: ClassVar[type[RuleParams]] = PilotParams

    def __post_init__(self) -> None:
        super().__post_init__()
        if not is_int(self.n_pilot) or not 1 <= self.n_pilot < self.n:
            raise ValueError(f"n_pilot must be an int with 1 <= n_pilot < n={self.n}, got {self.n_pilot!r}")
        if not (is_finite_number(self.pool_factor) and self.pool_factor >= 1):
            raise ValueError(f"pool_factor must be a number >= 1, got {self.pool_factor!r}")
        self.pool_factor = float(self.pool_factor)  # 2 and 2.0 are one run (its id and config hash)

    @classmethod
    def for_grid_point(cls, params: PilotParams, n: int, b_problem: int) -> PilotCommit:
        if params.n_pilot >= n:
            raise RuleNotApplicable(f"n_pilot={params.n_pilot} is not below n={n}")
        return cls(b_problem, n, n_pilot=params.n_pilot, pool_factor=params.pool_factor)

    def run_id_parts(self) -> list[str]:
        return [f"p{self.n_pilot}", f"pf{self.pool_factor:g}"]

    @property
    def pool_size(self) -> int:
        # round first so that e.g. 1.1 * 10 is 11, not 12 from float error
        return int(math.ceil(round(self.pool_factor * self.b_problem, 9)))

    @property
    def rollouts_per_step_nominal(self) -> int:
        return self.pool_size * self.n_pilot + self.b_problem * (self.n - self.n_pilot)

    def allocate(self, next_prompts: NextPrompts, sample_fn: SampleFn) -> StepAllocation:
        pool = draw(next_prompts, self.pool_size)
        pilots = sample_groups(sample_fn, pool, self.n_pilot)
        constant = np.array([all_equal(rs) for rs in pilots])
        pilot_rewards = np.array([[float(r.reward) for r in rs] for rs in pilots])
        if np.any(pilot_rewards < 0) or np.any(pilot_rewards > 1):
            raise ValueError("Pilot-Commit scores need rewards in [0, 1] (successes of a Beta(1,1) posterior)")
        successes = pilot_rewards.sum(axis=1)
        scores = pilot_scores(successes, self.n_pilot)
        # Informative prompts first, then by score, ties by pool order (stable sort).
        order = np.lexsort((np.arange(len(pool)), -scores, constant))
        chosen = sorted(int(i) for i in order[: self.b_problem])
        extra = sample_groups(sample_fn, [pool[i] for i in chosen], self.n - self.n_pilot)
        groups = [Group(pool[i], list(pilots[i]) + list(more)) for i, more in zip(chosen, extra)]
        pilot_rollouts = self.pool_size * self.n_pilot
        return StepAllocation(
            groups=groups,
            rollouts_generated=pilot_rollouts + self.b_problem * (self.n - self.n_pilot),
            draws=self.pool_size,
            pilot_rollouts=pilot_rollouts,
            discarded_rollouts=(self.pool_size - self.b_problem) * self.n_pilot,
            zero_variance_draws=int(constant.sum()),
        )
