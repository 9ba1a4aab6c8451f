"""A production run's logs, read whole at each tick as they grow: TensorBoard event files (TRL's default,
``report_to: tensorboard``), an MLflow run (TRL's ``report_to: mlflow``, verl's ``trainer.logger: mlflow``)
or verl's JSONL file logger (``trainer.logger: file``).

verl's ``FileLogger`` (verl/utils/tracking.py, verl 0.9) writes one JSON object a line,
``{"step": <global step>, "data": {<metric>: <value>, ...}}``, to ``VERL_FILE_LOGGER_PATH`` (default
``$VERL_FILE_LOGGER_ROOT/<project>/<experiment>.jsonl``), opening it with "w": a run resumed from a
checkpoint starts the file again from that step. A line without ``data`` is read with its metric keys
beside ``step``. Every reader keeps the points in the order they were written (``order``), so a step
written twice (a resumed run) is seen as such by :mod:`.points`.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

__all__ = ["LOG_FORMATS", "LogsNotYet", "RunLog", "logged_n", "read_log", "reward_series"]

POINT_COLUMNS = ["metric", "step", "value", "order"]
# where each framework's log keeps n (TRL's args; verl's config as MLflow params, "/"-flattened)
_N_KEYS = ("num_generations", "actor_rollout_ref/rollout/n", "actor_rollout_ref.rollout.n")


class LogsNotYet(FileNotFoundError):
    """The run has not written its logs yet (the folder, file or MLflow run is not there): a tick waits."""


@dataclass(frozen=True)
class RunLog:
    """What a run's logs hold now: ``points`` (metric, step, value, order: the write order) and ``settings``
    (the run's own settings where the log keeps them: TRL's ``args``, an MLflow run's params)."""

    source: str
    points: pd.DataFrame
    settings: dict[str, object] = field(default_factory=dict)


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(float(value)) else None


def _tensorboard(logs: str) -> RunLog:
    """Every event file below ``logs`` (TRL writes them to <output_dir>/runs/<date>_<host>/; a resumed run
    adds a folder or a file), read with TensorBoard's own EventAccumulator, points in wall-time order."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    root = Path(logs)
    if not root.exists():
        raise LogsNotYet(f"{logs} does not exist yet")
    folders = sorted({f.parent for f in root.rglob("events.out.tfevents.*")} |
                     ({root} if root.is_file() else set()))
    if not folders:
        raise LogsNotYet(f"{logs} has no TensorBoard event files yet")
    for file in sorted(f for folder in folders for f in ([folder] if folder.is_file()
                                                         else folder.glob("events.out.tfevents.*"))):
        if why := _event_file_damage(file):
            raise ValueError(f"{file}: damaged, not a TensorBoard event file ({why}); point --logs at the run's own "
                             "logs, or move that file away")
    rows, settings = [], {}
    for folder in folders:
        # purge_orphaned_data off: a step written again (a resumed run) stays visible, in the order written
        acc = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0}, purge_orphaned_data=False)
        acc.Reload()
        tags = acc.Tags()
        for tag in tags.get("scalars", []):
            rows += [(tag, e.step, float(e.value), e.wall_time) for e in acc.Scalars(tag)]
        for tag in tags.get("tensors", []):
            for e in acc.Tensors(tag):
                value = tensor_util.make_ndarray(e.tensor_proto)
                if tag == "args/text_summary":  # transformers' TensorBoardCallback: the TrainingArguments as JSON
                    settings = json.loads(value.reshape(-1)[0].decode())
                elif value.size == 1 and value.dtype.kind in "fiu":  # scalars written as tensors (tf.summary)
                    rows.append((tag, e.step, float(value.reshape(-1)[0]), e.wall_time))
    points = pd.DataFrame(rows, columns=POINT_COLUMNS).sort_values("order", kind="stable")
    return RunLog(logs, points.assign(order=range(len(points))).reset_index(drop=True), settings)


def _event_file_damage(file: Path) -> str | None:
    """Why ``file`` is no event file a writer made (a record whose checksum fails), or None; a last record
    still being written (truncated) is not damage. TensorBoard's own reader stops there without a word, so a
    damaged file would read as a run that has logged nothing yet."""
    from tensorboard.compat.tensorflow_stub import errors
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import PyRecordReader_New

    reader = PyRecordReader_New(str(file))
    records = 0
    while True:
        try:
            reader.GetNext()
        except errors.OutOfRangeError:
            return None
        except errors.DataLossError as err:
            return None if "truncated" in str(err) else f"record {records + 1}: {str(err).split(' ', 1)[-1]}"
        records += 1


def _mlflow(logs: str) -> RunLog:
    """An MLflow run: ``URI#RUN_ID``, or the newest run of a tracking URI or folder (a local store)."""
    from mlflow import MlflowClient

    where, _, run_id = logs.partition("#")
    if "://" not in where and not where.startswith(("sqlite:", "databricks")):
        if not Path(where).exists():
            raise LogsNotYet(f"{where} does not exist yet")
        where = Path(where).resolve().as_uri()
        # MLflow 3 reads a folder store only when asked (as rollscale.train.trackers does for its own)
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=where)
    if not run_id:
        experiments = [e.experiment_id for e in client.search_experiments()]
        runs = client.search_runs(experiments, order_by=["attributes.start_time DESC"], max_results=1) \
            if experiments else []
        if not runs:
            raise LogsNotYet(f"{logs} has no MLflow run yet")
        run_id = runs[0].info.run_id
    run = client.get_run(run_id)
    rows = []
    for key in run.data.metrics:
        rows += [(key, m.step, float(m.value), m.timestamp) for m in client.get_metric_history(run_id, key)]
    points = pd.DataFrame(rows, columns=POINT_COLUMNS).sort_values("order", kind="stable")
    return RunLog(f"{where}#{run_id}", points.assign(order=range(len(points))).reset_index(drop=True),
                  dict(run.data.params))


