"""What ``rollscale check`` counts of a sweep run's evaluations: the trainer's own rule, not a copy.

A run evaluates at step 0, at the steps :func:`rollscale.core.fit.schedule.eval_due` says (the shared budget
schedule of science §9.1, ``sweep.eval_per_doubling``; or every ``sweep.eval_every`` steps when that is 0) and
at its last step: :func:`run_evaluation_steps` asks the same function the trainer does, so the grid's
evaluation count and their cost in the sweep's time follow the
schedule the runs will use. The fixes name the setting that schedule reads.
"""

from __future__ import annotations

from collections.abc import Callable

from rollscale.config import StudyParams
from rollscale.core.fit import power, schedule

__all__ = ["cadence_key", "evaluations_fix", "run_evaluation_steps"]


def run_evaluation_steps(p: StudyParams, rollouts_per_step: int) -> list[int]:
    """The steps a sweep run of ``rollouts_per_step`` rollouts a step evaluates at: the trainer's own rule
    (:func:`rollscale.core.fit.schedule.eval_due`; the shared budget schedule of science §9.1, or every
    ``sweep.eval_every`` steps when ``sweep.eval_per_doubling`` is 0)."""
    return schedule.evaluation_steps(p.sweep.c_max, rollouts_per_step, p.sweep.eval_per_doubling, p.sweep.eval_every)


def cadence_key(p: StudyParams) -> str:
    """The params key the runs' evaluations follow."""
    return "sweep.eval_per_doubling" if p.sweep.eval_per_doubling else "sweep.eval_every"


def evaluations_fix(p: StudyParams, batches: list[int]) -> str:
    """The change that gives every run power.EVALS_COMFORTABLE evaluations: a denser cadence, else a larger c_max."""
    enough = power.EVALS_COMFORTABLE
    widest = max(batches)
    steps_min = power.steps_per_run(p.sweep.c_max, widest)
    if steps_min < enough - 1:  # fewer steps than evaluations wanted: only more budget helps
        steps = enough - 1 if p.sweep.eval_per_doubling else p.sweep.eval_every * (enough - 1)  # the schedule: every step
        return f"sweep.c_max: {widest * steps} or more (the widest batch B = {widest} runs only {steps_min} steps)"
    if p.sweep.eval_per_doubling:
        k = _denser(p, lambda q: all(len(run_evaluation_steps(q, b)) >= enough for b in batches))
        return f"sweep.eval_per_doubling: {k} (or more)" if k else f"sweep.c_max: {widest * (enough - 1)} or more"
    every = max(1, steps_min // (enough - 1))
    c_needed = widest * p.sweep.eval_every * (enough - 1)
    return f"sweep.eval_every: {every} (or less)" + (f", or sweep.c_max: {c_needed}" if c_needed > p.sweep.c_max else "")


def _denser(p: StudyParams, enough: Callable[[StudyParams], bool]) -> int | None:
    """The smallest ``sweep.eval_per_doubling`` above the current one (up to 4x + 8) for which ``enough`` holds."""
    for k in range(p.sweep.eval_per_doubling + 1, 4 * p.sweep.eval_per_doubling + 9):
        if enough(p.model_copy(update={"sweep": p.sweep.model_copy(update={"eval_per_doubling": k})})):
            return k
    return None
