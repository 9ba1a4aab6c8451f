"""``rollscale init --hours H``: size a study to H hours on this machine ("time first").

From the measured calibration (:mod:`rollscale.pipeline.check.calibration`) and the stage-time model
(:mod:`rollscale.pipeline.check.timing`), :func:`fit_hours` shrinks what ``init`` suggested, one
setting at a time in the order that costs the answer least, until the estimate fits: the pool
(profile time), ``max_new_tokens``, ``profile.k``, the sweep's budget ``c_max`` (down to what
gives the widest batch 8 steps), its prompts per step, the measure stage's steps and prompts, one
seed of three, the largest n; in passes, since a smaller batch lets ``c_max`` shrink further. Each
setting given up is said, with its reason; a study that cannot fit even at the floors says so.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import yaml

from rollscale.config import StudyParams, parse_params
from rollscale.core.search.decisions import search_method
from rollscale.pipeline.check.calibration import Calibration
from rollscale.pipeline.init.values import EasyShare, bucket_values
from rollscale.pipeline.check.timing import StageTimes, settles_nothing, stage_times

__all__ = ["Shrink", "check_hours", "fit_hours", "params_of"]

POOL_MIN = 60  # problems profiled: a validation split and a few batches of Easy problems
TOKENS_MIN = 64  # max_new_tokens: a short worked answer
K_MIN = 8  # avg@k of the profile
STEPS_MIN = 8  # optimizer steps of the widest batch at c_max (a sigmoid fit needs 4 record points)


@dataclass(frozen=True)
class Shrink:
    """One setting given up: its key, old and new value, and what it costs the study."""

    key: str
    old: Any
    new: Any
    cost: str

    def text(self) -> str:
        return f"{self.key}: {self.old} -> {self.new} ({self.cost})"


def check_hours(hours: Any) -> None:
    """Raise the one-line error for hours that are not a positive number."""
    if isinstance(hours, bool) or not (isinstance(hours, (int, float)) and hours > 0 and math.isfinite(hours)):
        raise ValueError(f"--hours: expected the hours the study may take (a number > 0), got {hours!r}")


def params_of(values: dict[str, Any], why: dict[str, str]) -> StudyParams:
    from rollscale.pipeline.init.values import render

    return parse_params(yaml.safe_load(render(values, why, [])), "rollscale init --hours")


def _default(key: str) -> Any:
    """The schema's default of a dotted key ``init`` did not set."""
    node: Any = StudyParams()
    for part in key.split("."):
        node = getattr(node, part)
    return node


def _moves(values: dict[str, Any], pool: int | None,
           limit_min: int = 0) -> list[tuple[str, Callable[[Any], Any | None], str]]:
    """(key, next smaller value or None at its floor, what it costs), in the order given up; the pool no smaller
    than ``limit_min``, what the used bucket needs (:mod:`rollscale.pipeline.init.pilot`)."""
    def widest() -> int:
        return values["sweep.b_problem"][0] * max(values["sweep.n"])

    def halve_to(floor: int) -> Callable[[Any], Any | None]:
        return lambda v: max(floor, v // 2) if v is not None and v > floor else None

    def c_max(v: int) -> int | None:
        target = values.get("study.target_budget")
        p = params_of(values, {})
        # C* stays within how far the method answers past c_max (eta; the forecast search 8 x, science §10)
        floor = max(widest() * STEPS_MIN, math.ceil(target / search_method(p.sweep.search.method).reach(p.sweep.search))
                    if target else 0)
        return max(floor, int(math.ceil(v / 2 / 100) * 100)) if v > floor else None

    def seeds(v: list[int]) -> list[int] | None:
        return v[:2] if len(v) > 2 else None

    def keys(v: list[int]) -> list[int] | None:
        return v[:-1] if len(v) > 2 else None

    def b_problem(v: list[int]) -> list[int] | None:
        return [max(2, v[0] // 2)] if v[0] > 2 else None

    def seeds_max(v: int | None) -> int | None:
        """seeds_max down to seeds_min where the validation cannot settle a key: a seed added there decides
        nothing (it only narrows an interval that stays wider than any difference between keys)."""
        p = params_of(values, {})
        lo, val = p.sweep.search.seeds_min, p.bucket.val_size
        if not search_method(p.sweep.search.method).adds_seeds or (v is not None and v <= lo) or not settles_nothing(p, val):
            return None
        return lo

    def limit(v: int | None) -> int | None:
        start = v if v is not None else pool
        return halve_to(max(POOL_MIN, limit_min))(start) if start is not None else None

    return [("sweep.search.seeds_max", seeds_max, "no seed added where the decision hangs: the validation set "
             "cannot settle a key, and more seeds would not either"),
            ("data.limit", limit, "fewer problems profiled: smaller buckets to train and validate on"),
            ("sampling.max_new_tokens", halve_to(TOKENS_MIN), "more answers cut short (check reports the share)"),
            ("profile.k", halve_to(K_MIN), "coarser pass rates, noisier bucket bounds"),
            ("sweep.c_max", c_max, "the answer extrapolates further to C* (science §9.3)"),
            ("sweep.b_problem", b_problem, "fewer prompts per step: noisier steps"),
            ("measure.steps", halve_to(1), "fewer measured steps: noisier noise estimates"),
            ("measure.b_problem", halve_to(2), "fewer prompts in the noise measurement: noisier B_simple"),
            ("sweep.seeds", seeds, "2 seeds: crude bootstrap intervals"),
            ("sweep.n", keys, "one n fewer to compare")]


def fit_hours(values: dict[str, Any], why: dict[str, str], hours: float, cal: Calibration,
              pool: int | None, easy: EasyShare = EasyShare(), limit_min: int = 0) -> tuple[StageTimes, list[Shrink]]:
    """Shrink ``values`` in place until the estimate is within ``hours``; the estimate and what was given up.
    ``easy``: the share of the pool expected in the used bucket, which sizes the split when the pool shrinks, to
    no fewer than ``limit_min`` problems."""
    check_hours(hours)
    budget = hours * 3600
    given: list[Shrink] = []

    def estimate() -> StageTimes:
        p = params_of(values, why)
        return stage_times(p, cal, min(pool, p.data.limit) if pool and p.data.limit else (p.data.limit or pool))

    times = estimate()
    changed = True
    while times.total > budget and changed:  # passes: a smaller batch lets c_max shrink further
        changed = False
        for key, smaller, cost in _moves(values, pool, limit_min):
            while times.total > budget:
                old = values[key] if key in values else _default(key)
                new = smaller(old)
                if new is None or new == old:
                    break
                values[key], changed = new, True
                if key == "sweep.b_problem":  # the measure stage trains on as many prompts
                    values["measure.b_problem"] = min(values.get("measure.b_problem", new[0]), new[0])
                if key == "data.limit":  # the split and batches init sized from the pool shrink with it
                    bucket_values(values, why, new, easy, values["sweep.b_problem"][0])
                given.append(Shrink(key, old, new, cost))
                times = estimate()
    for shrink in _merged(given):
        why[shrink.key] = f"--hours {hours:g}: {shrink.old} -> {shrink.new}, {shrink.cost}"
    return times, _merged(given)


def _merged(given: list[Shrink]) -> list[Shrink]:
    """One line per key: its first value to its last."""
    first: dict[str, Shrink] = {}
    for s in given:
        first[s.key] = Shrink(s.key, first[s.key].old if s.key in first else s.old, s.new, s.cost)
    return list(first.values())
