"""Problem-pool tasks (science §2)."""

from __future__ import annotations

import logging
from pathlib import Path

from rollscale.config import DataParams
from rollscale.core.problems.sources import mix_problems, table_problems
from rollscale.core.problems.sets import gsm8k_problems, math_problems, reasoning_gym_problems
from rollscale.core.problems.problem import Problem
from tasks.common import retried_task

log = logging.getLogger("rollscale")


def table_pool(data: DataParams) -> list[Problem]:
    """The user's tables, each read whole, mixed by weight (``data.limit`` problems, else all the weights allow)."""
    parts = []
    for t in data.tables:
        parts.append((t.label, table_problems(t, data.skip_malformed), t.weight))
    if len(parts) == 1 and data.limit is None:
        return parts[0][1]
    return mix_problems(parts, data.limit, data.seed)


def load_pool(data: DataParams, size: int | None = None, seed: int | None = None) -> list[Problem]:
    """The problems of the configured source (``size``/``seed`` override for disjoint pools)."""
    if data.source == "reasoning_gym":
        return reasoning_gym_problems(
            data.name, size or data.size, data.seed if seed is None else seed, dict(data.config), data.prompt_style
        )
    if data.source == "table":
        return table_pool(data)
    path = str(data.path) if data.path else None
    hub = {"hub_id": data.hub_id} if data.hub_id else {}
    loader = gsm8k_problems if data.source == "gsm8k" else math_problems
    return loader(path, split=data.split, skip_malformed=data.skip_malformed, limit=data.limit, **hub)


def watched_paths() -> tuple[Path, list[Path]]:
    """(the project folder, the paths dvc.yaml lists as deps of its stages): DVC reruns a stage when one of
    them changes. A clone lists data/; a study folder of the user's own, its data file when it is inside."""
    from rollscale.pipeline.stages.specs import load_stage_specs, project_root

    root = project_root()
    return root, [(root / dep).resolve() for spec in load_stage_specs(root).values() for dep in spec.deps]


def unwatched_files(data: DataParams) -> list[str]:
    """Local data files that no dvc.yaml dep holds: read all the same, but DVC cannot see them change (the
    warning once said so of a file outside data/ that the study folder's dvc.yaml lists, and DVC reran on it)."""
    paths = ([data.path] if data.path else []) + [t.path for t in data.tables if t.path is not None]
    try:
        _, deps = watched_paths()
    except (FileNotFoundError, ValueError):  # no dvc.yaml: no stage is run by DVC here
        return []
    return [str(p) for p in paths if not any(Path(p).resolve().is_relative_to(d) for d in deps)]


@retried_task(name="problem-pool")
def problem_pool(data: DataParams) -> list[Problem]:
    """The profiled pool (stable ids, so later stages can join on problem_id)."""
    for path in unwatched_files(data):
        log.warning("data file %s is not among dvc.yaml's deps: DVC will not rerun the study when it changes "
                    "(copy it into the study folder and run `rollscale init --force` with the copy, or in a clone "
                    "move it under data/; else run `dvc repro --force base` after editing it)", path)
    return load_pool(data)

