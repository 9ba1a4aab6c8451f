"""Can the planned steps move the policy at this learning rate? For ``rollscale check`` (issue 32).

The issue's SmolLM2 study trained at an effective lr of 3.5e-7 to 7e-7 for a few dozen steps and
its greedy accuracy never moved in any run. The calibration's pilot update
(:mod:`rollscale.pipeline.check.calibration`) measures how far one step at ``lr_base`` moves a completion
token's log-prob; a run of S steps at lr(B) = lr_base sqrt(B / b_base) (science §3) moves it by at
most S x lr(B) x that shift per unit lr (steps that all point the same way). Below
:data:`LOGP_MOVE_MIN` for some run, the check warns before the sweep spends anything.
"""

from __future__ import annotations

import math

from rollscale.config import StudyParams
from rollscale.core.fit import power
from rollscale.core.grpo.shaping import LOGP_MOVE_MIN, sqrt_scaled_lr
from rollscale.pipeline.check.calibration import Calibration

__all__ = ["LOGP_MOVE_MIN", "lr_findings"]



def lr_findings(p: StudyParams, cal: Calibration) -> list[tuple[str, tuple[str, ...], str, str]]:
    """A warning when the run that moves least cannot move a token's log-prob by LOGP_MOVE_MIN."""
    from rollscale.train.sweep import plan_runs

    t = p.sweep.train
    if not (cal.logp_shift_per_lr > 0 and math.isfinite(cal.logp_shift_per_lr)):
        return []
    try:
        shapes = sorted({(pt.n, pt.b_problem) for pt, _ in plan_runs(p.sweep).runs})
    except ValueError:
        return []  # the grid's own finding names it
    moves = {}
    for n, b in shapes:
        steps = power.steps_per_run(p.sweep.c_max, n * b)
        lr = sqrt_scaled_lr(t.lr_base, n * b, t.b_base)
        moves[(n, b)] = (steps, lr, steps * lr * cal.logp_shift_per_lr)
    (n, b), (steps, lr, move) = min(moves.items(), key=lambda kv: kv[1][2])
    if move >= LOGP_MOVE_MIN:
        return []
    need = t.lr_base * LOGP_MOVE_MIN / move
    return [("warning", ("sweep.train.lr_base",),
             f"at lr_base {t.lr_base:g} one update moves a completion token's log-prob by "
             f"{cal.logp_shift_per_lr * t.lr_base:.2g} nats (the calibration's pilot step on this model): the run "
             f"n={n} x B_problem={b} ({steps} steps at lr {lr:.2g}) moves it by at most {move:.2g}, below "
             f"{LOGP_MOVE_MIN}: the policy may not learn in the planned steps",
             f"sweep.train.lr_base: {float(f'{need:.2g}'):g} or more, or a larger sweep.c_max (more steps)")]
