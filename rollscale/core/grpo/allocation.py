"""What every rollout allocation rule shares: which rollouts a step generates and trains on
(science §1 compute accounting, §4 the rules). The rules themselves are the modules of
:mod:`rollscale.core.grpo.rules`, one each, found through :data:`rollscale.registry.ALLOCATION_RULES`.

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
from dataclasses import MISSING, dataclass, fields
from typing import Any, ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict

from rollscale.core.checks import is_int
from rollscale.core.rollouts import Rollout
from rollscale.registry import ALLOCATION_RULES, closest_hint

SampleFn = Callable[[list[int], int], list[list[Rollout]]]
"""(problem indices, rollouts per problem) -> per problem a list of scored rollouts (``.reward`` set)."""

NextPrompts = Callable[[int], list[int]]
"""k -> the next k problem indices of the run's data order."""


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


def check_int(value: Any, name: str, minimum: int) -> int:
    """``value`` as an int when it is one and ``>= minimum``, else a ValueError naming it."""
    if not is_int(value) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return int(value)


def draw(next_prompts: NextPrompts, k: int) -> list[int]:
    """The next ``k`` problem indices of the data order, checked."""
    problems = list(next_prompts(k))
    if len(problems) != k:
        raise ValueError(f"next_prompts({k}) returned {len(problems)} problems, expected {k}")
    return [int(p) for p in problems]


def sample_groups(sample_fn: SampleFn, problems: list[int], n: int) -> list[list[Any]]:
    """``n`` rollouts for each problem, checked: one group per problem, finite rewards."""
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


def all_equal(rollouts: Sequence[Any]) -> bool:
    """Do the rollouts' rewards all equal the first's (a zero-variance group)?"""
    first = float(rollouts[0].reward)
    return all(float(r.reward) == first for r in rollouts)


class RuleParams(BaseModel):
    """A rule's hyperparameters as ``sweep.rules`` writes them (``{rule: pods, keep: 0.5}``).

    Each rule subclasses it as its ``Params``; the ``rule`` key that tells the rules apart is
    added from the rule's name (``SweepParams.rules``), so a rule declares only its own fields.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)


class RuleNotApplicable(ValueError):
    """A rule that cannot run at a grid point (e.g. PODS keeping m >= n); the sweep skips it."""


@dataclass
class AllocationRule(ABC):
    """A rollout allocation rule (science §4): B_problem prompts per step, n rollouts each nominally.

    A rule is one module of :mod:`rollscale.core.grpo.rules`, registered with
    ``@ALLOCATION_RULES.register(name)`` (:mod:`rollscale.registry`). Its dataclass fields after
    ``b_problem`` and ``n`` are the run's arguments (``RunConfig.rule_args``); ``Params`` holds
    the sweep's hyperparameters and :meth:`for_grid_point` turns them into a rule at one (n, B_problem).
    """

    b_problem: int
    n: int
    name: ClassVar[str]
    Params: ClassVar[type[RuleParams]] = RuleParams
    # False for rules that train groups of different sizes (the noise measurement needs equal ones)
    equal_groups: ClassVar[bool] = True

    def __post_init__(self) -> None:
        check_int(self.b_problem, "b_problem", 1)
        check_int(self.n, "n", 2)

    @classmethod
    def for_grid_point(cls, params: RuleParams, n: int, b_problem: int) -> "AllocationRule":
        """The rule at a sweep grid point, from the sweep's ``params``; raises
        :class:`RuleNotApplicable` where the rule cannot run (the sweep skips that point)."""
        return cls(b_problem, n, **params.model_dump(exclude={"rule"}))

    def run_args(self) -> dict[str, Any]:
        """The run's arguments beyond ``b_problem`` and ``n`` (``RunConfig.rule_args``)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("b_problem", "n")}

    def run_id_parts(self) -> list[str]:
        """What the run id says of this rule after its name (e.g. ``["m4"]``); none by default."""
        return []

    @property
    def rollouts_per_step_nominal(self) -> int:
        """Rollouts generated by a step when nothing is filtered (the C increment of a typical step)."""
        return self.b_problem * self.n

    @property
    def trained_group_size(self) -> int:
        """Rollouts per trained group (the mean, for rules whose groups differ in size)."""
        return self.n

    @property
    def trained_per_step(self) -> int:
        """Rollouts a step trains on: the B of the learning-rate scaling (science §1, §3)."""
        return self.b_problem * self.trained_group_size

    def state_dict(self) -> dict:
        """What the rule carries from step to step (JSON-safe), saved in checkpoints; none by default."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` on resume."""
        if state:
            raise ValueError(f"rule {self.name!r} keeps no state, got {sorted(state)}")

    @abstractmethod
    def allocate(self, next_prompts: NextPrompts, sample_fn: SampleFn) -> StepAllocation:
        """Generate one step's rollouts and choose the groups to train on."""


def allocate(rule: AllocationRule, next_prompts: NextPrompts, sample_fn: SampleFn) -> StepAllocation:
    """Run one step of ``rule`` (science §4); see :class:`StepAllocation` for the accounting."""
    if not isinstance(rule, AllocationRule):
        raise ValueError(f"rule must be an AllocationRule, got {type(rule).__name__}")
    return rule.allocate(next_prompts, sample_fn)


def rule_class(name: str) -> type[AllocationRule]:
    """The registered rule called ``name`` (an unknown name is an error naming the closest)."""
    return ALLOCATION_RULES.get(name)


def make_rule(name: str, b_problem: int, n: int, args: dict[str, Any] | None = None) -> AllocationRule:
    """The rule ``name`` with the run's arguments; an unknown argument is an error naming the valid ones."""
    cls = rule_class(name)
    args = dict(args or {})
    own = [f for f in fields(cls) if f.name not in ("b_problem", "n")]
    valid = [f.name for f in own]
    unknown = sorted(set(args) - set(valid))
    if unknown:
        raise ValueError(f"rule {name!r} takes no argument {unknown[0]!r}{closest_hint(unknown[0], valid)} "
                         f"(its arguments: {', '.join(valid) or 'none'})")
    missing = [f.name for f in own if f.name not in args and f.default is MISSING and f.default_factory is MISSING]
    if missing:
        raise ValueError(f"rule {name!r} needs the argument {missing[0]!r} (its arguments: {', '.join(valid)})")
    return cls(b_problem, n, **args)
