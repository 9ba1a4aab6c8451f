"""Shared task settings and small I/O helpers used by every flow."""

from __future__ import annotations

import functools
import logging
from pathlib import Path

from prefect import task
from prefect.cache_policies import INPUTS, TASK_SOURCE

from rollscale.config import StudyParams, load_params
from rollscale.lm.models import ModelRef
from rollscale.pipeline.storage import write_duckdb

log = logging.getLogger("rollscale")

ARTIFACTS = Path("artifacts")
# a task's result is reused when its inputs and its own source code are unchanged
CACHE = INPUTS + TASK_SOURCE


def transient(task_obj, task_run, state) -> bool:
    """Retry only on errors that can pass by themselves (I/O, network), never on bad input."""
    try:
        state.result()
    except (ConnectionError, TimeoutError, OSError) as err:
        return not isinstance(err, (FileNotFoundError, PermissionError, IsADirectoryError))
    except Exception:
        return False
    return False


cached_task = functools.partial(
    task, cache_policy=CACHE, persist_result=True, retries=2, retry_delay_seconds=2, retry_condition_fn=transient
)


def read_params(path: str | Path) -> StudyParams:
    return load_params(path)


def model_ref_path(artifacts: Path = ARTIFACTS) -> Path:
    return artifacts / "base" / "model_ref.json"


def read_model_ref(artifacts: Path = ARTIFACTS) -> ModelRef:
    path = model_ref_path(artifacts)
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: run the 'base' stage first (dvc repro base)")
    return ModelRef.from_json(path.read_text())


def refresh_duckdb(artifacts: Path = ARTIFACTS) -> None:
    """Rewrite the DuckDB file of views after a stage wrote its tables."""
    write_duckdb(artifacts)
