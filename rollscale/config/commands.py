"""The ``params.yaml`` sections of the user's commands that no stage reads: ``query`` (``rollscale sql``) and
``track`` (``rollscale track``). Like the stage sections (:mod:`rollscale.config.sections`) each derives from
:class:`~rollscale.config.sections.Section`; :mod:`rollscale.config` assembles them into the one tree and
re-exports them."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rollscale.config.checks import CronSchedule, DeploymentName
from rollscale.config.sections import Section

__all__ = ["TRACK_METRICS", "QueryParams", "TrackParams"]


class QueryParams(Section):
    """``rollscale sql`` and :func:`rollscale.pipeline.query.storage.query` (no stage reads it)."""

    # a query still running after this many seconds is stopped (`rollscale sql --timeout` overrides it)
    timeout_s: float = Field(60.0, gt=0)
    # memory `rollscale sql` may take beyond what it holds when the query starts (its result included: DuckDB's own
    # memory_limit does not count a result's strings; one query of 40 strings of 100 MB took 4.3 GB)
    memory_gb: float = Field(4.0, gt=0)


# the reward a production run logs, by the names its framework gives it: TRL's TensorBoard (eval/reward when it
# evaluates, else the batch's train/reward), TRL's MLflow (eval_reward, reward), verl (the batch's mean score)
TRACK_METRICS = ["eval/reward", "train/reward", "eval_reward", "reward", "critic/score/mean"]


class TrackParams(Section):
    """``rollscale track``: a production run's logs read as they grow, its reward against the study's forecast
    (docs/integrations.md). Each field is also a flag of the command, which overrides it."""

    # the run's logs: TRL's output or logging folder (TensorBoard event files, found below it), an MLflow tracking
    # folder or URI (URI#RUN_ID names a run; default its newest), or verl's JSONL file (VERL_FILE_LOGGER_PATH)
    logs: str | None = None
    format: Literal["tensorboard", "mlflow", "verl-jsonl"] = "tensorboard"
    # the reward: the first of these names the log has (verl's validation is val-core/<data source>/...: name it)
    metrics: list[str] = Field(default_factory=lambda: list(TRACK_METRICS), min_length=1)
    # K: the run has left the study's band when its reward is below the lower bound at K evaluations in a row
    patience: int = Field(3, ge=1)
    # the served deployment (--serve) ticks every this many seconds, or on ``cron`` when it is set
    every: int = Field(60, ge=1)
    cron: CronSchedule = None
    deployment: DeploymentName = "rollscale-track"
    # the decision's key the run was exported from (rollscale export --key / --rule); null = the leader
    key: int | None = None
    rule: str | None = None
