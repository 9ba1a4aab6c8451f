"""Each stage's wall time on this machine, from the measured calibration, for ``rollscale check``
and ``rollscale init --hours``.

The work each stage does is counted from the params (and the profile, once it has run): rollouts
generated in calls of ``sampling.batch_size``, tokens trained, evaluations, the tiny model's warm start;
:class:`rollscale.pipeline.check.calibrated.Calibration` prices them. Units of work (profile chunks, measure
n values, sweep runs) run ``workers`` side by side. What is not measured here is taken from
measurements on this 2-core VM, each named where it is used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from rollscale.config import StudyParams
from rollscale.core.fit import power
from rollscale.pipeline.check.calibrated import Calibration
from rollscale.pipeline.check.budget import decision_half_width
from rollscale.pipeline.check.evals import run_evaluation_steps

__all__ = ["StageTimes", "settles_nothing", "stage_times", "time_finding"]

# a stage's process, Prefect flow and worker pool start-up (docs/benchmarks.md: a pool of 2 starts in 9.2 s)
STAGE_START_S = 9.0
# two busy cores each run ~1.25x slower than one (shared L3 and memory bandwidth; docs/benchmarks.md)
SIDE_BY_SIDE_SLOWDOWN = 1.25
# the fit and report stages: their start-up and a few seconds of work (the default study: 5.3 s and 10.1 s,
# docs/benchmarks.md); they grow little with the study
FIT_S, REPORT_S, BUCKET_S = 5.3, 10.1, 3.2
# a search stops a key only on a difference the runs resolve (science §9.4): where a key must be worse than the
# leader by more than this to be settled (2 x the half-width of D less the tolerance, check_budget), no key
# stops and the sweep trains the whole grid. Keys of the default study differ at C* by <= 0.06, those of the
# simulated families (rollscale/core/search/simulate.py) by <= 0.11. Measured miss without it: a SmolLM2 study
# of 4 validation problems (D known to +-0.245) was counted at 56 % of its grid and trained every key to C_max.
SETTLE_GAP_MAX = 0.1
# the share of profiled problems at avg@k = 0 (resampled to k_extreme) assumed before the profile has run
# (an assumption, said in the finding; the profile's own share replaces it)
ZERO_SHARE_PRIOR = 0.3


@dataclass(frozen=True)
class StageTimes:
    """Seconds per stage (the study's order), and how the sweep was counted."""

    seconds: dict[str, float]
    sweep_grid_s: float
    search_share: float
    sweep_rollouts: int
    lengths_from: str
    share_why: str = ""  # why a search is counted at the whole grid, when it is

    @property
    def total(self) -> float:
        return sum(self.seconds.values())


def _side_by_side(units: list[float], workers: int) -> float:
    """Wall seconds of ``units`` on ``workers`` processes: the sum shared out, at least the longest."""
    if not units:
        return 0.0
    if workers <= 1 or len(units) == 1:
        return sum(units) if workers <= 1 else max(units)
    slow = SIDE_BY_SIDE_SLOWDOWN
    return max(sum(units) * slow / workers, max(units) * slow)


def _lengths(p: StudyParams, cal: Calibration, profile: pd.DataFrame | None) -> tuple[float, float, str]:
    """(completion tokens a trained rollout has, share of problems at avg@k = 0, where from)."""
    if profile is not None and not profile.empty and "mean_len" in profile:
        length = float(pd.to_numeric(profile["mean_len"], errors="coerce").mean())
        zero = float((pd.to_numeric(profile["avg_at_k"], errors="coerce") == 0).mean())
        return min(length, p.sampling.max_new_tokens), zero, "the profile's lengths"
    return float(p.sampling.max_new_tokens), ZERO_SHARE_PRIOR, "max_new_tokens (no profile yet)"


def _step_s(p: StudyParams, cal: Calibration, rollouts: int, length: float, noise: bool = False) -> float:
    """One GRPO step of ``rollouts``: generated in calls of sampling.batch_size, then trained (``noise``: and
    the measure stage's Gram pass before the update)."""
    s = p.sampling
    tokens = rollouts * (cal.prompt_tokens + length)
    gram = tokens * (cal.gram_s_per_token + rollouts * cal.gram_s_per_token_rollout) if noise else 0.0
    return (cal.generate_s(rollouts, s.batch_size, s.max_new_tokens) + cal.train_s_per_step
            + tokens * cal.train_s_per_token + gram)


def _sweep(p: StudyParams, cal: Calibration, length: float, val_size: int) -> tuple[list[float], int]:
    """Seconds of each run trained to c_max, and the grid's rollouts."""
    from rollscale.sweep.grid import plan_runs

    s, sw = p.sampling, p.sweep
    runs, rollouts = [], 0
    for point, _ in plan_runs(sw).runs:
        b = point.n * point.b_problem
        steps = power.steps_per_run(sw.c_max, b)
        evaluation = cal.generate_s(val_size * (sw.eval_k + 1), s.batch_size, s.max_new_tokens)
        evals = len(run_evaluation_steps(p, b)) * evaluation
        runs.append(steps * _step_s(p, cal, b, length) + evals)
        rollouts += steps * b
    return runs, rollouts


def stage_times(p: StudyParams, cal: Calibration, pool: int | None, profile: pd.DataFrame | None = None,
                val_size: int | None = None) -> StageTimes:
    """Each stage's wall seconds for ``p`` on the machine ``cal`` measured; ``pool``: the problems profiled
    (the profile's rows once it has run), ``val_size``: the sweep bucket's validation problems when known."""
    s, pr, m = p.sampling, p.profile, p.measure
    length, zero, lengths_from = _lengths(p, cal, profile)
    pool = len(profile) if profile is not None and not profile.empty else (pool or 0)
    chunks = [min(pr.chunk_size, pool - i) for i in range(0, pool, pr.chunk_size)]
    extra = max(pr.k_extreme - pr.k, 0)
    profile_units = [cal.generate_s(c * pr.k, s.batch_size, s.max_new_tokens)
                     + cal.generate_s(math.ceil(c * zero) * extra, s.batch_size, s.max_new_tokens) for c in chunks]
    measure_units = [m.steps * _step_s(p, cal, n * m.b_problem, length, noise=True) for n in m.n]
    val = val_size if val_size is not None else p.bucket.val_size
    runs, rollouts = _sweep(p, cal, length, val)
    share, why = _search_share(p, val)
    grid = _side_by_side(runs, p.workers)
    seconds = {"base": STAGE_START_S + cal.base_s,
               "profile": STAGE_START_S + _side_by_side(profile_units, p.workers),
               "bucket": BUCKET_S,
               "measure": STAGE_START_S + _side_by_side(measure_units, p.workers),
               "sweep": STAGE_START_S + share * grid,
               "fit": FIT_S, "report": REPORT_S}
    return StageTimes(seconds, STAGE_START_S + grid, share, rollouts, lengths_from, why)


def settles_nothing(p: StudyParams, val: int) -> str:
    """Why a search of ``p`` can settle no key early (:data:`SETTLE_GAP_MAX`), or "" where it can."""
    from rollscale.core.search.decisions import search_method

    resolution = decision_half_width(p, val)
    if search_method(p.sweep.search.method).measured_spent(p.sweep.search, len(p.sweep.seeds)) is None \
            or resolution is None:
        return ""
    if 2 * resolution[0] - p.study.tolerance <= SETTLE_GAP_MAX:
        return ""
    return (f"D between two keys is known to +-{resolution[0]:.3f} (avg@{p.sweep.eval_k} over {val} validation "
            f"problems, {len(p.sweep.seeds)} seeds): the {p.sweep.search.method} search can settle no key early")


def _search_share(p: StudyParams, val: int) -> tuple[float, str]:
    """(the share of the grid's rollouts the sweep spends, why, where a search is not counted at its measured
    share): 1 for a grid or a search with no keys to choose. A search that can settle no key (:func:`settles_nothing`)
    trains every key to C_max, a key beyond the leading edge where the bracket allows one (science §9.4; the
    --hours 1 SmolLM2 study added n = 8 to {2, 4}), and, for the decision search, seeds up to ``seeds_max`` for
    the leader and one other key: its share can pass 1. The measured share is the method's
    (:meth:`rollscale.core.search.methods.base.SearchMethod.measured_spent`)."""
    from rollscale.core.search.decisions import search_method
    from rollscale.sweep.groups import search_plan, search_settings

    method = search_method(p.sweep.search.method)
    spent = method.measured_spent(p.sweep.search, len(p.sweep.seeds))
    if spent is None:
        return 1.0, ""
    try:
        groups = search_plan(p.sweep).groups
    except ValueError:
        return 1.0, ""
    if not groups:
        return 1.0, ""
    why = settles_nothing(p, val)
    if not why:
        return spent, ""
    settings, grid_seeds = search_settings(p.sweep, p.study), len(p.sweep.seeds)
    runs = grid = beyond_any = added_any = 0
    for g in groups:
        lo, hi = min(g.keys), max(g.keys)
        beyond = g.axis != "rule" and ((lo // 2 != lo and g.allows(lo // 2)) or g.allows(hi * 2))
        added = method.seeds_added(g, settings)
        runs += (len(g.keys) + int(beyond)) * len(g.seeds) + added
        grid += len(g.keys) * grid_seeds
        beyond_any, added_any = beyond_any or beyond, added_any or added
    parts = ["every key to C_max"] + (["a key beyond the leading edge"] if beyond_any else []) + \
        (["seeds up to seeds_max for two keys"] if added_any else [])
    return runs / grid, f"{why}; it trains " + ", ".join(parts[:-1]) + (" and " if len(parts) > 1 else "") + parts[-1]


def _clock(seconds: float) -> str:
    if seconds >= 5400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


def time_finding(p: StudyParams, times: StageTimes, cal: Calibration,
                 done: frozenset[str] = frozenset()) -> tuple[str, tuple[str, ...], str, str]:
    """The estimate as a check finding (a warning past 12 hours), naming what it rests on; the stages in ``done``
    (up to date with dvc.lock) are not counted (the check counted the profile's minutes after it ran)."""
    left = {stage: t for stage, t in times.seconds.items() if stage not in done}
    per = ", ".join(f"{stage} {_clock(t)}" for stage, t in left.items()) or "nothing"
    total = sum(left.values())
    said = f" to run (done: {', '.join(s for s in times.seconds if s in done)})" if done & set(times.seconds) else ""
    if "sweep" in done:
        search = ""
    elif times.share_why:
        search = (f"; the sweep at {times.search_share:.0%} of the grid's {times.sweep_rollouts:,} rollouts "
                  f"({times.share_why}; the grid alone: {_clock(times.sweep_grid_s)})")
    elif times.search_share < 1:
        search = (f"; the sweep at {times.search_share:.0%} of the grid's {times.sweep_rollouts:,} rollouts, what "
                  f"the {p.sweep.search.method} search spent on the default study or its simulated kin "
                  f"(docs/benchmarks.md; the whole grid: "
                  f"{_clock(times.sweep_grid_s)})")
    else:
        search = f"; the sweep trains all {times.sweep_rollouts:,} rollouts of the grid"
    msg = (f"about {_clock(total)}{said} on this machine: {per}{search}. From a calibration measured here in "
           f"{cal.measured_s:.0f} s (generate {1e3 * cal.gen_s_per_token * p.sampling.max_new_tokens:.2f} ms and "
           f"train {1e3 * cal.train_s_per_token * (cal.prompt_tokens + p.sampling.max_new_tokens):.2f} ms a rollout "
           f"at max_new_tokens {p.sampling.max_new_tokens}, one worker; {p.workers} side by side), lengths from "
           f"{times.lengths_from}; a machine busy with other work takes longer")
    if total > 12 * 3600:
        return ("warning", ("sweep", "data.limit"), msg, "rollscale init --hours H sizes a study to H hours; or "
                "fewer runs (sweep.n, sweep.seeds), a smaller sweep.c_max or sampling.max_new_tokens")
    return ("note", ("time",), msg, "")
