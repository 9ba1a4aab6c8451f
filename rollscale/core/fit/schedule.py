"""The evaluation schedule every run shares (science §9.1): the budgets a run is evaluated at, and at which
steps an evaluation is due. One rule for the trainer (:class:`rollscale.train.trainer.GRPOTrainer` asks
:func:`eval_due` step by step) and for what ``rollscale check`` counts of a run (:func:`evaluation_steps`)."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from rollscale.core.fit.power import positive_int, steps_per_run

__all__ = ["EVAL_DOUBLINGS", "budget_schedule", "eval_due", "evaluation_steps"]

# the shared schedule's first budget is c_max / 2^EVAL_DOUBLINGS (625 of the default's 40,000 rollouts): the
# search's first rung (c_max / 16) and every rung after it (eta = 2) are budgets of the schedule
EVAL_DOUBLINGS = 6


def budget_schedule(c_max: int, per_doubling: int) -> np.ndarray:
    """The budgets every run is evaluated at (science §9.1): ``c_j = c_first * 2^(j / k)`` for
    ``k = per_doubling``, ``c_first = c_max / 2^EVAL_DOUBLINGS``, up to ``c_max``."""
    c_max, k = positive_int("c_max", c_max), positive_int("per_doubling", per_doubling)
    j = np.arange(EVAL_DOUBLINGS * k + 1)
    return c_max * np.exp2((j - EVAL_DOUBLINGS * k) / k)


def eval_due(step: ArrayLike, c_before: ArrayLike, c_after: ArrayLike, eval_every: int,
             schedule: np.ndarray | None) -> bool | np.ndarray:
    """Whether a run evaluates after ``step`` (from cumulative C ``c_before`` to ``c_after``): at the first step
    whose C reaches each budget of ``schedule`` (science §9.1), or with no schedule every ``eval_every`` steps.
    Arrays of steps give an array (:func:`evaluation_steps`); the trainer asks one step at a time."""
    if schedule is None:
        due = np.asarray(step) % eval_every == 0
    else:  # a budget in (c_before, c_after]
        budgets = np.sort(np.asarray(schedule, float))
        due = np.searchsorted(budgets, c_after, "right") > np.searchsorted(budgets, c_before, "right")
    return bool(due) if np.ndim(due) == 0 else np.asarray(due)


def evaluation_steps(c_max: int, rollouts_per_step: int, per_doubling: int, eval_every: int = 1) -> list[int]:
    """The steps a run of ``rollouts_per_step`` rollouts a step evaluates at, as the trainer decides them
    (:func:`eval_due`, one function for both): step 0, every step due on the shared budget schedule of
    ``per_doubling`` budgets per doubling (science §9.1; where B exceeds a spacing, every step), or every
    ``eval_every`` steps when ``per_doubling`` is 0, and its last step."""
    last = steps_per_run(c_max, rollouts_per_step)
    schedule = budget_schedule(c_max, per_doubling) if per_doubling else None
    steps = np.arange(1, last + 1)
    due = eval_due(steps, (steps - 1) * rollouts_per_step, steps * rollouts_per_step,
                   positive_int("eval_every", eval_every), schedule)
    return sorted({0, last, *steps[due].tolist()})
