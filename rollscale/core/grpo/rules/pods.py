"""PODS: generate n rollouts per prompt, train on a max-variance subset of m (Xu et al. 2025; science §4)."""

from __future__ import annotations

from collections.abc import Sequence
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
from rollscale.core.checks import is_int
from rollscale.registry import ALLOCATION_RULES


def max_variance_subset(rewards: Sequence[float], m: int) -> list[int]:
    """PODS max-variance down-sampling (Xu et al. 2025; science §4).

    Indices of the ``m`` rollouts whose rewards have the largest variance. The
    optimum is the ``k`` highest plus the ``m - k`` lowest rewards for some
    ``k``: sort once (stable, so ties break by position) and scan ``k = 0..m``
    with prefix sums of ``r`` and ``r^2``, O(n log n). With binary rewards this
    keeps as even a split of 1s and 0s as the group allows. Among equally good
    ``k`` the smallest wins, so the result is deterministic.

    Returns:
        the kept indices in increasing order.
    """
    r = np.asarray(rewards, dtype=np.float64)
    if r.ndim != 1 or r.size == 0:
        raise ValueError(f"rewards must be a non-empty 1-D sequence, got shape {r.shape}")
    if not np.all(np.isfinite(r)):
        raise ValueError("rewards must be finite")
    n = r.size
    if not is_int(m) or not 1 <= m <= n:
        raise ValueError(f"m must be an int with 1 <= m <= n={n}, got {m!r}")
    order = np.argsort(r, kind="stable")
    # Centre first: variance is shift-invariant and the prefix sums lose less precision.
    s = r[order] - r.mean()
    csum = np.concatenate([[0.0], np.cumsum(s)])
    csq = np.concatenate([[0.0], np.cumsum(s * s)])
    k = np.arange(m + 1)
    low = m - k  # the m - k lowest are order[:m-k], the k highest order[n-k:]
    total = csum[low] + (csum[n] - csum[n - k])
    total_sq = csq[low] + (csq[n] - csq[n - k])
    spread = total_sq - total * total / m  # m * (population variance of the kept set)
    best = int(np.argmax(spread))
    kept = np.concatenate([order[: m - best], order[n - best :]])
    return sorted(int(i) for i in kept)


class PODSParams(RuleParams):
    # PODS trains on m = max(2, round(keep * n)) of each group's n rollouts
    keep: float = Field(0.5, gt=0, lt=1)


@ALLOCATION_RULES.register("pods")
@dataclass
class PODS(AllocationRule):
    """PODS: generate n rollouts per prompt, train on the max-variance subset of size m (science §4).

    ``m >= 2``: a group of one rollout has zero advantage and would train on nothing.
    """

    m: int
    name: ClassVar[str] = "pods"
    Params: ClassVar[type[RuleParams]] = PODSParams

    def __post_init__(self) -> None:
        super().__post_init__()
        if not is_int(self.m) or not 2 <= self.m < self.n:
            raise ValueError(f"m must be an int with 2 <= m < n={self.n}, got {self.m!r}")

    @classmethod
    def for_grid_point(cls, params: PODSParams, n: int, b_problem: int) -> PODS:
        m = max(2, round(params.keep * n))
        if m >= n:
            raise RuleNotApplicable(f"keeps m={m}, not fewer than n={n}")
        return cls(b_problem, n, m=m)

    def run_id_parts(self) -> list[str]:
        return [f"m{self.m}"]

    @property
    def trained_group_size(self) -> int:
        return self.m

    def allocate(self, next_prompts: NextPrompts, sample_fn: SampleFn) -> StepAllocation:
        problems = draw(next_prompts, self.b_problem)
        groups = []
        zero_var = 0
        for p, rs in zip(problems, sample_groups(sample_fn, problems, self.n)):
            zero_var += all_equal(rs)
            keep = max_variance_subset([float(r.reward) for r in rs], self.m)
            groups.append(Group(p, [rs[i] for i in keep]))
        return StepAllocation(
            groups=groups,
            rollouts_generated=self.b_problem * self.n,
            draws=self.b_problem,
            discarded_rollouts=self.b_problem * (self.n - self.m),
            zero_variance_draws=zero_var,
        )
