"""Can a study answer? The arithmetic of its resolution, before (or after) it runs.

Pure functions over counts a params file and a profile give: how many steps and
evaluations a sweep run makes (science §1, §5), what the fit needs of them
(science §7: record points, four-parameter sigmoids; when a run evaluates: :mod:`rollscale.core.fit.schedule`), the sampling standard
error of validation avg@k and the smallest reward difference it can resolve
(science §5), epochs per run, and how the truncation share of a profile falls
with ``max_new_tokens`` (science §2). :mod:`rollscale.pipeline.check.findings` turns them
into findings naming params keys.
"""

from __future__ import annotations

import math
import numpy as np
from numpy.typing import ArrayLike

from rollscale.core.fit.curves import SIGMOID_MIN_POINTS

__all__ = [
    "EVALS_COMFORTABLE", "FIT_MIN_EVALS", "Z95", "avg_at_k_se", "detectable_difference", "epochs_per_run",
    "evaluations_per_run", "interval_pass_variance", "max_new_tokens_for_truncation", "pass_variance",
    "positive_int", "steps_per_run", "truncated_share_at",
]

# a key's sigmoid needs this many distinct compute values; its record points are a subset of the
# evaluations of its runs (seeds share the evaluation steps), so a run needs at least as many
FIT_MIN_EVALS = SIGMOID_MIN_POINTS
# records are the rising evaluations only (about half of them on the default study's curves):
# below twice the minimum a sigmoid fit fails as often as not
EVALS_COMFORTABLE = 2 * FIT_MIN_EVALS
Z95 = 1.959963984540054  # two-sided 95 % normal quantile


