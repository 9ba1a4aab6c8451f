"""What decides one GRPO run: :class:`RunConfig`, its id and hash, its allocation rule (science §1, §3, §4);
how it ended (:class:`RunResult`) and its row of the ``runs`` table (:func:`run_row`)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import numpy as np
import pandas as pd
from pydantic import ConfigDict, Field, model_validator

from rollscale.config import RunRecordParams, TrainParams
from rollscale.core.fit.schedule import budget_schedule
from rollscale.core.grpo.allocation import AllocationRule, make_rule
from rollscale.core.rollouts import SamplingConfig
from rollscale.core.grpo.shaping import sqrt_scaled_lr

_RUN_ID = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"


class RunConfig(RunRecordParams):
    """Everything that decides one GRPO run (science §1, §3, §4, §5).

    The training settings are ``train``, the validated ``sweep.train`` section of
    params.yaml itself (:class:`~rollscale.config.TrainParams`), with its
    recipe resolved for the run's bucket (:meth:`TrainParams.for_bucket`): a new
    training setting is one field there. What the run records and how often
    (evaluations, checkpoints, the noise measurement) are the fields of
    :class:`~rollscale.config.RunRecordParams`, the sweep's own: their defaults
    are the sweep's (``sweep.eval_every`` and the rest), stated there once.

    Attributes:
        run_id: a name safe in paths; "" gives :func:`readable_run_id`.
        n: rollouts per prompt (the group size generated).
        b_problem: prompts per step (groups trained on).
        rule: allocation rule (science §4), a name of :data:`rollscale.registry.ALLOCATION_RULES`.
        rule_args: the rule's own arguments, e.g. ``{"m": 4}`` for PODS (the fields of its
            class in :mod:`rollscale.core.grpo.rules`); filled in with the rule's defaults.
        c_max: rollout budget; the run stops once cumulative C >= c_max (science §1).
        seed: seeds the data order and all sampling.
        train: the GRPO step's settings (loss, optimizer, micro-batching, science §3).
        sampling: how training rollouts are sampled (temperature > 0, since the
            loss needs the log-probs of the sampling distribution).
        eval_per_doubling, eval_every, eval_k, eval_temperature, checkpoint_every, noise_every, noise_halves:
            :class:`~rollscale.config.RunRecordParams` (evaluations at step 0, on the shared budget
            schedule of science §9.1, :func:`rollscale.core.fit.schedule.budget_schedule`, or every
            ``eval_every`` steps when ``eval_per_doubling`` is 0, and at the end; the noise every
            ``noise_every`` steps from the per-rollout gradient Gram matrix, science §6; 0 = off; every
            step's two random halves of prompts, science §6.4, unless ``noise_halves`` is false).
        noise_ema: EMA decay of the B_simple numerator and denominator (science §6.2).
    """

    model_config = ConfigDict(extra="forbid")

    run_id: Annotated[str, Field(pattern=_RUN_ID)] | Literal[""] = ""
    n: int = Field(ge=2)
    b_problem: int = Field(ge=1)
    rule: str = "uniform"
    rule_args: dict[str, Any] = Field(default_factory=dict)
    c_max: int = Field(ge=1)
    seed: int = Field(0, ge=0)
    train: TrainParams = Field(default_factory=TrainParams)
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    noise_ema: float = Field(0.9, ge=0, lt=1)

    @model_validator(mode="after")
    def _consistent(self) -> "RunConfig":
        clash = sorted(set(self.rule_args) & set(type(self).model_fields))
        if clash:  # the config hash puts rule arguments beside the other fields
            raise ValueError(f"rule_args: {clash[0]!r} is a RunConfig field; a rule argument needs another name")
        rule = self.allocation_rule()  # the rule checks its arguments
        self.rule_args = rule.run_args()  # its defaults filled in: they are part of the run
        if self.noise_every and not rule.equal_groups:
            raise ValueError(f"noise_every: the gradient-noise measurement needs groups of equal size; "
                             f"rule {self.rule!r} trains groups of different sizes (set noise_every: 0)")
        if not self.sampling.temperature > 0:
            raise ValueError(f"sampling.temperature must be > 0 for training rollouts "
                             f"(the loss needs their log-probs), got {self.sampling.temperature!r}")
        if self.train.overlong_penalty_cache > self.sampling.max_new_tokens:
            raise ValueError(f"train.overlong_penalty_cache must be <= sampling.max_new_tokens="
                             f"{self.sampling.max_new_tokens}, got {self.train.overlong_penalty_cache!r}")
        if not self.run_id:
            self.run_id = readable_run_id(self)
        return self

    def allocation_rule(self) -> AllocationRule:
        """A new instance of the run's allocation rule (science §4; rules may keep state across steps)."""
        return make_rule(self.rule, self.b_problem, self.n, self.rule_args)

    @property
    def trained_group_size(self) -> int:
        """Rollouts per trained group: m for PODS, n for most rules (the rule says)."""
        return self.allocation_rule().trained_group_size

    @property
    def nominal_steps(self) -> int:
        """Nominal number of optimizer steps ``M = c_max // (b_problem * n)`` (science §1)."""
        return self.c_max // (self.b_problem * self.n)

    @property
    def lr(self) -> float:
        """Peak learning rate ``lr_base * sqrt(B / b_base)`` (science §3).

        B is the number of rollouts a step trains on (the rule's ``trained_per_step``):
        ``b_problem * m`` for PODS and ``b_problem * n`` (science §1's B) for most rules,
        the batch the gradient averages over.
        """
        return sqrt_scaled_lr(self.train.lr_base, self.allocation_rule().trained_per_step, self.train.b_base)

    @property
    def eval_schedule(self) -> np.ndarray | None:
        """The budgets the run is evaluated at (science §9.1), or None for every ``eval_every`` steps."""
        return budget_schedule(self.c_max, self.eval_per_doubling) if self.eval_per_doubling else None

    def to_dict(self) -> dict:
        return self.model_dump(mode="json")

    @classmethod
    def from_dict(cls, data: dict) -> "RunConfig":
        return cls.model_validate(data)


def readable_run_id(config: RunConfig) -> str:
    """A run name from the allocation shape and seed, e.g. ``np32_nr8_uniform_s0``.

    ``np`` = b_problem, ``nr`` = n, the rule's name and what the rule says of its
    arguments (``_m4`` for PODS, ``_p2_pf2`` for Pilot-Commit, ``_d128`` for dynamic
    sampling: :meth:`~rollscale.core.grpo.allocation.AllocationRule.run_id_parts`).
    Other settings (lr, loss) are not in it: runs that differ only there need
    an explicit ``run_id``.
    """
    rule = config.allocation_rule()
    return "_".join([f"np{config.b_problem}", f"nr{config.n}", config.rule, *rule.run_id_parts(), f"s{config.seed}"])


# The layout config hashes were computed over before rules and losses were registries.
# The sweep resumes a stored run by its hash, so the layout stays: a rule's
# arguments at the top level beside the four arguments of the first rules (None when
# unused), and a setting added since hashed only when it is not its default (the value
# every older run had implicitly). Fixed: a new rule or setting adds nothing here.
_FIRST_RULE_ARGS = ("m", "n_pilot", "pool_factor", "max_draws")
_TRAIN_SINCE_HASHING = {"policy_loss": "clip"}
_SINCE_HASHING = {"eval_per_doubling": 0}


def data_hash(train_problems: Sequence[Any]) -> str:
    """sha256 (16 hex chars) of the training problems' ids in order: a resumed run must match it."""
    return hashlib.sha256("\n".join(p.problem_id for p in train_problems).encode()).hexdigest()[:16]


def config_hash(config: RunConfig) -> str:
    """sha256 (16 hex chars) of the config's canonical JSON: a resumed run must match it."""
    data = config.to_dict()
    data.update(dict.fromkeys(_FIRST_RULE_ARGS), **data.pop("rule_args"))
    for key, default in _TRAIN_SINCE_HASHING.items():
        if data["train"].get(key) == default:
            del data["train"][key]
    for key, default in _SINCE_HASHING.items():
        if data.get(key) == default:
            del data[key]
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class RunResult:
    """How :meth:`GRPOTrainer.run` ended: "finished", "failed" (with ``error``) or "paused" (at a budget)."""

    run_id: str
    status: str
    error: str | None
    steps: int
    c: int
    c_tokens: int


# why a run ended (the runs table's end_reason): a stopped run is a finished run with a shorter C (science §9.4)
END_REASONS = {"finished": "budget reached", "paused": "paused at a search rung", "failed": "failed"}


def run_row(config: RunConfig, bucket: str, status: str, result: RunResult | None = None, error: str | None = None,
            stop: dict | None = None) -> pd.DataFrame:
    """The run's row of the ``runs`` table; ``stop`` (rung, rule, c) for a run the search stopped."""
    reason = (f"stopped at rung {stop['rung']} by rule {stop['rule']}" if status == "stopped" and stop
              else END_REASONS.get(status))
    row = pd.DataFrame([{
        "run_id": config.run_id, "bucket": bucket, "n": config.n, "b_problem": config.b_problem,
        "m": config.trained_group_size, "rule": config.rule, "seed": config.seed, "c_max": config.c_max,
        "lr": config.lr, "kl_coef": config.train.kl_coef, "entropy_coef": config.train.entropy_coef,
        "status": status, "steps": result.steps if result else 0, "c": result.c if result else 0,
        "c_tokens": result.c_tokens if result else 0, "error": error or (result.error if result else None),
        "end_reason": reason, "stop_rung": stop["rung"] if stop else None, "stop_rule": stop["rule"] if stop else None,
    }])
    # typed even when empty, so every run's file has the same schema in DuckDB
    return row.astype({"end_reason": "string", "stop_rung": "Int64", "stop_rule": "string", "error": "string"})
