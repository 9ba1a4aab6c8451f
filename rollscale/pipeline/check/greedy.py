"""Is the validation set one RL can move? Problems the model already solves greedily, for `init` and `check`.

A validation problem the model answers right at temperature 0 before any training leaves the greedy accuracy
nothing to rise by; a set of them reads greedy 1.0 at step 0 in every run (science §5's evaluation), and its avg@k
moves little. Before the sweep the evidence is init's pilot profile (its ``greedy`` column, stored as
:data:`PILOT_FILE`); once the sweep has evaluated, each run's step-0 evaluation. Where the pilot has them,
:func:`unsolved_bounds` gives bounds of pass rates that hold problems neither solved greedily nor hopeless.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from rollscale.config import StudyParams

__all__ = ["GREEDY_SOLVED_WARN", "PILOT_FILE", "greedy_findings", "greedy_solved_line", "unsolved_bounds"]

PILOT_FILE = "init_pilot.parquet"  # init's pilot profile, under artifacts/
# the share of the bucket's problems solved greedily past which the check warns: the validation split is a third
# of the bucket, so at this share most of it starts solved
GREEDY_SOLVED_WARN = 0.5

Finding = tuple[str, tuple[str, ...], str, str]


def greedy_solved_line(pilot: pd.DataFrame, bounds: tuple[float, float], bucket: str) -> str:
    """The line that says most of the pilot's problems inside ``bounds`` are solved greedily, "" where they are
    not (or the pilot has no greedy answers, or none inside)."""
    if "greedy" not in pilot or pilot.empty:
        return ""
    avg = pd.to_numeric(pilot["avg_at_k"], errors="coerce")
    inside = pilot[avg.between(*bounds)]
    if inside.empty:
        return ""
    solved = int((pd.to_numeric(inside["greedy"], errors="coerce") >= 1).sum())
    if solved / len(inside) < GREEDY_SOLVED_WARN:
        return ""
    return (f"{solved} of the {len(inside)} pilot problems in {bucket} [{bounds[0]:g}, {bounds[1]:g}] are solved "
            "greedily before any training: a validation split of them reads greedy 1.0 at step 0, with nothing "
            "for RL to raise")


def unsolved_bounds(pilot: pd.DataFrame, hits_needed: int) -> tuple[float, float] | None:
    """Pass-rate bounds that hold at least ``hits_needed`` of the pilot's problems with a reward signal
    (0 < avg@k < 1) that greedy decoding does not solve, and as few solved ones as such bounds allow: from the
    lowest such pass rate to the highest; None where too few are."""
    if "greedy" not in pilot or pilot.empty:
        return None
    avg = pd.to_numeric(pilot["avg_at_k"], errors="coerce").to_numpy()
    greedy = pd.to_numeric(pilot["greedy"], errors="coerce").to_numpy()
    moving = avg[(avg > 0) & (avg < 1) & (greedy < 1)]
    if len(moving) < max(hits_needed, 1):
        return None
    return float(np.min(moving)), float(np.max(moving))


def _step0_greedy(artifacts: Path) -> pd.Series | None:
    """Each run's greedy accuracy at step 0 (its first evaluation), None before any run has evaluated."""
    from rollscale.tables import TABLES

    rows = []
    for path in sorted(artifacts.glob(TABLES["evals"])):
        try:
            table = pd.read_parquet(path, columns=["run_id", "step", "greedy"])
        except (OSError, ValueError, KeyError):
            continue
        rows.append(table[table["step"] == 0])
    if not rows:
        return None
    first = pd.concat(rows, ignore_index=True).drop_duplicates("run_id")
    return None if first.empty else first.set_index("run_id")["greedy"]


def greedy_findings(p: StudyParams, artifacts: str | Path | None) -> list[Finding]:
    """A warning where the sweep's validation problems are solved greedily at the start: every run's step-0
    greedy accuracy at 1.0, or, before the sweep, most of init's pilot problems in the sweep bucket's bounds."""
    if artifacts is None:
        return []
    root = Path(artifacts)
    keys = (f"bucket.{p.sweep.bucket}", "bucket.val_size")
    fix = (f"bounds of bucket.{p.sweep.bucket} below the pass rates the model solves greedily (init picks them from "
           "its pilot profile: rerun `rollscale init --force`), or a harder table")
    step0 = _step0_greedy(root)
    if step0 is not None:
        if (step0 >= 1).all():
            return [("warning", keys, f"the validation problems are solved greedily at step 0 (greedy 1.0 in all "
                     f"{len(step0)} runs evaluated): nothing for the greedy accuracy to rise by", fix)]
        return []
    if not (root / PILOT_FILE).is_file() or p.sweep.bucket not in p.bucket.bounds:
        return []
    try:
        pilot = pd.read_parquet(root / PILOT_FILE)
    except (OSError, ValueError):
        return []
    line = greedy_solved_line(pilot, tuple(p.bucket.bounds[p.sweep.bucket]), p.sweep.bucket)
    return [("warning", keys, f"{line} (init's pilot profile)", fix)] if line else []
