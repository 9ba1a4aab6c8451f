"""What the validation split resolves, and fixes a user can apply as printed, for ``rollscale check``.

The validation noise (science §5: the standard error of avg@k over the fixed validation problems) against
:data:`DETECTABLE_WARN`, and its fix: a validation size the bucket holds (its training problems keep one
batch), an ``eval_k`` no larger than the profile's ``k`` (the profile placed each problem in its bucket from
that many samples, and an evaluation of more samples a problem costs more than profiling it). Where no
setting resolves the target, one line says so and what would. A bucket too small for its split gets bounds
that hold it, from the profile's pass rates (:func:`rollscale.core.problems.buckets.bounds_holding`).
Findings as (level, keys, message, fix) tuples that :mod:`rollscale.pipeline.check.findings` wraps.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import pandas as pd

from rollscale.config import StudyParams
from rollscale.core.fit import power
from rollscale.core.problems.buckets import EASY_SHARE, bounds_holding

__all__ = ["DETECTABLE_WARN", "bucket_bounds_fix", "eval_k_max", "noise_findings_of_split", "precision_fix"]

DETECTABLE_WARN = 0.10  # the default study's n values differ by 0.016-0.05 of avg@4 at 40k rollouts

Finding = tuple[str, tuple[str, ...], str, str]


def eval_k_max(p: StudyParams) -> int:
    """The largest ``sweep.eval_k`` a fix proposes: the profile's ``k`` (or the current eval_k when larger)."""
    return max(p.sweep.eval_k, p.profile.k)


def noise_findings_of_split(p: StudyParams, size: tuple[int, int] | None, val_ids: list[str] | None,
                            profile: pd.DataFrame | None, pool: tuple[int | None, bool]) -> Iterator[Finding]:
    """The validation noise of the sweep bucket: ``size`` its (train, validation) problems once the profile
    is laid out, ``val_ids`` its validation problems (their profiled pass rates give the variance), ``pool``
    (size, exact) before the profile."""
    val = size[1] if size else p.bucket.val_size
    if val == 0:
        return
    bounds = p.bucket.bounds
    if val_ids is not None and profile is not None:
        prof = profile[profile["problem_id"].isin(set(val_ids))]
        var, basis = power.pass_variance(prof["avg_at_k"], int(prof["k"].max())), "the profiled validation problems"
    elif p.sweep.bucket in bounds:
        var, basis = power.interval_pass_variance(*bounds[p.sweep.bucket]), f"the worst case in {p.sweep.bucket}'s bounds"
    else:
        var, basis = 0.25, "the worst case p = 0.5"
    se = power.avg_at_k_se(val, p.sweep.eval_k, var)
    d = power.detectable_difference(se)
    msg = (f"validation avg@{p.sweep.eval_k} over {val} problems has a standard error of {se:.3f} (pass-rate "
           f"variance from {basis}): differences below {d:.3f} are not detectable")
    keys = ("bucket.val_size", "sweep.eval_k")
    if d > DETECTABLE_WARN:
        yield ("warning", keys, msg, precision_fix(p, val, d, size, pool, profile))
    else:
        yield ("note", keys, msg, "")


def _val_room(p: StudyParams, size: tuple[int, int] | None, pool: tuple[int | None, bool]) -> tuple[int | None, str]:
    """(the most validation problems, where that bound comes from): the bucket's problems (after the profile) or,
    before it, the share of the pool it is expected to hold (``bucket.expected_share``, init's pilot's, else
    :data:`EASY_SHARE`; `bucket.val_size: 193` was proposed from a pool of 246 whose bucket then held
    45), less one batch of ``b_problem`` kept to train; None when neither is known."""
    b = max(p.sweep.b_problem)
    if size is not None:
        return size[0] + size[1] - b, f"{p.sweep.bucket!r} holds {size[0] + size[1]} problems"
    if pool[0] is not None:
        share = p.bucket.expected_share or EASY_SHARE
        basis = "bucket.expected_share" if p.bucket.expected_share else "as the default study"
        expected = math.floor(pool[0] * share)
        return max(expected - b, 0), (f"before the profile, {p.sweep.bucket!r} is expected to hold about {expected} "
                                      f"of the pool's {'' if pool[1] else 'at most '}{pool[0]} ({share:.0%}, {basis})")
    return None, ""


