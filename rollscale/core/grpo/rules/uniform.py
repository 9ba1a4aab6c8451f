"""Uniform allocation: plain GRPO (science §4)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rollscale.core.grpo.allocation import AllocationRule, Group, NextPrompts, SampleFn, StepAllocation, all_equal, draw, sample_groups
from rollscale.registry import ALLOCATION_RULES


@ALLOCATION_RULES.register("uniform")
@dataclass
class Uniform(AllocationRule):
    """Plain GRPO: n rollouts for each of B_problem prompts (science §4)."""

    name: ClassVar[str] = "uniform"

    def allocate(self, next_prompts: NextPrompts, sample_fn: SampleFn) -> StepAllocation:
        problems = draw(next_prompts, self.b_problem)
        rollouts = sample_groups(sample_fn, problems, self.n)
        groups = [Group(p, rs) for p, rs in zip(problems, rollouts)]
        return StepAllocation(
            groups=groups,
            rollouts_generated=self.b_problem * self.n,
            draws=self.b_problem,
            zero_variance_draws=sum(all_equal(rs) for rs in rollouts),
        )