def positive_int(name: str, value: int) -> int:
    """``value`` when it is an integer >= 1 (not a boolean), else a ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name}: expected an integer >= 1, got {value!r}")
    return int(value)


def steps_per_run(c_max: int, rollouts_per_step: int) -> int:
    """Optimizer steps of a run that generates ``rollouts_per_step`` rollouts a step and stops
    once cumulative C >= ``c_max`` (science §1): ``ceil(c_max / B)``."""
    return -(-positive_int("c_max", c_max) // positive_int("rollouts_per_step", rollouts_per_step))


def evaluations_per_run(steps: int, eval_every: int) -> int:
    """Validation evaluations of a run of ``steps`` steps: step 0, every ``eval_every`` steps and
    the last step (science §5; :func:`rollscale.train.run_loop.run`)."""
    steps, eval_every = positive_int("steps", steps), positive_int("eval_every", eval_every)
    return 1 + steps // eval_every + (1 if steps % eval_every else 0)


def avg_at_k_se(val_size: int, eval_k: int, pass_var: float = 0.25) -> float:
    """Sampling standard error of validation avg@k over ``val_size`` fixed problems with
    ``eval_k`` samples each (science §5): ``sqrt(pass_var / (val_size * eval_k))``.

    ``pass_var`` is the mean over the validation problems of p (1 - p), p a problem's
    pass rate (0.25 at most, at p = 0.5). The validation set is fixed, so two runs
    compared on it differ by this noise, not by which problems were drawn.
    """
    val_size, eval_k = positive_int("val_size", val_size), positive_int("eval_k", eval_k)
    if not (math.isfinite(pass_var) and 0.0 <= pass_var <= 0.25):
        raise ValueError(f"pass_var: expected a number in [0, 0.25], got {pass_var!r}")
    return math.sqrt(pass_var / (val_size * eval_k))


def detectable_difference(se: float, z: float = Z95) -> float:
    """The smallest difference of two evaluations, each with standard error ``se``, that a
    two-sided test at ``z`` tells from zero: ``z * sqrt(2) * se``."""
    if not (math.isfinite(se) and se >= 0):
        raise ValueError(f"se: expected a finite number >= 0, got {se!r}")
    return z * math.sqrt(2.0) * se


def pass_variance(avg_at_k: ArrayLike, k: int) -> float:
    """Mean p (1 - p) over problems from their profiled avg@k with ``k`` samples each, with
    the unbiased small-sample factor k / (k - 1) (a problem at 0 or 1 contributes 0)."""
    k = positive_int("k", k)
    p = np.asarray(avg_at_k, dtype=float)
    if p.size == 0 or not np.all(np.isfinite(p)) or np.any((p < 0) | (p > 1)):
        raise ValueError("avg_at_k: expected a non-empty array of values in [0, 1]")
    factor = k / (k - 1) if k > 1 else 1.0
    return float(min(np.mean(p * (1 - p)) * factor, 0.25))


def interval_pass_variance(lo: float, hi: float) -> float:
    """The largest p (1 - p) for a pass rate in [lo, hi] (a bucket's bounds, before a profile)."""
    if not (0.0 <= lo <= hi <= 1.0):
        raise ValueError(f"expected 0 <= lo <= hi <= 1, got [{lo}, {hi}]")
    p = min(max(0.5, lo), hi)
    return p * (1 - p)


def epochs_per_run(steps: int, b_problem: int, train_size: int) -> float:
    """Passes over the training split a run makes: ``steps * b_problem / train_size``."""
    return positive_int("steps", steps) * positive_int("b_problem", b_problem) / positive_int("train_size", train_size)


def _tails(mean_len: ArrayLike, trunc_rate: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """Per problem: (truncated share, mean length of the exponential tail past the profiled cap).

    Each problem's mean is the maximum-likelihood estimate under right censoring at the cap:
    its observed tokens over its completions that ended (``mean_len / (1 - trunc_rate)``).
    A problem whose every sample was cut gets the longest mean of the others (its own is
    unknown, at least that long); all infinite when no completion ended anywhere.
    """
    lens, rates = np.asarray(mean_len, dtype=float), np.asarray(trunc_rate, dtype=float)
    if lens.size == 0 or lens.shape != rates.shape:
        raise ValueError("mean_len, trunc_rate: expected non-empty arrays of one length")
    if np.any(~np.isfinite(lens) | (lens < 0)) or np.any(~np.isfinite(rates) | (rates < 0) | (rates > 1)):
        raise ValueError("mean_len must be >= 0 and trunc_rate in [0, 1]")
    ended = rates < 1
    means = np.full(lens.shape, math.inf)
    means[ended] = lens[ended] / (1 - rates[ended])
    if ended.any():
        means[~ended] = means[ended].max()
    return rates, means


def truncated_share_at(mean_len: ArrayLike, trunc_rate: ArrayLike, profiled_max: int, new_max: int) -> float:
    """The share of rollouts still truncated at ``new_max`` tokens, from a profile made at
    ``profiled_max`` (science §2's ``mean_len``, ``trunc_rate`` per problem).

    Each problem's completion lengths past ``profiled_max`` are modelled as exponential
    (memoryless), with its censored mean: ``rate * exp(-(new_max - profiled_max) / mean)``,
    averaged over problems. Real answer lengths have a mode and fall off faster than an
    exponential of the same mean, so the share is over-estimated and the
    ``max_new_tokens`` asked for errs long. Below ``profiled_max`` the observed share is a
    lower bound; it is returned as is.
    """
    profiled_max, new_max = positive_int("profiled_max", profiled_max), positive_int("new_max", new_max)
    rates, means = _tails(mean_len, trunc_rate)
    if new_max <= profiled_max:
        return float(rates.mean())
    with np.errstate(divide="ignore"):
        return float(np.mean(rates * np.exp(-(new_max - profiled_max) / means)))


def max_new_tokens_for_truncation(mean_len: ArrayLike, trunc_rate: ArrayLike, profiled_max: int,
                                  target: float, multiple: int = 16) -> int | None:
    """The smallest ``max_new_tokens`` (a multiple of ``multiple``) at which
    :func:`truncated_share_at` falls to ``target``; the profiled value when it already
    has; None when no completion ended (the tail cannot be estimated: raise the limit
    several-fold and profile again)."""
    if not 0 < target < 1:
        raise ValueError(f"target: expected a share in (0, 1), got {target!r}")
    rates, means = _tails(mean_len, trunc_rate)
    if rates.mean() <= target:
        return int(profiled_max)
    if not np.isfinite(means).any():
        return None
    lo, hi = profiled_max, profiled_max + multiple
    while truncated_share_at(mean_len, trunc_rate, profiled_max, hi) > target:  # doubling, then bisection
        lo, hi = hi, profiled_max + 2 * (hi - profiled_max)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if truncated_share_at(mean_len, trunc_rate, profiled_max, mid) > target else (lo, mid)
    return int(math.ceil(hi / multiple) * multiple)
