"""Shared task settings and small I/O helpers used by every flow.

Tasks are not cached by Prefect: DVC alone decides which stage reruns
(``dvc.lock``), and within a stage the run store (sweep runs) and the profile
chunks resume finished work. Tasks are retried on transient errors only.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
from prefect import task
from prefect.cache_policies import NO_CACHE

from rollscale.config import StudyParams, load_params
from rollscale.core.problems.problem import Problem
from rollscale.core.problems.profiling import problems_from_profile
from rollscale.pipeline.query.storage import write_duckdb

if TYPE_CHECKING:  # loading models pulls in torch and transformers: seconds the table stages do not need
    from rollscale.lm.models import ModelRef

log = logging.getLogger("rollscale")

ARTIFACTS = Path("artifacts")


def transient(task_obj, task_run, state) -> bool:
    """Retry only on errors that can pass by themselves (I/O, network), never on bad input."""
    try:
        state.result()
    except (ConnectionError, TimeoutError, OSError) as err:
        return not isinstance(err, (FileNotFoundError, PermissionError, IsADirectoryError))
    except Exception:
        return False
    return False


retried_task = functools.partial(
    task, cache_policy=NO_CACHE, retries=2, retry_delay_seconds=2, retry_condition_fn=transient
)


def read_params(path: str | Path) -> StudyParams:
    return load_params(path)


def model_ref_path(artifacts: Path = ARTIFACTS) -> Path:
    return artifacts / "base" / "model_ref.json"


def read_model_ref(artifacts: Path = ARTIFACTS) -> ModelRef:
    from rollscale.lm.models import ModelRef

    path = model_ref_path(artifacts)
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: run the 'base' stage first (dvc repro base)")
    return ModelRef.read(path)


def refresh_duckdb(artifacts: Path = ARTIFACTS) -> None:
    """Rewrite the DuckDB file of views after a stage wrote its tables."""
    write_duckdb(artifacts)


def bucket_problems(artifacts: Path, bucket: str) -> tuple[list[Problem], list[Problem]]:
    """The (train, val) problems of a bucket, from the profile and bucket tables."""
    for stage, name in (("profile", "profile"), ("bucket", "buckets")):
        if not (artifacts / stage / f"{name}.parquet").exists():
            raise FileNotFoundError(f"{artifacts / stage / name}.parquet not found: run the '{stage}' stage first")
    by_id = problems_from_profile(pd.read_parquet(artifacts / "profile" / "profile.parquet"))
    table = pd.read_parquet(artifacts / "bucket" / "buckets.parquet")
    rows = table[table["bucket"] == bucket]
    train = [by_id[i] for i in sorted(rows.loc[rows["split"] == "train", "problem_id"])]
    val = [by_id[i] for i in sorted(rows.loc[rows["split"] == "val", "problem_id"])]
    if not train or not val:
        raise ValueError(f"sweep.bucket {bucket!r} has {len(train)} train and {len(val)} validation problems; "
                         "both must be non-empty (see the bucket stage's counts)")
    return train, val
