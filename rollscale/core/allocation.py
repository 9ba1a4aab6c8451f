"""Rollout allocation rules: which rollouts a step generates and trains on
(science §1 compute accounting, §4 the rules).

A rule drives two callbacks, so its compute accounting is exact and testable
without a model:

- ``next_prompts(k)`` draws the next ``k`` problem indices from the run's data order;
- ``sample_fn(problems, n)`` generates ``n`` rollouts for each problem and returns,
  per problem, a list of rollout objects with a float ``.reward``.

Every rollout ``sample_fn`` returns counts in ``C`` (``rollouts_generated``),
whether or not it is trained on.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from rollscale.core.checks import is_int
from rollscale.core.rollouts import Rollout

SampleFn = Callable[[list[int], int], list[list[Rollout]]]
"""(problem indices, rollouts per problem) -> per problem a list of scored rollouts (``.reward`` set)."""

NextPrompts = Callable[[int], list[int]]
"""k -> the next k problem indices of the run's data order."""


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


@dataclass
class Group:
    """One prompt's rollouts to train on, in order; advantages are computed on exactly these."""

    problem: int
    rollouts: list

    @property
    def rewards(self) -> np.ndarray:
        return np.array([float(r.reward) for r in self.rollouts], dtype=np.float64)


@dataclass
class StepAllocation:
    """What one step generated and what it trains on (science §1, §4).

    Attributes:
        groups: the groups to train on.
        rollouts_generated: the step's increment of C: every generated rollout.
        draws: prompts drawn from the data order this step.
        pilot_rollouts: rollouts generated in the pilot phase (Pilot-Commit).
        discarded_rollouts: generated rollouts not trained on.
        zero_variance_draws: drawn prompts whose generated rewards (before any
            filtering; the pilot rewards for Pilot-Commit) were all equal.
    """

    groups: list[Group]
    rollouts_generated: int
    draws: int
    pilot_rollouts: int = 0
    discarded_rollouts: int = 0
    zero_variance_draws: int = 0

    @property
    def rollouts_trained(self) -> int:
        return sum(len(g.rollouts) for g in self.groups)


def _check_int(value: Any, name: str, minimum: int) -> int:
    if not is_int(value) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return int(value)


def _draw(next_prompts: NextPrompts, k: int) -> list[int]:
    problems = list(next_prompts(k))
    if len(problems) != k:
        raise ValueError(f"next_prompts({k}) returned {len(problems)} problems, expected {k}")
    return [int(p) for p in problems]


def _sample(sample_fn: SampleFn, problems: list[int], n: int) -> list[list[Any]]:
    out = sample_fn(list(problems), n)
    if len(out) != len(problems):
        raise ValueError(f"sample_fn returned {len(out)} groups for {len(problems)} problems")
    groups = []
    for p, rollouts in zip(problems, out):
        rollouts = list(rollouts)
        if len(rollouts) != n:
            raise ValueError(f"sample_fn returned {len(rollouts)} rollouts for problem {p}, expected {n}")
        for r in rollouts:
            if not math.isfinite(float(r.reward)):
                raise ValueError(f"sample_fn returned a non-finite reward for problem {p}")
        groups.append(rollouts)
    return groups


def _all_equal(rollouts: Sequence[Any]) -> bool:
    first = float(rollouts[0].reward)
    return all(float(r.reward) == first for r in rollouts)


@dataclass
class AllocationRule(ABC):
    """A rollout allocation rule (science §4): B_problem prompts per step, n rollouts each nominally."""

    b_problem: int
    n: int
    name: ClassVar[str]

    def __post_init__(self) -> None:
        _check_int(self.b_problem, "b_problem", 1)
        _check_int(self.n, "n", 2)

    @property
    def rollouts_per_step_nominal(self) -> int:
        """Rollouts generated by a step when nothing is filtered (the C increment of a typical step)."""
        return self.b_problem * self.n

    @property
    def trained_group_size(self) -> int:
        """Rollouts per trained group."""
        return self.n

    @abstractmethod
    def allocate(self, next_prompts: NextPrompts, sample_fn: SampleFn) -> StepAllocation:
        """Generate one step's rollouts and choose the groups to train on."""


@dataclass
class Uniform(AllocationRule):
    """Plain GRPO: n rollouts for each of B_problem prompts (science §4)."""

    name: ClassVar[str] = "uniform"

    def allocate(self, next_prompts: NextPrompts, sample_fn: SampleFn) -> StepAllocation:
        problems = _draw(next_prompts, self.b_problem)
        rollouts = _sample(sample_fn, problems, self.n)
        groups = [Group(p, rs) for p, rs in zip(problems, rollouts)]
        return StepAllocation(
            groups=groups,
            rollouts_generated=self.b_problem * self.n,
            draws=self.b_problem,
            zero_variance_draws=sum(_all_equal(rs) for rs in rollouts),
        )