def precision_fix(p: StudyParams, val: int, d: float, size: tuple[int, int] | None,
                  pool: tuple[int | None, bool], profile: pd.DataFrame | None = None) -> str:
    """The validation size or samples that resolve DETECTABLE_WARN / 2, each as far as the bucket and the profile's
    k allow (`bucket.val_size: 193` was proposed for a bucket of 60 problems, and `sweep.eval_k:
    193`). The standard error depends on val_size x eval_k (power.avg_at_k_se); where no applicable value resolves
    the target, the fix says so, what the most resolves, and how many problems the bucket would need."""
    target = DETECTABLE_WARN / 2
    k, k_max, b = p.sweep.eval_k, eval_k_max(p), max(p.sweep.b_problem)
    samples = math.ceil(val * k * (d / target) ** 2 - 1e-9)  # validation samples (val_size x eval_k) needed
    cap, where = _val_room(p, size, pool)
    options = []
    if math.ceil(samples / val) <= k_max:
        options.append(f"sweep.eval_k: {math.ceil(samples / val)}")
    if cap is None or math.ceil(samples / k) <= cap:
        options.append(f"bucket.val_size: {math.ceil(samples / k)}")
    elif cap > val and math.ceil(samples / cap) <= k_max:
        options.append(f"bucket.val_size: {cap} (the most: {where}, {b} of them train per step) with "
                       f"sweep.eval_k: {math.ceil(samples / cap)}")
    if options:
        return ", or ".join(options) + f", resolves {target:.2f}"
    most = max(val, cap)
    best = d * math.sqrt(val * k / (most * k_max))
    need = math.ceil(samples / k_max) + b
    return (f"no setting resolves {target:.2f} here ({where}, {b} train per step; sweep.eval_k up to the profile's "
            f"k = {k_max}): the most, bucket.val_size: {most} with sweep.eval_k: {k_max}, resolves {best:.2f}; "
            f"{target:.2f} needs {need} problems in {p.sweep.bucket!r}: {_wider(p, profile, need, k_max)}")


def _wider(p: StudyParams, profile: pd.DataFrame | None, need: int, k_max: int) -> str:
    """Bounds of the sweep's bucket that hold ``need`` profiled problems, or: profile more ("widen its
    bounds" named none)."""
    more = f"profile more ({p.data.more_problems})"
    bounds = p.bucket.bounds
    if profile is None or "avg_at_k" not in profile or p.sweep.bucket not in bounds:
        return more + ", or widen its bounds"
    avg = pd.to_numeric(profile["avg_at_k"], errors="coerce").dropna()
    held = bounds_holding(avg, need, bounds[p.sweep.bucket])
    if held is None:
        return f"{more}: no bounds hold them ({int(((avg > 0) & (avg < 1)).sum())} of {len(avg)} have a reward signal)"
    val = need - max(p.sweep.b_problem)
    return (f"bucket.{p.sweep.bucket}: [{held[0]:g}, {held[1]:g}] with bucket.val_size: {val} and sweep.eval_k: {k_max}"
            f" (holds {int(avg.between(*held).sum())} of the {len(avg)} profiled), or {more}")


def bucket_bounds_fix(p: StudyParams, profile: pd.DataFrame, bucket: str) -> str:
    """Bounds of ``bucket`` that hold its validation split and a batch of training problems, from the profile's
    pass rates; or, where no bounds do, the one line that says why and what would ("widen the
    bucket's bounds" named none)."""
    bounds = p.bucket.bounds
    if bucket not in bounds:
        return f"widen the bounds of the buckets {bucket!r} mixes, or profile more problems ({p.data.more_problems})"
    avg = pd.to_numeric(profile["avg_at_k"], errors="coerce").dropna()
    b, val = max(p.sweep.b_problem), p.bucket.val_size
    k = int(profile["k"].max()) if "k" in profile else p.profile.k
    signal = int(((avg > 0) & (avg < 1)).sum())
    for need, what in ((val + 2 * b, "two batches"), (val + b, "one batch")):
        held = bounds_holding(avg, need, bounds[bucket])
        if held is not None:
            count = int(avg.between(*held).sum())
            return (f"bucket.{bucket}: [{held[0]:g}, {held[1]:g}] (holds {count} of the {len(avg)} profiled "
                    f"problems: {val} to validate and {what} of {b} to train)")
    if signal > b + 1:
        return (f"bucket.val_size: {max(1, signal - b - 1)} and bucket.{bucket}: [{1 / k:g}, {1 - 1 / k:g}] (every "
                f"problem with a reward signal: {signal} of {len(avg)} have 0 < avg@{k} < 1)")
    zero = float((avg == 0).mean()) if len(avg) else 0.0
    side = "weak" if zero >= float((avg == 1).mean()) else "strong"
    return (f"no bounds hold it: {signal} of the {len(avg)} profiled problems have 0 < avg@{k} < 1; the model is too "
            f"{side} for this set: profile more problems ({p.data.more_problems}), or use "
            + ("an easier set, longer answers (sampling.max_new_tokens) or a stronger model" if side == "weak"
               else "a harder set or a weaker model"))
