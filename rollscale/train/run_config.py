"""What decides one GRPO run: :class:`RunConfig`, its id and hash, its allocation rule (science §1, §3, §4)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rollscale.config import TrainParams
from rollscale.core.allocation import PODS, AllocationRule, DynamicSampling, PilotCommit, Uniform
from rollscale.core.grpo import LossConfig, sqrt_scaled_lr
from rollscale.core.rollouts import SamplingConfig
from rollscale.train.step import StepSettings

RULES: tuple[str, ...] = ("uniform", "dynamic", "pods", "pilot")
_RUN_ID = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
_CLIP_HIGHER = 0.28  # DAPO's eps_high (science §3)


class RunConfig(BaseModel):
    """Everything that decides one GRPO run (science §1, §3, §4, §5).

    The training settings are ``train``, the validated ``sweep.train`` section of
    params.yaml itself (:class:`~rollscale.config.TrainParams`), with its
    recipe resolved for the run's bucket (:meth:`TrainParams.for_bucket`): a new
    training setting is one field there.

    Attributes:
        run_id: a name safe in paths; "" gives :func:`readable_run_id`.
        n: rollouts per prompt (the group size generated).
        b_problem: prompts per step (groups trained on).
        rule: allocation rule (science §4).
        m: PODS: rollouts kept per group (2 <= m < n); only for "pods".
        n_pilot: Pilot-Commit: pilot rollouts per pool prompt; only for "pilot".
        pool_factor: Pilot-Commit: pool size / b_problem (default 2.0); only for "pilot".
        max_draws: dynamic sampling: cap on prompts drawn per step (default
            4 * b_problem); only for "dynamic".
        c_max: rollout budget; the run stops once cumulative C >= c_max (science §1).
        seed: seeds the data order and all sampling.
        train: the GRPO step's settings (loss, optimizer, micro-batching, science §3).
        sampling: how training rollouts are sampled (temperature > 0, since the
            loss needs the log-probs of the sampling distribution).
        eval_every: evaluate every this many steps (and at step 0 and at the end).
        eval_k: samples per validation problem (science §5).
        eval_temperature: temperature of those samples.
        checkpoint_every: checkpoint every this many steps (and at the end).
        noise_every: measure gradient noise (science §6) every this many steps
            from the per-rollout gradient Gram matrix of the step's batch; 0 = off.
        noise_ema: EMA decay of the B_simple numerator and denominator (science §6.2).
    """

    model_config = ConfigDict(extra="forbid")

    run_id: Annotated[str, Field(pattern=_RUN_ID)] | Literal[""] = ""
    n: int = Field(ge=2)
    b_problem: int = Field(ge=1)
    rule: Literal["uniform", "dynamic", "pods", "pilot"] = "uniform"
    m: int | None = None
    n_pilot: int | None = None
    pool_factor: float | None = None
    max_draws: int | None = None
    c_max: int = Field(ge=1)
    seed: int = Field(0, ge=0)
    train: TrainParams = Field(default_factory=TrainParams)
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    eval_every: int = Field(10, ge=1)
    eval_k: int = Field(4, ge=1)
    eval_temperature: float = Field(0.6, ge=0)
    checkpoint_every: int = Field(10, ge=1)
    noise_every: int = Field(0, ge=0)
    noise_ema: float = Field(0.9, ge=0, lt=1)

    @model_validator(mode="after")
    def _consistent(self) -> "RunConfig":
        for name, rule in (("m", "pods"), ("n_pilot", "pilot"), ("pool_factor", "pilot"), ("max_draws", "dynamic")):
            if getattr(self, name) is not None and self.rule != rule:
                raise ValueError(f"{name} applies only to rule {rule!r}, got it with rule {self.rule!r}")
        if self.rule == "pods" and self.m is None:
            raise ValueError("m (rollouts kept per group) is required for rule 'pods'")
        if self.rule == "pilot" and self.n_pilot is None:
            raise ValueError("n_pilot (pilot rollouts per prompt) is required for rule 'pilot'")
        if self.rule == "pilot" and self.pool_factor is None:
            self.pool_factor = 2.0
        if self.rule == "dynamic" and self.max_draws is None:
            self.max_draws = 4 * self.b_problem
        make_rule(self)  # the rule checks m, n_pilot, pool_factor and max_draws
        if not self.sampling.temperature > 0:
            raise ValueError(f"sampling.temperature must be > 0 for training rollouts "
                             f"(the loss needs their log-probs), got {self.sampling.temperature!r}")
        if self.train.overlong_penalty_cache > self.sampling.max_new_tokens:
            raise ValueError(f"train.overlong_penalty_cache must be <= sampling.max_new_tokens="
                             f"{self.sampling.max_new_tokens}, got {self.train.overlong_penalty_cache!r}")
        if not self.run_id:
            self.run_id = readable_run_id(self)
        return self

    @property
    def trained_group_size(self) -> int:
        """Rollouts per trained group: m for PODS, n otherwise."""
        return self.m if self.rule == "pods" else self.n

    @property
    def nominal_steps(self) -> int:
        """Nominal number of optimizer steps ``M = c_max // (b_problem * n)`` (science §1)."""
        return self.c_max // (self.b_problem * self.n)

    @property
    def lr(self) -> float:
        """Peak learning rate ``lr_base * sqrt(B / b_base)`` (science §3).

        B is the number of rollouts a step trains on, ``b_problem * m`` for PODS
        and ``b_problem * n`` (science §1's B) otherwise: the batch the gradient
        averages over.
        """
        return sqrt_scaled_lr(self.train.lr_base, self.b_problem * self.trained_group_size, self.train.b_base)

    @property
    def loss_config(self) -> LossConfig:
        """The loss settings of :func:`~rollscale.core.grpo.grpo_loss`, made from ``train``."""
        t = self.train
        return LossConfig(
            clip_high=_CLIP_HIGHER if t.clip_higher else LossConfig.clip_high,
            agg_mode=t.agg_mode,
            kl_coef=t.kl_coef,
            entropy_coef=t.entropy_coef,
            zero_var_filter=t.zero_var_filter,
            max_new_tokens=self.sampling.max_new_tokens,
            tis_cap=t.tis_cap,
        )

    def to_dict(self) -> dict:
        return self.model_dump(mode="json")

    @classmethod
    def from_dict(cls, data: dict) -> "RunConfig":
        return cls.model_validate(data)


