"""Can the study answer at its tolerance in the time it has? One verdict for `rollscale init` and `rollscale check`.

The decision between two keys (science §9.3, §9.4) reads their difference D over the validation set: its 95 %
half-width (:func:`rollscale.pipeline.check.budget.decision_half_width`: validation size, ``eval_k``, seeds) is the
smallest tolerance the study resolves. Where a key must be worse than the leader by more than
:data:`rollscale.pipeline.check.timing.SETTLE_GAP_MAX` to be settled, no key of a real study is, and the study
cannot answer: the verdict says so in one line, with what the tolerance would need, here (the measured calibration,
:mod:`rollscale.pipeline.check.timing`) and on an H100 (scaled by docs/gpu.md's measured throughput).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from rollscale.config import StudyParams
from rollscale.core.problems.buckets import EASY_SHARE
from rollscale.pipeline.check.budget import decision_half_width, decision_seeds
from rollscale.pipeline.check.calibrated import Calibration
from rollscale.pipeline.check.resolution import eval_k_max
from rollscale.pipeline.check.timing import SETTLE_GAP_MAX, stage_times

__all__ = ["Verdict", "answer_verdict", "cannot_answer", "h100_seconds", "table_rows"]

# one H100, HF generate at 256 rollouts a call: 3,172-3,214 tokens a second for Qwen3-0.6B and 1.7B alike (its
# per-step overhead dominates); an update at 38-44 model TFLOP/s for 0.6B (7.26 s for 67,608 tokens: no smaller
# model trains a token faster there), 127 for 1.7B (docs/gpu.md, "Measured on an H100")
H100_GEN_TOKENS_PER_S = 3200.0
H100_TRAIN_S_PER_TOKEN_MIN = 7.26 / 67_608
H100_TRAIN_FLOPS = 44e12


@dataclass(frozen=True)
class Verdict:
    """The tolerance the study resolves (the half-width of D), whether it can settle a key, and the one line
    that says why not (with the hours the tolerance needs), "" where it can."""

    resolves: float
    settles: bool
    line: str


def h100_seconds(cpu_s: float, cal: Calibration, n_params: int | None) -> float:
    """``cpu_s`` of this machine's calibrated work on one H100: scaled by the slower of generation's and training's
    speed-up (docs/gpu.md's measured throughput against ``cal``'s), so an estimate that errs long."""
    gen = cal.gen_s_per_token * H100_GEN_TOKENS_PER_S  # this machine's seconds a rollout-token, over the H100's
    train_h100 = max(H100_TRAIN_S_PER_TOKEN_MIN, 8 * (n_params or 0) / H100_TRAIN_FLOPS)
    train = cal.train_s_per_token / train_h100 if cal.train_s_per_token > 0 else gen
    speedup = max(min(gen, train), 1.0)
    return cpu_s / speedup


def _clock(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 5400 else f"{max(1, math.ceil(seconds / 60))} min"


def table_rows(p: StudyParams) -> int | None:
    """The rows of the study's local tables (counted, not read), None for other sources or a table not counted."""
    from rollscale.core.problems.data_sample import count_rows

    if p.data.source != "table" or any(t.path is None for t in p.data.tables):
        return None
    counts = [count_rows(t.path) for t in p.data.tables]
    return None if any(c is None for c in counts) else sum(counts)


def answer_verdict(p: StudyParams, cal: Calibration | None, hours: float | None = None,
                   n_params: int | None = None, machine: str = "this machine") -> Verdict | None:
    """Whether ``p`` can settle a key at ``study.tolerance``; None where it has no interval (no validation split,
    one seed: other findings say so). ``cal``: this machine's calibration (None: the line names no hours);
    ``hours``: the time asked (``init --hours``), else the study's own estimate; ``n_params``: the model's, for
    the H100 estimate."""
    val, tol = p.bucket.val_size, p.study.tolerance
    seeds, _ = decision_seeds(p)
    resolution = decision_half_width(p, val, seeds)
    if resolution is None:
        return None
    half = resolution[0]
    settles = 2 * half - tol <= SETTLE_GAP_MAX
    if settles:
        return Verdict(half, True, "")
    # the study as written with a validation split that resolves the tolerance: eval_k up to the profile's k,
    # then as many problems as make half <= tolerance, in a bucket at the expected share of the table
    k = eval_k_max(p)
    need_val = math.ceil(val * p.sweep.eval_k / k * (half / tol) ** 2 - 1e-9)
    b = max(p.sweep.b_problem)
    share = p.bucket.expected_share or EASY_SHARE
    pool = table_rows(p)
    need_pool = math.ceil((need_val + 2 * b) / share)
    if cal is not None:
        asked = hours * 3600 if hours is not None else stage_times(p, cal, p.data.limit or pool).total
        where = f"in {hours:g} h" if hours is not None else f"in the {_clock(asked)} it takes"
    else:
        where = "as written"
    head = (f"{where} on {machine} no study resolves {tol:g}: the one it fits resolves {half:.2f} (a key must be "
            f"{2 * half - tol:.2f} worse than the leader to be settled)")
    # a share nothing has measured (no pilot, or one too small to bound it) is the default study's: said, since
    # it sets the problems and hours named (SmolLM2 on word problems: 1,525 problems, 10.7 h at the assumed 20 %;
    # 14,715 at the 2 % a 32-problem pilot then bounded)
    assumed = "" if p.bucket.expected_share else f", if {share:.0%} fall in {p.sweep.bucket} as in the default study"
    bigger = f"bucket.val_size {need_val}, sweep.eval_k {k}, {need_pool:,} problems{assumed}" + (
        f" (the table has {pool:,})" if pool is not None and need_pool > pool else "")
    if cal is None:
        return Verdict(half, False, f"{head}; {tol:g} needs {bigger}")
    resolving = p.model_copy(update={"bucket": p.bucket.model_copy(update={"val_size": need_val}),
                                     "sweep": p.sweep.model_copy(update={"eval_k": k}),
                                     "data": p.data.model_copy(update={"limit": need_pool})})
    needs = stage_times(resolving, cal, need_pool).total
    gpu = h100_seconds(needs, cal, n_params)
    return Verdict(half, False, f"{head}; {tol:g} needs {bigger}: about {_clock(needs)} here, or about "
                                f"{_clock(gpu)} on an H100 (scaled by docs/gpu.md's measured throughput)")


def cannot_answer(p: StudyParams, artifacts: str | Path | None) -> str | None:
    """The line ``p`` cannot answer on (:func:`answer_verdict` with the study's stored calibration, as `rollscale
    check` gives it: the verdict `rollscale init` refuses a study on, which ``init --force`` writes anyway), None
    where it can settle a key at its tolerance or has no interval to read: the report's first reason."""
    from rollscale.pipeline.check.calibrated import stored_calibration

    verdict = answer_verdict(p, stored_calibration(p, artifacts))
    return verdict.line if verdict is not None and not verdict.settles else None