@dataclass
class DynamicSampling(AllocationRule):
    """DAPO dynamic sampling (science §4).

    Draw prompts and generate n rollouts each; drop groups whose rewards are all
    equal; keep drawing until B_problem groups with nonzero variance are
    collected or ``max_draws`` prompts have been drawn this step. The first
    round draws B_problem prompts, each later round exactly the number of
    groups still missing (capped by ``max_draws``), so no surplus group is ever
    generated. If the cap is hit the step trains on the groups collected, which
    may be fewer than B_problem or none (the trainer then skips the update; C
    still grows). Every generated rollout counts in C.
    """

    max_draws: int
    name: ClassVar[str] = "dynamic"

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_int(self.max_draws, "max_draws", self.b_problem)

    def allocate(self, next_prompts: NextPrompts, sample_fn: SampleFn) -> StepAllocation:
        groups: list[Group] = []
        draws = 0
        zero_var = 0
        while len(groups) < self.b_problem and draws < self.max_draws:
            k = min(self.b_problem - len(groups), self.max_draws - draws)
            problems = _draw(next_prompts, k)
            draws += k
            for p, rs in zip(problems, _sample(sample_fn, problems, self.n)):
                if _all_equal(rs):
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


@dataclass
class PODS(AllocationRule):
    """PODS: generate n rollouts per prompt, train on the max-variance subset of size m (science §4).

    ``m >= 2``: a group of one rollout has zero advantage and would train on nothing.
    """

    m: int
    name: ClassVar[str] = "pods"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not is_int(self.m) or not 2 <= self.m < self.n:
            raise ValueError(f"m must be an int with 2 <= m < n={self.n}, got {self.m!r}")

    @property
    def trained_group_size(self) -> int:
        return self.m

    def allocate(self, next_prompts: NextPrompts, sample_fn: SampleFn) -> StepAllocation:
        problems = _draw(next_prompts, self.b_problem)
        groups = []
        zero_var = 0
        for p, rs in zip(problems, _sample(sample_fn, problems, self.n)):
            zero_var += _all_equal(rs)
            keep = max_variance_subset([float(r.reward) for r in rs], self.m)
            groups.append(Group(p, [rs[i] for i in keep]))
        return StepAllocation(
            groups=groups,
            rollouts_generated=self.b_problem * self.n,
            draws=self.b_problem,
            discarded_rollouts=self.b_problem * (self.n - self.m),
            zero_variance_draws=zero_var,
        )


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
    pool_factor: float
    name: ClassVar[str] = "pilot"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not is_int(self.n_pilot) or not 1 <= self.n_pilot < self.n:
            raise ValueError(f"n_pilot must be an int with 1 <= n_pilot < n={self.n}, got {self.n_pilot!r}")
        pf = self.pool_factor
        if isinstance(pf, bool) or not isinstance(pf, (int, float)) or not (math.isfinite(pf) and pf >= 1):
            raise ValueError(f"pool_factor must be a number >= 1, got {self.pool_factor!r}")

    @property
    def pool_size(self) -> int:
        # round first so that e.g. 1.1 * 10 is 11, not 12 from float error
        return int(math.ceil(round(self.pool_factor * self.b_problem, 9)))

    @property
    def rollouts_per_step_nominal(self) -> int:
        return self.pool_size * self.n_pilot + self.b_problem * (self.n - self.n_pilot)

    def allocate(self, next_prompts: NextPrompts, sample_fn: SampleFn) -> StepAllocation:
        pool = _draw(next_prompts, self.pool_size)
        pilots = _sample(sample_fn, pool, self.n_pilot)
        constant = np.array([_all_equal(rs) for rs in pilots])
        pilot_rewards = np.array([[float(r.reward) for r in rs] for rs in pilots])
        if np.any(pilot_rewards < 0) or np.any(pilot_rewards > 1):
            raise ValueError("Pilot-Commit scores need rewards in [0, 1] (successes of a Beta(1,1) posterior)")
        successes = pilot_rewards.sum(axis=1)
        scores = pilot_scores(successes, self.n_pilot)
        # Informative prompts first, then by score, ties by pool order (stable sort).
        order = np.lexsort((np.arange(len(pool)), -scores, constant))
        chosen = sorted(int(i) for i in order[: self.b_problem])
        extra = _sample(sample_fn, [pool[i] for i in chosen], self.n - self.n_pilot)
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


def allocate(rule: AllocationRule, next_prompts: NextPrompts, sample_fn: SampleFn) -> StepAllocation:
    """Run one step of ``rule`` (science §4); see :class:`StepAllocation` for the accounting."""
    if not isinstance(rule, AllocationRule):
        raise ValueError(f"rule must be an AllocationRule, got {type(rule).__name__}")
    return rule.allocate(next_prompts, sample_fn)
