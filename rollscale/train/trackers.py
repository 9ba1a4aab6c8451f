"""The sweep's step and eval rows in the trackers users already read:
TensorBoard event files and a local MLflow file store (science §1, §5 rows).

The DuckDB tables stay the source of truth. This module only copies the rows a
run has *committed* (those :meth:`RunStore.rows` returns: written with a valid
checkpoint) to the trackers, after each checkpoint commit and at the run's
end, so a crash or resume never shows a tracker a row the tables do not have.
A small ``tracked.json`` in the run folder records the last exported step of
each kind (and the MLflow run id), so every row is sent once; a run folder
archived and trained again starts a fresh tracker run.

Layout under the targets' root (``artifacts/trackers`` in the sweep)::

    tensorboard/<run_id>/        event files, tags train/<column>, eval/<column>
    mlruns/                      MLflow file store: experiment "rollscale",
                                 one run per sweep run (params = its config,
                                 metrics = its rows), a "study-report" run with
                                 the report as artifacts

MLflow 3 keeps the file store in maintenance mode and refuses it unless
``MLFLOW_ALLOW_FILE_STORE=true``; the exporter sets that for its own process,
and ``mlflow ui`` needs it too (docs/integrations.md).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import os
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from rollscale.files import write_text_atomic
from rollscale.train.checkpoint import RunStore

__all__ = ["ExportingRunStore", "RunExporter", "TrackerTargets", "flatten_params", "log_report", "tracker_targets"]

logger = logging.getLogger("rollscale.train.trackers")
STATE_FILE = "tracked.json"
_NOT_METRICS = {"step"}


@dataclass(frozen=True)
class TrackerTargets:
    """Where the rows go: a TensorBoard root and/or a local MLflow store."""

    root: Path
    tensorboard: bool = False
    mlflow: bool = False
    experiment: str = "rollscale"

    @property
    def tensorboard_dir(self) -> Path:
        return self.root / "tensorboard"

    @property
    def mlflow_uri(self) -> str:
        return (self.root / "mlruns").resolve().as_uri()


def tracker_targets(tracking: Any, root: str | os.PathLike[str]) -> TrackerTargets | None:
    """Targets of the ``tracking`` params section under ``root``; None when all are off."""
    if not (tracking.tensorboard or tracking.mlflow):
        return None
    for key, on, module in (("tensorboard", tracking.tensorboard, "tensorboard"), ("mlflow", tracking.mlflow, "mlflow")):
        if on and importlib.util.find_spec(module) is None:
            raise ValueError(f"tracking.{key} is on but {module} is not installed: pip install 'rollscale[trackers]'")
    return TrackerTargets(Path(root), tracking.tensorboard, tracking.mlflow, tracking.experiment)


def flatten_params(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested config -> ``{"a.b": "value"}`` (MLflow params are flat strings)."""
    flat: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten_params(value, f"{name}."))
        else:
            flat[name] = json.dumps(value) if isinstance(value, (list, tuple)) else str(value)
    return flat


def _metric_rows(rows: pd.DataFrame, kind: str) -> list[tuple[int, str, float]]:
    """(step, tag, value) of every numeric cell; missing values are left out."""
    tag = "train" if kind == "steps" else "eval"
    numeric = [c for c in rows.columns if c not in _NOT_METRICS and pd.api.types.is_numeric_dtype(rows[c])
               and not pd.api.types.is_bool_dtype(rows[c])]
    out = []
    for step, values in zip(rows["step"].astype(int), rows[numeric].itertuples(index=False), strict=True):
        for col, value in zip(numeric, values, strict=True):
            if value is not None and not (isinstance(value, float) and math.isnan(value)):
                out.append((int(step), f"{tag}/{col}", float(value)))
    return out


