"""DAPO dynamic sampling (science §4)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from pydantic import Field

from rollscale.core.grpo.allocation import (
    AllocationRule,
    Group,
    NextPrompts,
    RuleParams,
    SampleFn,
    StepAllocation,
    all_equal,
    check_int,
    draw,
    sample_groups,
)
from rollscale.registry import ALLOCATION_RULES


class DynamicParams(RuleParams):
    # at most factor * B_problem prompts drawn per step
    max_draws_factor: int = Field(4, ge=1)


@ALLOCATION_RULES.register("dynamic")
@dataclass
class DynamicSampling(AllocationRule):
    """DAPO dynamic sampling (science §4).

    Draw prompts and generate n rollouts each; drop groups whose rewards are all
    equal; keep drawing until B_problem groups with nonzero variance are
    collected or ``max_draws`` prompts have been drawn this step (default
    4 * B_problem). The first round draws B_problem prompts, each later round
    exactly the number of groups still missing (capped by ``max_draws``), so no
    surplus group is ever generated. If the cap is hit the step trains on the
    groups collected, which may be fewer than B_problem or none (the trainer
    then skips the update; C still grows). Every generated rollout counts in C.
    """

    max_draws: int | None = None
    name: ClassVar[str] = "dynamic"
    Params: ClassVar[type[RuleParams]] = DynamicParams

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_draws is None:
            self.max_draws = 4 * self.b_problem
        check_int(self.max_draws, "max_draws", self.b_problem)

    @classmethod
    def for_grid_point(cls, params: DynamicParams, n: int, b_problem: int) -> DynamicSampling:
        return cls(b_problem, n, max_draws=params.max_draws_factor * b_problem)

    def run_id_parts(self) -> list[str]:
        return [f"d{self.max_draws}"]

    def allocate(self, next_prompts: NextPrompts, sample_fn: SampleFn) -> StepAllocation:
        groups: list[Group] = []
        draws = 0
        zero_var = 0
        while len(groups) < self.b_problem and draws < self.max_draws:
            k = min(self.b_problem - len(groups), self.max_draws - draws)
            problems = draw(next_prompts, k)
            draws += k
            for p, rs in zip(problems, sample_groups(sample_fn, problems, self.n)):
                if all_equal(rs):
                    zero_var += 1
                else:
                    groups.append(Group(p, rs))
        generated = draws * self.n
        return StepAllocation(
            groups=groups,
            rollouts_generated=generated,
            draws=draws,
            discarded_rollouts=generated - len(groups) * self.n,
            zero_variance_draws=zero_var,
        )
