"""What decides one GRPO run: :class:`RunConfig`, its id and hash, its allocation rule (science §1, §3, §4)."""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from rollscale.core.allocation import PODS, AllocationRule, DynamicSampling, PilotCommit, Uniform
from rollscale.core.grpo import AGG_MODES, LossConfig, sqrt_scaled_lr
from rollscale.lm.sampling import SamplingConfig
from rollscale.train.step import StepSettings

RULES: tuple[str, ...] = ("uniform", "dynamic", "pods", "pilot")
_RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


@dataclass(kw_only=True)
class RunConfig:
    """Everything that decides one GRPO run (science §1, §3, §4, §5).

    Attributes:
        run_id: a name safe in paths; "" gives :func:`readable_run_id`.
        n: rollouts per prompt (the group size generated).
        b_problem: prompts per step (groups trained on).
        rule: allocation rule, one of "uniform", "dynamic", "pods", "pilot" (science §4).
        m: PODS: rollouts kept per group (2 <= m < n); only for "pods".
        n_pilot: Pilot-Commit: pilot rollouts per pool prompt; only for "pilot".
        pool_factor: Pilot-Commit: pool size / b_problem (default 2.0); only for "pilot".
        max_draws: dynamic sampling: cap on prompts drawn per step (default
            4 * b_problem); only for "dynamic".
        c_max: rollout budget; the run stops once cumulative C >= c_max (science §1).
        seed: seeds the data order and all sampling.
        advantage_scale: "group" (divide by the group std) or "none" (Dr.GRPO) (science §3).
        clip_low, clip_high, agg_mode, kl_coef, entropy_coef, zero_var_filter:
            the loss (:class:`~rollscale.core.grpo.LossConfig`, science §3).
        overlong_filter: mask truncated rollouts out of the loss (still counted in C).
        overlong_penalty_cache: DAPO soft overlong penalty cache length; 0 = off.
        lr_base, b_base: ``lr = lr_base * sqrt(B / b_base)`` with B the rollouts a
            step trains on (science §3; see :attr:`lr`).
        warmup_steps: linear warm-up, then constant (science §3).
        weight_decay: AdamW weight decay.
        grad_clip: max global gradient norm; 0 = no clipping (the norm is still logged).
        sampling: how training rollouts are sampled (temperature > 0, since the
            loss needs the log-probs of the sampling distribution).
        eval_every: evaluate every this many steps (and at step 0 and at the end).
        eval_k: samples per validation problem (science §5).
        eval_temperature: temperature of those samples.
        checkpoint_every: checkpoint every this many steps (and at the end).
        noise_every: measure gradient noise (science §6) every this many steps
            from the per-rollout gradient Gram matrix of the step's batch; 0 = off.
        noise_ema: EMA decay of the B_simple numerator and denominator (science §6.2).
        micro_batch_tokens: padded tokens per micro-batch of the update and of the
            Gram; gradients accumulate, so this bounds memory without changing the step.
        ppo_epochs: optimizer steps per batch, each re-walking the micro-batches (science §3).
        tis_cap: cap of the truncated importance weight on the sampler/trainer
            mismatch (applies when the sampler reports log-probs); 0 = off.
        autocast_bf16: forward passes under bf16 autocast (GPU).
        gradient_checkpointing: recompute activations in backward (GPU memory).
    """

    run_id: str = ""
    n: int
    b_problem: int
    rule: str = "uniform"
    m: int | None = None
    n_pilot: int | None = None
    pool_factor: float | None = None
    max_draws: int | None = None
    c_max: int
    seed: int = 0
    advantage_scale: str = "group"
    clip_low: float = 0.2
    clip_high: float = 0.2
    agg_mode: str = "token-mean"
    kl_coef: float = 0.0
    entropy_coef: float = 0.0
    zero_var_filter: bool = False
    overlong_filter: bool = False
    overlong_penalty_cache: int = 0
    lr_base: float = 1e-4
    b_base: int = 256
    warmup_steps: int = 0
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    eval_every: int = 10
    eval_k: int = 4
    eval_temperature: float = 0.6
    checkpoint_every: int = 10
    noise_every: int = 0
    noise_ema: float = 0.9
    micro_batch_tokens: int = 8192
    ppo_epochs: int = 1
    tis_cap: float = 2.0
    autocast_bf16: bool = False
    gradient_checkpointing: bool = False

    def __post_init__(self) -> None:
        for name, minimum in (("n", 2), ("b_problem", 1), ("c_max", 1), ("seed", 0), ("b_base", 1),
                              ("warmup_steps", 0), ("overlong_penalty_cache", 0), ("eval_every", 1),
                              ("eval_k", 1), ("checkpoint_every", 1), ("noise_every", 0),
                              ("micro_batch_tokens", 1), ("ppo_epochs", 1)):
            value = getattr(self, name)
            if not _is_int(value) or value < minimum:
                raise ValueError(f"RunConfig.{name} must be an int >= {minimum}, got {value!r}")
        if not (_is_number(self.noise_ema) and 0.0 <= self.noise_ema < 1.0):
            raise ValueError(f"RunConfig.noise_ema must be in [0, 1), got {self.noise_ema!r}")
        if self.rule not in RULES:
            raise ValueError(f"RunConfig.rule must be one of {RULES}, got {self.rule!r}")
        for name, rule in (("m", "pods"), ("n_pilot", "pilot"), ("pool_factor", "pilot"), ("max_draws", "dynamic")):
            if getattr(self, name) is not None and self.rule != rule:
                raise ValueError(f"RunConfig.{name} applies only to rule {rule!r}, got it with rule {self.rule!r}")
        if self.rule == "pods" and self.m is None:
            raise ValueError("RunConfig.m (rollouts kept per group) is required for rule 'pods'")
        if self.rule == "pilot" and self.n_pilot is None:
            raise ValueError("RunConfig.n_pilot (pilot rollouts per prompt) is required for rule 'pilot'")
        if self.rule == "pilot" and self.pool_factor is None:
            self.pool_factor = 2.0
        if self.rule == "dynamic" and self.max_draws is None:
            self.max_draws = 4 * self.b_problem
        make_rule(self)  # the rule checks m, n_pilot, pool_factor and max_draws
        if self.advantage_scale not in ("group", "none"):
            raise ValueError(f"RunConfig.advantage_scale must be 'group' or 'none', got {self.advantage_scale!r}")
        if self.agg_mode not in AGG_MODES:
            raise ValueError(f"RunConfig.agg_mode must be one of {AGG_MODES}, got {self.agg_mode!r}")
        for name in ("zero_var_filter", "overlong_filter", "autocast_bf16", "gradient_checkpointing"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"RunConfig.{name} must be a bool, got {getattr(self, name)!r}")
        if not _is_number(self.lr_base) or not (math.isfinite(self.lr_base) and self.lr_base > 0):
            raise ValueError(f"RunConfig.lr_base must be a finite number > 0, got {self.lr_base!r}")
        for name in ("weight_decay", "grad_clip", "eval_temperature"):
            value = getattr(self, name)
            if not _is_number(value) or not (math.isfinite(value) and value >= 0):
                raise ValueError(f"RunConfig.{name} must be a finite number >= 0, got {value!r}")
        if isinstance(self.sampling, dict):
            self.sampling = SamplingConfig(**self.sampling)
        if not isinstance(self.sampling, SamplingConfig):
            raise ValueError(f"RunConfig.sampling must be a SamplingConfig, got {type(self.sampling).__name__}")
        if not self.sampling.temperature > 0:
            raise ValueError(
                f"RunConfig.sampling.temperature must be > 0 for training rollouts "
                f"(the loss needs their log-probs), got {self.sampling.temperature!r}"
            )
        if self.overlong_penalty_cache > self.sampling.max_new_tokens:
            raise ValueError(
                f"RunConfig.overlong_penalty_cache must be <= sampling.max_new_tokens="
                f"{self.sampling.max_new_tokens}, got {self.overlong_penalty_cache!r}"
            )
        try:
            self.loss_config
        except ValueError as err:
            raise ValueError(f"RunConfig: {err}") from None
        if not isinstance(self.run_id, str):
            raise ValueError(f"RunConfig.run_id must be a str, got {type(self.run_id).__name__}")
        if not self.run_id:
            self.run_id = readable_run_id(self)
        if not _RUN_ID_RE.match(self.run_id):
            raise ValueError(f"RunConfig.run_id must be letters, digits, '_', '.', '-' (a path name), got {self.run_id!r}")

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
        return sqrt_scaled_lr(self.lr_base, self.b_problem * self.trained_group_size, self.b_base)

    @property
    def loss_config(self) -> LossConfig:
        return LossConfig(
            clip_low=self.clip_low,
            clip_high=self.clip_high,
            agg_mode=self.agg_mode,
            kl_coef=self.kl_coef,
            entropy_coef=self.entropy_coef,
            zero_var_filter=self.zero_var_filter,
            max_new_tokens=self.sampling.max_new_tokens,
            tis_cap=self.tis_cap,
        )

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "RunConfig":
        return cls(**data)


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
        micro_batch_tokens=config.micro_batch_tokens, ppo_epochs=config.ppo_epochs, grad_clip=config.grad_clip,
        autocast_bf16=config.autocast_bf16,
    )
