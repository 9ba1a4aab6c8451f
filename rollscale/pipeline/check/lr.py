"""Can the planned steps move the policy at this learning rate? For ``rollscale check`` and ``init``.

The issue-43 SmolLM2 study trained at an effective lr of 3.5e-7 to 7e-7 for 12-25 steps and no run learned; a
one-step bound (every step pointing one way) said it would. The calibration's learning-rate probe
(:mod:`rollscale.pipeline.check.calibration`) runs a few real GRPO steps at ``lr_base`` on the pool's own problems
and measures the per-token KL to the start after each; :func:`rollscale.core.grpo.shaping.kl_after` carries it to
each planned run's steps (its warm-up's at their share of the rate) and lr(B) = lr_base sqrt(B / b_base)
(science §3). Below :data:`KL_MOVED` (a token's
log-prob moved by :data:`LOGP_MOVE_MIN`) for some run, the check warns before the sweep spends anything, and
names the rate that would reach it.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from rollscale.config import StudyParams
from rollscale.core.fit import power
from rollscale.core.grpo.shaping import KL_MOVED, LOGP_MOVE_MIN, kl_after, lr_to_move, round_up, sqrt_scaled_lr
from rollscale.pipeline.check.calibrated import Calibration

__all__ = ["KL_MOVED", "LOGP_MOVE_MIN", "LrFinding", "RunMove", "lr_findings", "slowest_run"]

LrFinding = tuple[str, tuple[str, ...], str, str]
C_MAX_FACTOR_MAX = 32  # the largest budget a fix names: past it the rate, not the steps, is what to change


class RunMove(NamedTuple):
    """A planned run's shape, steps and rate, and the KL to its start the probe expects it to reach."""

    n: int
    b_problem: int
    steps: int
    lr: float
    kl: float


def slowest_run(p: StudyParams, cal: Calibration) -> RunMove | None:
    """The planned run whose policy moves least; None when the probe measured nothing (a tiny model before its
    warm start) or the grid cannot be laid out."""
    from rollscale.sweep.grid import plan_runs

    t = p.sweep.train
    if not cal.probe_kl:
        return None
    try:
        shapes = sorted({(pt.n, pt.b_problem) for pt, _ in plan_runs(p.sweep).runs})
    except ValueError:
        return None  # the grid's own finding names it
    moves = []
    for n, b in shapes:
        steps = power.steps_per_run(p.sweep.c_max, n * b)
        lr = sqrt_scaled_lr(t.lr_base, n * b, t.b_base)
        moves.append(RunMove(n, b, steps, lr, kl_after(cal.probe_kl, cal.probe_lr, lr, steps, t.warmup_steps)))
    if any(math.isnan(m.kl) for m in moves):
        return None
    return min(moves, key=lambda m: m.kl)


def lr_findings(p: StudyParams, cal: Calibration) -> list[LrFinding]:
    """A warning when the run that moves least is expected below KL_MOVED, with the lr_base that reaches it."""
    lr_base = p.sweep.train.lr_base
    if any(math.isinf(kl) for kl in cal.probe_kl):
        return [("warning", ("sweep.train.lr_base",),
                 f"the learning-rate probe's loss was not finite within {len(cal.probe_kl)} GRPO steps at lr "
                 f"{cal.probe_lr:g}: the runs would fail the same way",
                 f"sweep.train.lr_base: {round_up(cal.probe_lr / 10):g} (a tenth; check again)")]
    slow = slowest_run(p, cal)
    if slow is None or slow.kl >= KL_MOVED:
        return []
    n, b, steps, lr, kl = slow
    probe = (f"the learning-rate probe ({len(cal.probe_kl)} GRPO steps at lr {cal.probe_lr:g} on the pool's first "
             f"problems) reached a KL to the start of {max(cal.probe_kl):.2g}")
    if kl <= 0:  # no gradient in the probe's few groups: chance on a weak model's pool, not a rate measured
        return [("note", ("sweep.train.lr_base",),
                 f"{probe}: every group of its {len(cal.probe_kl)} steps scored alike (no gradient), so it measured "
                 f"no rate; whether lr_base {lr_base:g} moves the policy in the planned steps is not known before "
                 "the runs (the report says, from their KL to the start)", "")]
    need = lr_to_move(lr_base, kl)
    return [("warning", ("sweep.train.lr_base",),
             f"{probe}: the run n={n} x B_problem={b} ({steps} steps at lr {lr:.2g}) is expected to reach "
             f"{kl:.2g}, below {KL_MOVED:.2g} (a token's log-prob moved by {LOGP_MOVE_MIN}): the policy may not "
             "learn in the planned steps",
             f"sweep.train.lr_base: {round_up(need):g} (KL grows with lr^2), or {_c_max_to_move(p, cal)}")]


def _c_max_to_move(p: StudyParams, cal: Calibration) -> str:
    """The smallest ``sweep.c_max`` (a few x the study's, up to :data:`C_MAX_FACTOR_MAX`) at which every planned run
    is expected to move the policy at the current rate: more steps, where the rate is kept ("a larger
    sweep.c_max" named none)."""
    for factor in (1.5, 2, 3, 4, 6, 8, 12, 16, 24, C_MAX_FACTOR_MAX):
        c_max = int(round_up(p.sweep.c_max * factor))
        slow = slowest_run(p.model_copy(update={"sweep": p.sweep.model_copy(update={"c_max": c_max})}), cal)
        if slow is not None and slow.kl >= KL_MOVED:
            return f"sweep.c_max: {c_max} ({factor:g} x the steps and the time)"
    return f"no sweep.c_max up to {C_MAX_FACTOR_MAX} x this one reaches it at this rate"