def readable_run_id(config: RunConfig) -> str:
    """A run name from the allocation shape and seed, e.g. ``np32_nr8_uniform_s0``.

    ``np`` = b_problem, ``nr`` = n; then ``_m4`` for PODS, ``_p2_pf2`` (n_pilot,
    pool_factor) for Pilot-Commit, ``_d128`` (max_draws) for dynamic sampling.
    Other settings (lr, loss) are not in it: runs that differ only there need
    an explicit ``run_id``.
    """
    parts = [f"np{config.b_problem}", f"nr{config.n}", config.rule]
    if config.rule == "pods":
        parts.append(f"m{config.m}")
    elif config.rule == "pilot":
        parts += [f"p{config.n_pilot}", f"pf{config.pool_factor:g}"]
    elif config.rule == "dynamic":
        parts.append(f"d{config.max_draws}")
    parts.append(f"s{config.seed}")
    return "_".join(parts)


def config_hash(config: RunConfig) -> str:
    """sha256 (16 hex chars) of the config's canonical JSON: a resumed run must match it."""
    return hashlib.sha256(json.dumps(config.to_dict(), sort_keys=True).encode()).hexdigest()[:16]


def make_rule(config: RunConfig) -> AllocationRule:
    """The allocation rule a config names (science §4)."""
    if config.rule == "uniform":
        return Uniform(config.b_problem, config.n)
    if config.rule == "dynamic":
        return DynamicSampling(config.b_problem, config.n, max_draws=config.max_draws)
    if config.rule == "pods":
        return PODS(config.b_problem, config.n, m=config.m)
    if config.rule == "pilot":
        return PilotCommit(config.b_problem, config.n, n_pilot=config.n_pilot, pool_factor=config.pool_factor)
    raise ValueError(f"rule must be one of {RULES}, got {config.rule!r}")


@dataclass
class RunResult:
    """How :meth:`GRPOTrainer.run` ended: status "finished" or "failed" (with ``error``)."""

    run_id: str
    status: str
    error: str | None
    steps: int
    c: int
    c_tokens: int


def step_settings(config: RunConfig) -> StepSettings:
    """The update's settings (:func:`~rollscale.train.step.policy_update`) of a run."""
    return StepSettings(
        loss=config.loss_config, temperature=config.sampling.temperature,
        micro_batch_tokens=config.train.micro_batch_tokens, ppo_epochs=config.train.ppo_epochs,
        grad_clip=config.train.grad_clip, autocast_bf16=config.train.autocast_bf16,
    )