def _verl_jsonl(logs: str) -> RunLog:
    """verl's file logger (module docstring); a last line still being written is left for the next tick."""
    path = Path(logs)
    if not path.is_file():
        raise LogsNotYet(f"{logs} does not exist yet" if not path.exists() else f"{logs} is not a file")
    lines = path.read_text(errors="replace").split("\n")
    rows = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            if i == len(lines) - 1:  # no newline yet: verl is writing it
                break
            raise ValueError(f"{logs}:{i + 1}: not a JSON object (verl's file logger writes one a line)") from None
        if not isinstance(record, dict) or _number(record.get("step")) is None:
            raise ValueError(f"{logs}:{i + 1}: expected a JSON object with a numeric \"step\" (verl's file logger)")
        data = record["data"] if isinstance(record.get("data"), dict) else record
        rows += [(k, int(record["step"]), v, len(rows)) for k, value in data.items()
                 if k != "step" and (v := _number(value)) is not None]
    return RunLog(logs, pd.DataFrame(rows, columns=POINT_COLUMNS))


LOG_FORMATS: dict[str, Callable[[str], RunLog]] = {
    "tensorboard": _tensorboard, "mlflow": _mlflow, "verl-jsonl": _verl_jsonl,
}


def read_log(logs: str, fmt: str) -> RunLog:
    """The run's logs now (:class:`LogsNotYet` while it has written none: no folder or file yet, or one opened
    and empty, as a run that has not logged its first step leaves it)."""
    if fmt not in LOG_FORMATS:
        raise ValueError(f"--format {fmt}: expected one of {', '.join(LOG_FORMATS)}")
    log = LOG_FORMATS[fmt](logs)
    if log.points.empty:
        raise LogsNotYet(f"{log.source} has no metric yet")
    return log


def reward_series(log: RunLog, metrics: list[str]) -> tuple[str, pd.DataFrame]:
    """(the metric, its points ``step, value, order``): the first of ``metrics`` the log has; a one-line
    LookupError naming the metrics it has otherwise."""
    have = sorted(set(log.points["metric"]))
    if not have:
        raise LogsNotYet(f"{log.source} has no metric yet")
    name = next((m for m in metrics if m in have), None)
    if name is None:
        shown = ", ".join(have[:30]) + (f" (+{len(have) - 30} more)" if len(have) > 30 else "")
        raise LookupError(f"{log.source}: no metric {' or '.join(metrics)} in the log; it has: {shown or 'none yet'} "
                          "(name one with --metric)")
    rows = log.points[log.points["metric"] == name]
    return name, rows[["step", "value", "order"]].astype({"step": int}).reset_index(drop=True)


def logged_n(settings: dict[str, object]) -> int | None:
    """Rollouts per prompt as the run's log states it (TRL's num_generations; verl's rollout.n), or None."""
    for key in _N_KEYS:
        if key in settings:
            try:
                return int(float(str(settings[key])))
            except ValueError:
                return None
    return None
