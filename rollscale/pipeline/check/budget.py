"""Can the study answer at its target budget C*? (science §9.3, §9.4, §10.2), for ``rollscale check``.

C* against eta x c_max (a run's own fit is trusted eta times past its data; past that, a sweep with two or more
ordered keys answers with the forecast, tested up to 8 x c_max), and the tolerance against what the
validation set, eval_k and seeds resolve. Findings as (level, keys, message, fix) tuples that
:mod:`rollscale.pipeline.check.findings` wraps.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from rollscale.config import StudyParams
from rollscale.core.fit import power
from rollscale.core.fit.horizon import COMPUTE_MULTIPLES

__all__ = ["decision_findings", "decision_half_width", "decision_seeds"]

Finding = tuple[str, tuple[str, ...], str, str]

# the most seeds a key a fix proposes: each seed is a run of a key to c_max, so the sweep's time grows with them
# (the default study trains 3; 8 is nearly three times its sweep)
SEEDS_FIX_MAX = 8


def decision_findings(p: StudyParams, size: tuple[int, int] | None = None, pool: int | None = None) -> Iterator[Finding]:
    """Can the study answer at C* (science §9.3, §9.4, §10)? C* against eta x c_max (past it, the forecast over
    ordered keys answers, up to 8 x c_max), and the tolerance against what
    the validation set, eval_k and seeds resolve; ``size``: the sweep bucket's (train, validation) problems once
    the profile is laid out (a fix proposes no validation split it cannot hold), else the ``pool``'s size."""
    c_star, eta, c_max = p.target_budget, p.sweep.search.eta, p.sweep.c_max
    reach = ("study.target_budget", "sweep.c_max")
    farthest = max(COMPUTE_MULTIPLES)  # the farthest the forecast is read and tested at (docs/benchmarks.md)
    if c_star > eta * c_max and _forecast_keys(p):
        level = "note" if c_star <= farthest * c_max else "warning"
        yield (level, reach, f"C* = {c_star:,} is {c_star / c_max:.2f} x c_max, beyond what a run's own fit reads "
               f"(eta = {eta:g} x its data): the answer there is the forecast's (science §10.2: one surface over the "
               "keys), checked by the study's backtest (§10.3), with intervals that widen with the distance"
               + ("" if level == "note" else f"; past {farthest} x c_max it is untested"),
               "" if level == "note" else f"sweep.c_max: {math.ceil(c_star / farthest):,} or more (C* / {farthest})")
    elif c_star > eta * c_max:
        yield ("error", reach, f"C* = {c_star:,} rollouts is beyond eta = {eta:g} times c_max = {c_max:,}: "
               "no fit reaches it, so every key is unknown there", f"sweep.c_max: {math.ceil(c_star / eta):,} "
               f"or more (C* / eta), or {c_star:,} to see C* itself")
    elif c_star > c_max:
        yield ("note", reach, f"C* = {c_star:,} is {c_star / c_max:.2f} x c_max: answered by extrapolation "
               f"(up to eta = {eta:g}), with wider intervals (docs/benchmarks.md: about twice at 1.8 x)", "")
    val = size[1] if size else p.bucket.val_size
    seeds, seeds_key = decision_seeds(p)
    resolution = decision_half_width(p, val, seeds)
    if resolution is None:
        return  # the size and seed findings say why there is no interval
    half, se = resolution
    eps = p.study.tolerance
    msg = (f"with {seeds} seeds and avg@{p.sweep.eval_k} over {val} validation problems (SE {se:.3f}), D between two "
           f"keys is known to about +-{half:.3f}; tolerance {eps:g} settles keys worse by {2 * half - eps:.3f} or more "
           "(upper bound of D <= tolerance in most studies)")
    if half <= eps:
        yield ("note", ("study.tolerance",), msg + ", and can decide between keys of equal reward", "")
        return
    more_seeds = math.ceil(2.0 * (power.Z95 * se / eps) ** 2 - 1e-9)
    more_val = math.ceil(val * (half / eps) ** 2 - 1e-9)
    # only values that can be applied ("seeds_max: 301 seeds, or bucket.val_size: 601" beside a bucket
    # of 3): seeds up to SEEDS_FIX_MAX, a validation split the sweep bucket holds with a batch left to train
    held = size[0] + size[1] if size else pool
    room = held - max(p.sweep.b_problem) if held is not None else None
    others = ([f"{seeds_key}: {more_seeds} seeds"] if more_seeds <= SEEDS_FIX_MAX else []) + \
        ([f"bucket.val_size: {more_val:,}"] if room is None or more_val <= room else [])
    none = (f" (no seeds up to {SEEDS_FIX_MAX} nor validation split the bucket holds decides them)" if not others
            else "")
    yield ("note", ("study.tolerance", seeds_key, "bucket.val_size"), msg + "; two keys of equal reward "
           "stay 'not decided'", f"study.tolerance: {math.ceil(100 * half - 1e-9) / 100:.2f} or more to decide "
           "between keys of equal reward" + (f"; or {', or '.join(others)}" if others else none))


def _forecast_keys(p: StudyParams) -> bool:
    """Whether the sweep trains two or more keys along an ordered axis (n at a B_problem, or B_problem at an n):
    the forecast's surface past the data needs them (science §10.1; a rule or an iso-batch design has none)."""
    design = p.sweep.design
    return (design in ("rollout_axis", "grid") and len(set(p.sweep.n)) >= 2) or \
        (design in ("prompt_axis", "grid") and len(set(p.sweep.b_problem)) >= 2)


def decision_seeds(p: StudyParams) -> tuple[int, str]:
    """(the seeds the decision between two close keys reads, the key that sets them): ``sweep.seeds``; under the
    decision search (science §9.4) the seeds it adds where the decision hangs, up to ``sweep.search.seeds_max``
    (null: ``sweep.seeds``)."""
    from rollscale.core.search.decisions import search_method

    if search_method(p.sweep.search.method).adds_seeds and p.sweep.search.seeds_max is not None:
        return p.sweep.search.seeds_max, "sweep.search.seeds_max"
    return len(p.sweep.seeds), "sweep.seeds"


def decision_half_width(p: StudyParams, val: int, seeds: int | None = None) -> tuple[float, float] | None:
    """(95 % half-width of D between two keys' means over ``seeds`` seeds (None: ``sweep.seeds``), the standard
    error of one avg@k evaluation) over ``val`` validation problems; None where there is no interval (no validation
    problem, one seed). The pass-rate variance is the worst case in the sweep bucket's bounds."""
    seeds = len(p.sweep.seeds) if seeds is None else seeds
    if val == 0 or seeds < 2:
        return None
    bounds = p.bucket.bounds
    var = power.interval_pass_variance(*bounds[p.sweep.bucket]) if p.sweep.bucket in bounds else 0.25
    se = power.avg_at_k_se(val, p.sweep.eval_k, var)
    return power.Z95 * math.sqrt(2.0 / seeds) * se, se  # D of two keys' means over seeds (docs/benchmarks.md)