class RunExporter:
    """Copies one run's committed rows to the targets (see module docstring)."""

    def __init__(self, targets: TrackerTargets, run_dir: str | os.PathLike[str], run_id: str,
                 config: Mapping[str, Any]) -> None:
        self.targets = targets
        self.run_dir = Path(run_dir)
        self.run_id = run_id
        self.config = dict(config)
        self._client = None

    def _state(self) -> dict[str, Any]:
        path = self.run_dir / STATE_FILE
        return json.loads(path.read_text()) if path.exists() else {}

    def _mlflow(self, state: dict[str, Any]) -> Any:
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow import MlflowClient
        from mlflow.entities import Param

        if self._client is None:
            self._client = MlflowClient(tracking_uri=self.targets.mlflow_uri)
        if "mlflow_run_id" not in state:
            exp = self._client.get_experiment_by_name(self.targets.experiment)
            exp_id = exp.experiment_id if exp else self._client.create_experiment(self.targets.experiment)
            run = self._client.create_run(exp_id, run_name=self.run_id, tags={"rollscale.run_id": self.run_id})
            params = [Param(k, v[:6000]) for k, v in flatten_params(self.config).items()]
            for start in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
                self._client.log_batch(run.info.run_id, params=params[start : start + 100])
            state["mlflow_run_id"] = run.info.run_id
        return self._client

    def _tensorboard_dir(self, state: dict[str, Any]) -> Path:
        log_dir = self.targets.tensorboard_dir / self.run_id
        if not state.get("tensorboard") and log_dir.exists():  # events of an earlier, archived run folder
            dest = self.targets.tensorboard_dir.parent / "tensorboard-archive" / f"{self.run_id}-{time.strftime('%Y%m%d-%H%M%S')}"
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(log_dir), dest)
        state["tensorboard"] = True
        return log_dir

    def export(self, status: str | None = None) -> int:
        """Send the committed rows not sent yet; with ``status`` ("finished" /
        "failed") also close the MLflow run. Returns the number of values sent."""
        store = RunStore(self.run_dir)
        state = self._state()
        points: list[tuple[int, str, float]] = []
        for kind in ("steps", "evals"):
            rows = store.rows(kind)
            if rows.empty:
                continue
            rows = rows[rows["step"] > state.get(kind, -1)]
            if not rows.empty:
                points += _metric_rows(rows, kind)
                state[kind] = int(rows["step"].max())
        if self.targets.tensorboard and points:
            from torch.utils.tensorboard import SummaryWriter

            with SummaryWriter(log_dir=str(self._tensorboard_dir(state))) as writer:
                for step, tag, value in points:
                    writer.add_scalar(tag, value, global_step=step)
        if self.targets.mlflow and (points or status):
            from mlflow.entities import Metric

            client = self._mlflow(state)
            now = int(time.time() * 1000)
            metrics = [Metric(tag, value, now, step) for step, tag, value in points]
            for start in range(0, len(metrics), 1000):  # MLflow's batch limit
                client.log_batch(state["mlflow_run_id"], metrics=metrics[start : start + 1000])
            if status:
                client.set_terminated(state["mlflow_run_id"], "FINISHED" if status == "finished" else "FAILED")
        write_text_atomic(json.dumps(state, sort_keys=True), self.run_dir / STATE_FILE)
        return len(points)


class ExportingRunStore(RunStore):
    """A :class:`RunStore` that exports the rows each checkpoint commits."""

    def __init__(self, root: str | os.PathLike[str], exporter: RunExporter, keep: int = 2) -> None:
        super().__init__(root, keep)
        self.exporter = exporter

    def save(self, *args: Any, **kwargs: Any) -> Any:
        checkpoint = super().save(*args, **kwargs)
        try:
            self.exporter.export()
        except Exception as err:  # a tracker must not stop training; the next commit retries these rows
            logger.warning("%s: tracker export failed (%s: %s); the rows stay in the run store",
                           self.exporter.run_id, type(err).__name__, err)
        return checkpoint


def log_report(targets: TrackerTargets | None, report_dir: str | os.PathLike[str]) -> None:
    """The study report (every file under ``report_dir``) as artifacts of a
    "study-report" MLflow run; nothing when MLflow tracking is off."""
    if targets is None or not targets.mlflow or not Path(report_dir).is_dir():
        return
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=targets.mlflow_uri)
    exp = client.get_experiment_by_name(targets.experiment)
    exp_id = exp.experiment_id if exp else client.create_experiment(targets.experiment)
    run = client.create_run(exp_id, run_name="study-report", tags={"rollscale.kind": "report"})
    client.log_artifacts(run.info.run_id, str(report_dir))
    client.set_terminated(run.info.run_id)
