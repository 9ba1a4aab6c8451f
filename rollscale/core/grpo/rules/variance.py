"""Variance-proportional allocation: a step's rollouts go to its prompts in proportion to the
reward variance p(1 - p) their previous visits predict (science §4; in the spirit of
Knapsack RL, Li et al. 2025, and VIP, Nguyen et al. 2026)."""

from __future__ import annotations

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
from rollscale.core.checks import is_finite_number
from rollscale.registry import ALLOCATION_RULES

MIN_GROUP = 2  # a GRPO group: one rollout alone has zero advantage


def largest_remainder(weights, total: int, minimum: int) -> np.ndarray:
    """Integer counts, each ``>= minimum``, summing to ``total``, the part above the minimum
    proportional to ``weights`` (Hamilton's largest-remainder rounding; ties, to 12 decimals,
    go to the earlier position; all-zero weights share equally)."""
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1 or w.size == 0 or not np.all(np.isfinite(w)) or np.any(w < 0):
        raise ValueError(f"weights must be a non-empty 1-D sequence of finite numbers >= 0, got {weights!r}")
    spare = total - minimum * w.size
    if spare < 0:
        raise ValueError(f"total={total} is below minimum={minimum} for each of {w.size} prompts")
    if w.sum() <= 0:
        w = np.ones_like(w)
    quota = spare * w / w.sum()
    counts = np.floor(quota).astype(np.int64)
    left = spare - int(counts.sum())
    # remainders rounded: q (1 - q) of q and 1 - q differ in the last bit, and are a tie
    counts[np.argsort(-np.round(quota - counts, 12), kind="stable")[:left]] += 1
    return counts + minimum


class VarianceParams(RuleParams):
    # Beta(prior, prior) pseudo-counts: a never-seen prompt is predicted p = 1/2, the largest variance
    prior: float = Field(1.0, gt=0)
    # weight of older visits: the counts are multiplied by it at each new visit (0 = the last visit only)
    decay: float = Field(0.5, ge=0, le=1)


@ALLOCATION_RULES.register("variance")
@dataclass
class VarianceAllocation(AllocationRule):
    """Rollouts per prompt proportional to its predicted reward variance (science §4).

    Each step draws B_problem prompts and spends uniform's B_problem * n rollouts on them:
    every prompt gets at least 2 (a group), the rest go in proportion to ``q (1 - q)``, with
    ``q = (s + prior) / (t + 2 prior)`` the Beta posterior mean of the prompt's success rate
    from its previous visits (``s`` successes in ``t`` rollouts, each visit's counts
    multiplied by ``decay`` at the next), rounded by largest remainder. All of a step's
    rollouts are generated in one call and trained on; groups differ in size.
    """

    prior: float = 1.0
    decay: float = 0.5
    name: ClassVar[str] = "variance"
    Params: ClassVar[type[RuleParams]] = VarianceParams
    equal_groups: ClassVar[bool] = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (is_finite_number(self.prior) and self.prior > 0):
            raise ValueError(f"prior must be a number > 0, got {self.prior!r}")
        if not (is_finite_number(self.decay) and 0 <= self.decay <= 1):
            raise ValueError(f"decay must be a number in [0, 1], got {self.decay!r}")
        self.prior, self.decay = float(self.prior), float(self.decay)  # 1 and 1.0 are one run
        # problem -> (decayed successes, decayed rollouts) of its visits so far: the rule's state
        self.stats: dict[int, tuple[float, float]] = {}

    @classmethod
    def for_grid_point(cls, params: VarianceParams, n: int, b_problem: int) -> VarianceAllocation:
        if n <= MIN_GROUP:
            raise RuleNotApplicable(f"n={n} leaves nothing to reallocate (every prompt needs {MIN_GROUP})")
        return cls(b_problem, n, prior=params.prior, decay=params.decay)

    def run_id_parts(self) -> list[str]:
        return [f"a{self.prior:g}", f"dc{self.decay:g}"]

    def scores(self, problems: list[int]) -> np.ndarray:
        """``q (1 - q)`` of each problem, ``q`` its posterior mean success rate."""
        s, t = np.array([self.stats.get(p, (0.0, 0.0)) for p in problems], dtype=np.float64).reshape(-1, 2).T
        q = (s + self.prior) / (t + 2.0 * self.prior)
        return q * (1.0 - q)

    def allocate(self, next_prompts: NextPrompts, sample_fn: SampleFn) -> StepAllocation:
        problems = draw(next_prompts, self.b_problem)
        counts = largest_remainder(self.scores(problems), self.b_problem * self.n, MIN_GROUP)
        # one call, one rollout per entry: each rollout has its own seed, the engine one batch
        flat = sample_groups(sample_fn, [p for p, c in zip(problems, counts) for _ in range(c)], 1)
        ends = np.cumsum(counts)
        groups = [Group(p, [rs[0] for rs in flat[end - c:end]]) for p, c, end in zip(problems, counts, ends)]
        for g in groups:
            r = g.rewards
            if np.any(r < 0) or np.any(r > 1):
                raise ValueError("the variance rule counts successes: rewards must lie in [0, 1]")
            s, t = self.stats.get(g.problem, (0.0, 0.0))
            self.stats[g.problem] = (self.decay * s + float(r.sum()), self.decay * t + float(r.size))
        return StepAllocation(
            groups=groups,
            rollouts_generated=self.b_problem * self.n,
            draws=self.b_problem,
            zero_variance_draws=sum(all_equal(g.rollouts) for g in groups),
        )

    def state_dict(self) -> dict:
        return {"stats": {str(p): list(v) for p, v in self.stats.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.stats = {int(p): (float(s), float(t)) for p, (s, t) in state.get("stats", {}).items()}
