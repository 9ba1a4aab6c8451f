"""The GRPO training loop: exact compute accounting, evaluation, checkpoint and
resume (science §1, §3, §4, §5).

One step (:meth:`GRPOTrainer.train_step`) reads top to bottom:
generate -> score -> allocate -> advantages -> loss -> update -> log.
The allocation rule (science §4) drives generation through two callbacks,
``next_prompts(k)`` (the run's data order) and ``sample_fn(problems, n)``
(sample and score), so every rollout it generates is counted in ``C``
(science §1). :meth:`GRPOTrainer.run` adds the outer loop: evaluation at step 0,
every ``eval_every`` steps and at the end (science §5), checkpoints every
``checkpoint_every`` steps into a :class:`~rollscale.train.checkpoint.RunStore`, and
resuming from its newest valid checkpoint.

Repeatability: the data order is a permutation seeded by ``(seed, epoch)`` and
each ``sample_fn`` call is seeded by ``(seed, step, call)``, so a resumed run
samples exactly what the uninterrupted run would have (bit-identical on CPU).
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import math
import random
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from rollscale.core.allocation import PODS, AllocationRule, DynamicSampling, PilotCommit, Uniform, allocate
from rollscale.train.checkpoint import Checkpoint, RunStore
from rollscale.core.grpo import (
    AGG_MODES,
    LossConfig,
    group_advantages,
    grpo_loss,
    nonzero_variance_mask,
    overlong_filter_mask,
    overlong_penalty,
    sqrt_scaled_lr,
    token_logprobs_and_entropy,
    warmup_factor,
)
from rollscale.core.gram import gram_matrix
from rollscale.core.metrics import avg_at_k, best_at_k, standard_error, worst_at_k
from rollscale.core.noise import EmaNoiseScale, decompose, k_sat, k_sat_null, split_half_rho
from rollscale.lm.models import render_prompt
from rollscale.core.problems import Problem
from rollscale.core.rewards import reward_fn
from rollscale.lm.sampling import HFSampler, Rollout, SamplingConfig

RULES: tuple[str, ...] = ("uniform", "dynamic", "pods", "pilot")
_RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
# Purposes that keep the seed streams of data order, training and evaluation apart.
_DATA, _TRAIN, _EVAL, _NOISE = 0, 1, 2, 3

RewardFn = Callable[[str, str], float]


class NonFiniteLossError(RuntimeError):
    """The loss or gradient norm of a step was NaN or infinite; the update was not applied."""


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

    def __post_init__(self) -> None:
        for name, minimum in (("n", 2), ("b_problem", 1), ("c_max", 1), ("seed", 0), ("b_base", 1),
                              ("warmup_steps", 0), ("overlong_penalty_cache", 0), ("eval_every", 1),
                              ("eval_k", 1), ("checkpoint_every", 1), ("noise_every", 0)):
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
        for name in ("zero_var_filter", "overlong_filter"):
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


def _rng_state() -> dict:
    py_version, py_keys, py_gauss = random.getstate()
    np_state = np.random.get_state()
    state = {
        "python": [py_version, list(py_keys), py_gauss],
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
        "torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode(),
    }
    if torch.cuda.is_available():
        state["cuda"] = [base64.b64encode(s.numpy().tobytes()).decode() for s in torch.cuda.get_rng_state_all()]
    return state


def _set_rng_state(state: dict) -> None:
    py_version, py_keys, py_gauss = state["python"]
    random.setstate((py_version, tuple(py_keys), py_gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))

    def as_tensor(text: str) -> torch.Tensor:
        return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)

    torch.set_rng_state(as_tensor(state["torch"]))
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all([as_tensor(s) for s in state["cuda"]])


def _nanmean(values: Sequence[float]) -> float:
    return float(np.mean(values)) if len(values) else float("nan")


class GRPOTrainer:
    """GRPO on a Hugging Face causal LM with an allocation rule (science §1, §3, §4, §5).

    Args:
        model: the policy, with its initial (base) weights, also when resuming:
            the KL reference is these weights, and a checkpoint replaces only
            the trainable parameters. With ``lora=True`` a peft model whose
            adapters are the only trainable parameters.
        tokenizer: its tokenizer (needs a pad token).
        train_problems: the training set; D = its size.
        val_problems: the validation set (evaluation, science §5).
        config: the run's :class:`RunConfig`.
        reward: the verifier ``(completion, gold) -> 0.0 | 1.0``; None uses each
            problem's own (``reward_fn(problem.reward)``).
        use_chat_template: render prompts with the tokenizer's chat template when it has one.
        lora: the model is a peft LoRA model: only adapters train, the KL
            reference is the model with adapters disabled (no second copy).
        sample_batch_size: rollouts per ``generate`` call.

    For full-parameter training with ``kl_coef > 0`` a frozen copy of the
    initial model is the KL reference.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        train_problems: Sequence[Problem],
        val_problems: Sequence[Problem],
        config: RunConfig,
        reward: RewardFn | None = None,
        use_chat_template: bool = True,
        lora: bool = False,
        sample_batch_size: int = 512,
    ) -> None:
        if not isinstance(config, RunConfig):
            raise ValueError(f"config must be a RunConfig, got {type(config).__name__}")
        for name, problems in (("train_problems", train_problems), ("val_problems", val_problems)):
            if not problems or not all(isinstance(p, Problem) for p in problems):
                raise ValueError(f"{name} must be a non-empty sequence of Problem")
        if tokenizer.pad_token_id is None:
            raise ValueError("tokenizer needs a pad token (set tokenizer.pad_token, e.g. to its EOS token)")
        is_peft = hasattr(model, "disable_adapter") and hasattr(model, "peft_config")
        if lora and not is_peft:
            raise ValueError("lora=True needs a peft model (see rollscale.lm.models.add_lora)")
        if is_peft and not lora:
            raise ValueError("model is a peft model: pass lora=True so only adapters are trained and saved")
        self.model, self.tokenizer, self.config, self.lora = model, tokenizer, config, lora
        self.train_problems, self.val_problems = list(train_problems), list(val_problems)
        self.device = next(model.parameters()).device
        self.sampler = HFSampler(model, tokenizer, batch_size=sample_batch_size)
        self.rule = make_rule(config)
        self.loss_cfg = config.loss_config
        self.config_hash = config_hash(config)
        self.data_hash = hashlib.sha256("\n".join(p.problem_id for p in self.train_problems).encode()).hexdigest()[:16]
        self._reward = reward
        self.trainable = {name: p for name, p in model.named_parameters() if p.requires_grad}
        if not self.trainable:
            raise ValueError("model has no trainable parameters (requires_grad)")
        # The KL reference (science §3) is the initial policy; LoRA gets it by disabling adapters.
        self.ref_model = None
        if config.kl_coef > 0 and not lora:
            self.ref_model = copy.deepcopy(model).eval().requires_grad_(False)
        self.optimizer = torch.optim.AdamW(self.trainable.values(), lr=config.lr, weight_decay=config.weight_decay)
        self._train_prompts = [render_prompt(tokenizer, p.prompt, use_chat_template) for p in self.train_problems]
        self._val_prompts = [render_prompt(tokenizer, p.prompt, use_chat_template) for p in self.val_problems]
        self._prompt_ids: dict[str, list[int]] = {}
        self._perm_epoch, self._perm = -1, np.empty(0, dtype=np.int64)
        # Run progress: everything a checkpoint must hold besides weights and optimizer.
        self.step = 0
        self.c = 0
        self.c_tokens = 0
        self.prompts_drawn = 0
        self.last_eval_step = -1
        # gradient noise (science §6), measured every noise_every steps
        self.noise_ema = EmaNoiseScale(config.noise_ema)
        self.last_noise_prompts: list[dict] = []

    # ------------------------------------------------------------------ data order and seeds

    def _seed(self, purpose: int, step: int, call: int) -> int:
        return int(np.random.SeedSequence([self.config.seed, purpose, step, call]).generate_state(1)[0])

    def data_order(self, position: int, k: int) -> list[int]:
        """Train-problem indices at positions ``position .. position + k - 1`` of the
        run's data order: a permutation of the D problems seeded by (seed, epoch),
        reshuffled every epoch."""
        d = len(self.train_problems)
        out = []
        for pos in range(position, position + k):
            epoch, i = divmod(pos, d)
            if epoch != self._perm_epoch:
                rng = np.random.default_rng(np.random.SeedSequence([self.config.seed, _DATA, epoch]))
                self._perm_epoch, self._perm = epoch, rng.permutation(d)
            out.append(int(self._perm[i]))
        return out

    @property
    def epochs(self) -> float:
        """Prompts drawn for training so far / D (science §1). Drawn, not trained:
        pilot-pool prompts and groups dropped by dynamic sampling count."""
        return self.prompts_drawn / len(self.train_problems)

    # ------------------------------------------------------------------ pieces of a step

    def _score(self, problem: Problem, completion: str) -> float:
        verify = self._reward if self._reward is not None else reward_fn(problem.reward)
        value = float(verify(completion, problem.answer))
        if value not in (0.0, 1.0):
            raise ValueError(f"reward must be 0 or 1 (science §2), got {value!r} for problem {problem.problem_id}")
        return value

    def _ids(self, text: str) -> list[int]:
        if text not in self._prompt_ids:
            self._prompt_ids[text] = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return self._prompt_ids[text]

    def _batch(self, prompts: Sequence[str], rollouts: Sequence[Rollout]):
        """Left-padded prompts followed by right-padded completions, as
        :func:`~rollscale.core.grpo.token_logprobs_and_entropy` expects."""
        prompt_ids = [self._ids(p) for p in prompts]
        width_p = max(map(len, prompt_ids))
        width_c = max(max(len(r.token_ids) for r in rollouts), 1)
        n = len(rollouts)
        input_ids = torch.full((n, width_p + width_c), self.tokenizer.pad_token_id, dtype=torch.long)
        attention = torch.zeros((n, width_p + width_c), dtype=torch.long)
        completion_mask = torch.zeros((n, width_c), dtype=torch.long)
        for row, (p, r) in enumerate(zip(prompt_ids, rollouts)):
            input_ids[row, width_p - len(p) : width_p] = torch.tensor(p)
            attention[row, width_p - len(p) : width_p + len(r.token_ids)] = 1
            if r.token_ids:
                input_ids[row, width_p : width_p + len(r.token_ids)] = torch.tensor(r.token_ids)
            completion_mask[row, : len(r.token_ids)] = 1
        return input_ids.to(self.device), attention.to(self.device), completion_mask.to(self.device)

    @torch.no_grad()
    def _ref_logprobs(self, input_ids, attention, completion_mask) -> torch.Tensor:
        temperature = self.config.sampling.temperature
        if self.lora:
            with self.model.disable_adapter():
                logp, _ = token_logprobs_and_entropy(
                    self.model, input_ids, attention, completion_mask, temperature, entropy_grad=False
                )
        else:
            logp, _ = token_logprobs_and_entropy(
                self.ref_model, input_ids, attention, completion_mask, temperature, entropy_grad=False
            )
        return logp

    # ------------------------------------------------------------------ the step

    def train_step(self) -> dict:
        """One GRPO step (science §1, §3, §4); returns its row of the ``steps`` table.

        Raises :class:`NonFiniteLossError` (naming run and step) before the update
        when the loss or the gradient norm is not finite; the trainer is then
        left exactly as after the previous step.
        """
        cfg = self.config
        step = self.step + 1
        t_generate = t_score = 0.0
        generated: list[Rollout] = []
        drawn = self.prompts_drawn
        sample_calls = 0

        def next_prompts(k: int) -> list[int]:
            nonlocal drawn
            indices = self.data_order(drawn, k)
            drawn += k
            return indices

        def sample_fn(indices: list[int], n: int) -> list[list[Rollout]]:
            nonlocal t_generate, t_score, sample_calls
            # 1a. generate: each call of a step has its own seed, so a resumed run repeats it
            t0 = time.perf_counter()
            seed = self._seed(_TRAIN, step, sample_calls)
            sample_calls += 1
            groups = self.sampler.sample([self._train_prompts[i] for i in indices], n, cfg.sampling, seed=seed)
            t1 = time.perf_counter()
            # 1b. score with the verifier (0/1)
            for i, group in zip(indices, groups):
                for r in group:
                    r.reward = self._score(self.train_problems[i], r.text)
            t_generate += t1 - t0
            t_score += time.perf_counter() - t1
            generated.extend(r for group in groups for r in group)
            return groups

        # 1. allocate: the rule draws prompts and generates; every generated rollout counts in C (science §1, §4)
        alloc = allocate(self.rule, next_prompts, sample_fn)
        if alloc.rollouts_generated != len(generated):
            raise RuntimeError(
                f"compute accounting: rule {self.rule.name} reports {alloc.rollouts_generated} rollouts "
                f"generated, sample_fn produced {len(generated)}"
            )

        t_start_train = time.perf_counter()
        self.last_noise_prompts = []
        rollouts = [r for g in alloc.groups for r in g.rollouts]
        row_loss = {"loss": math.nan, "policy_loss": math.nan, "kl": math.nan, "entropy": math.nan,
                    "clip_frac": math.nan, "grad_norm": math.nan, "n_tokens": 0, "zero_var_frac_trained": math.nan}
        lr = cfg.lr * warmup_factor(step - 1, cfg.warmup_steps)
        if rollouts:  # dynamic sampling can end a step with no group; then C grows and nothing trains
            # 2. advantages on the kept groups (science §3); PODS groups are already the kept subset
            rewards = np.array([[r.reward for r in g.rollouts] for g in alloc.groups], dtype=np.float64)
            if cfg.overlong_penalty_cache:
                lengths = np.array([[r.n_tokens for r in g.rollouts] for g in alloc.groups])
                rewards = rewards + overlong_penalty(lengths, cfg.sampling.max_new_tokens, cfg.overlong_penalty_cache)
            advantages = group_advantages(rewards, scale=cfg.advantage_scale).reshape(-1)
            regularize = nonzero_variance_mask(rewards).reshape(-1)
            keep = np.ones(len(rollouts), dtype=bool)
            if cfg.overlong_filter:
                keep = overlong_filter_mask([r.truncated for r in rollouts])

            # 3. loss: one forward; on-policy with one update per batch, so logp_old = logp_new.detach()
            prompts = [self._train_prompts[g.problem] for g in alloc.groups for _ in g.rollouts]
            input_ids, attention, completion_mask = self._batch(prompts, rollouts)
            self.model.train()
            logp_new, entropy = token_logprobs_and_entropy(
                self.model, input_ids, attention, completion_mask, cfg.sampling.temperature,
                entropy_grad=cfg.entropy_coef > 0,
            )
            logp_ref = self._ref_logprobs(input_ids, attention, completion_mask) if cfg.kl_coef > 0 else None
            mask = completion_mask * torch.as_tensor(keep, device=self.device)[:, None]
            row_noise = {}
            if cfg.noise_every and step % cfg.noise_every == 0:
                row_noise = self._measure_noise(
                    step, alloc, rewards, advantages, regularize, input_ids, attention, completion_mask, mask, logp_ref
                )
            out = grpo_loss(
                logp_new, logp_new.detach(),
                torch.as_tensor(advantages, dtype=torch.float32, device=self.device), mask, self.loss_cfg,
                logp_ref=logp_ref, entropy=entropy, regularize=torch.as_tensor(regularize, device=self.device),
            )

            # 4. update: backward, clip, AdamW at the scheduled learning rate (science §3)
            self.optimizer.zero_grad(set_to_none=True)
            out.loss.backward()
            max_norm = cfg.grad_clip if cfg.grad_clip > 0 else math.inf
            grad_norm = float(torch.nn.utils.clip_grad_norm_(list(self.trainable.values()), max_norm))
            loss = float(out.loss.detach())
            if not (math.isfinite(loss) and math.isfinite(grad_norm)):
                self.optimizer.zero_grad(set_to_none=True)
                raise NonFiniteLossError(
                    f"run {cfg.run_id}: non-finite loss or gradient norm at step {step} "
                    f"(loss={loss}, grad_norm={grad_norm}); the update was not applied"
                )
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            row_loss = {
                "loss": loss, "policy_loss": out.policy_loss, "kl": out.kl, "entropy": out.entropy,
                "clip_frac": out.clip_frac, "grad_norm": grad_norm, "n_tokens": out.n_tokens,
                "zero_var_frac_trained": float(np.mean(np.ptp(rewards, axis=1) == 0)),
            }
        t_train = time.perf_counter() - t_start_train

        # 5. commit the step and log it
        self.step = step
        self.c += alloc.rollouts_generated
        self.c_tokens += sum(r.n_tokens for r in generated)
        self.prompts_drawn = drawn
        return {
            "run_id": cfg.run_id,
            "step": step,
            "c": self.c,
            "c_tokens": self.c_tokens,
            "epochs": self.epochs,
            "b_problem": cfg.b_problem,
            "n": cfg.n,
            "m": cfg.trained_group_size,
            "draws": alloc.draws,
            "rollouts_generated": alloc.rollouts_generated,
            "rollouts_trained": alloc.rollouts_trained,
            "pilot_rollouts": alloc.pilot_rollouts,
            "discarded_rollouts": alloc.discarded_rollouts,
            "groups_trained": len(alloc.groups),
            "updated": bool(rollouts),
            # over every generated rollout of the step (verifier reward, before any shaping)
            "reward_mean": _nanmean([r.reward for r in generated]),
            # drawn prompts whose generated rewards were all equal (pilot rewards for Pilot-Commit)
            "zero_var_frac": alloc.zero_variance_draws / alloc.draws,
            "response_len_mean": _nanmean([r.n_tokens for r in generated]),
            "trunc_frac": _nanmean([float(r.truncated) for r in generated]),
            "lr": lr,
            **row_loss,
            **(row_noise if rollouts else {}),
            "t_generate": t_generate,
            "t_score": t_score,
            "t_train": t_train,
        }

    # ------------------------------------------------------------------ gradient noise

    def _measure_noise(self, step, alloc, rewards, advantages, regularize, input_ids, attention,
                       completion_mask, mask, logp_ref) -> dict:
        """Gradient-noise figures of this step's batch (science §6), before its update.

        g_i is the gradient of rollout i's own term of this step's loss (the
        batch's advantages held fixed); the Gram matrix comes from one
        forward and one backward pass through per-layer hooks
        (:func:`rollscale.core.gram.gram_matrix`). Returns the step-level numbers
        for the ``steps`` row (and the ``noise_steps`` table of the measure
        stage); the per-prompt split-half rows land in ``last_noise_prompts``.
        """
        cfg = self.config
        t0 = time.perf_counter()
        adv = torch.as_tensor(advantages, dtype=torch.float32, device=self.device)
        reg = torch.as_tensor(regularize, device=self.device)
        # a rollout's term must not depend on which rows share the forward call:
        # rescale the aggregation's normaliser from the call's rows to the batch's
        token_mode = self.loss_cfg.agg_mode == "token-mean"
        counts = mask.sum(dim=1) if token_mode else (mask.sum(dim=1) > 0).to(mask.dtype)
        total = counts.sum().clamp_min(1)

        def loss_terms(idx: torch.Tensor) -> torch.Tensor:
            idx = idx.to(self.device)
            logp, ent = token_logprobs_and_entropy(
                self.model, input_ids[idx], attention[idx], completion_mask[idx], cfg.sampling.temperature,
                entropy_grad=cfg.entropy_coef > 0,
            )
            out = grpo_loss(
                logp, logp.detach(), adv[idx], mask[idx], self.loss_cfg,
                logp_ref=None if logp_ref is None else logp_ref[idx], entropy=ent, regularize=reg[idx],
            )
            return out.per_rollout * (counts[idx].sum().clamp_min(1) / total)

        self.model.train()
        gram = gram_matrix(self.model, loss_terms, len(input_ids))
        groups = np.repeat(np.arange(len(alloc.groups)), [len(g.rollouts) for g in alloc.groups])
        if len(set(np.bincount(groups))) != 1 or len(alloc.groups) < 2:
            return {"t_noise": time.perf_counter() - t0}  # the decomposition needs >= 2 equal groups
        dec = decompose(gram, groups)
        ema = self.noise_ema.update(dec.trace_sigma, dec.g_norm2) if np.isfinite([dec.trace_sigma, dec.g_norm2]).all() else math.nan
        n = int(np.bincount(groups)[0])
        start = 0
        for gi, group in enumerate(alloc.groups):
            block = gram[start : start + n, start : start + n]
            start += n
            rho = math.nan
            if n >= 3 and np.ptp(rewards[gi]) > 0 and np.trace(block) > 0:
                rho = split_half_rho(block, np.random.default_rng(self._seed(_NOISE, step, gi)))
            null = k_sat_null(n) if n >= 3 else math.nan
            ks = k_sat(rho) if np.isfinite(rho) else math.nan
            self.last_noise_prompts.append({
                "run_id": cfg.run_id, "step": step, "problem_id": self.train_problems[group.problem].problem_id,
                "n": n, "pass_rate": float(np.mean(rewards[gi])), "rho_split": rho, "k_sat": ks,
                "k_sat_null": null, "k_sat_ratio": ks / null if np.isfinite(ks) else ks,
            })
        return {
            "noise_n": n, "trace_sigma": dec.trace_sigma, "g_norm2": dec.g_norm2, "b_simple": dec.b_simple,
            "b_simple_ema": ema, "b_naive": dec.b_naive, "prompt_noise": dec.prompt_noise,
            "rollout_noise": dec.rollout_noise, "rho_icc": dec.rho_icc, "k_sat_icc": dec.k_sat_icc,
            "k_crit": dec.k_crit, "crs": dec.crs, "t_noise": time.perf_counter() - t0,
        }

    # ------------------------------------------------------------------ evaluation

    @torch.no_grad()
    def evaluate(self) -> dict:
        """Validation metrics at the current step (science §5); returns an ``evals`` row.

        ``eval_k`` samples per problem at ``eval_temperature``: avg@k with its
        standard error across problems, unbiased best@k and worst@k from the
        N = k samples; greedy accuracy from one temperature-0 sample.
        """
        cfg = self.config
        t0 = time.perf_counter()
        k = cfg.eval_k
        sampled = SamplingConfig(
            temperature=cfg.eval_temperature, top_p=cfg.sampling.top_p, top_k=cfg.sampling.top_k,
            max_new_tokens=cfg.sampling.max_new_tokens,
        )
        greedy_cfg = SamplingConfig(temperature=0.0, max_new_tokens=cfg.sampling.max_new_tokens)
        groups = self.sampler.sample(self._val_prompts, k, sampled, seed=self._seed(_EVAL, self.step, 0))
        greedy = self.sampler.sample(self._val_prompts, 1, greedy_cfg, seed=self._seed(_EVAL, self.step, 1))
        n_correct = np.array([sum(self._score(p, r.text) for r in g) for p, g in zip(self.val_problems, groups)])
        greedy_correct = np.array([self._score(p, g[0].text) for p, g in zip(self.val_problems, greedy)])
        per_problem = np.atleast_1d(avg_at_k(n_correct.astype(np.int64), k))
        self.last_eval_step = self.step
        return {
            "run_id": cfg.run_id,
            "step": self.step,
            "c": self.c,
            "c_tokens": self.c_tokens,
            "epochs": self.epochs,
            "k": k,
            "n_problems": len(self.val_problems),
            "avg_at_k": float(per_problem.mean()),
            "avg_at_k_se": standard_error(per_problem) if per_problem.size >= 2 else math.nan,
            "best_at_k": float(np.mean(best_at_k(k, n_correct.astype(np.int64), k))),
            "worst_at_k": float(np.mean(worst_at_k(k, n_correct.astype(np.int64), k))),
            "greedy": float(greedy_correct.mean()),
            "t_eval": time.perf_counter() - t0,
        }

    # ------------------------------------------------------------------ checkpoint / resume

    def _state(self) -> dict:
        d = len(self.train_problems)
        return {
            "run_id": self.config.run_id,
            "step": self.step,
            "c": self.c,
            "c_tokens": self.c_tokens,
            "prompts_drawn": self.prompts_drawn,
            "data_epoch": self.prompts_drawn // d,
            "data_position": self.prompts_drawn % d,
            "data_seed": self.config.seed,
            "n_train_problems": d,
            "data_hash": self.data_hash,
            "last_eval_step": self.last_eval_step,
            "noise_ema": vars(self.noise_ema).copy(),
            "config_hash": self.config_hash,
            "config": self.config.to_dict(),
            "rng": _rng_state(),
        }

    def _save(self, store: RunStore, step_rows: list, eval_rows: list) -> Checkpoint:
        model_state = {name: p.detach().cpu().clone() for name, p in self.trainable.items()}
        ckpt = store.save(self.step, model_state, self.optimizer.state_dict(), self._state(), step_rows, eval_rows)
        step_rows.clear()
        eval_rows.clear()
        return ckpt

    def _check_same_run(self, saved: dict, store: RunStore) -> None:
        if saved.get("config_hash") != self.config_hash:
            raise ValueError(
                f"run directory {store.root} holds a run with a different config "
                f"(config hash {saved.get('config_hash')} != {self.config_hash} of run {self.config.run_id}); "
                "use a new directory or the same config"
            )
        if "data_hash" in saved and saved["data_hash"] != self.data_hash:
            raise ValueError(
                f"run directory {store.root} holds a run on different training problems "
                f"(data hash {saved['data_hash']} != {self.data_hash})"
            )

    def load_checkpoint(self, ckpt: Checkpoint) -> None:
        """Restore weights (trainable parameters), optimizer, progress and RNG states."""
        model_state = ckpt.model_state()
        if set(model_state) != set(self.trainable):
            missing = sorted(set(self.trainable) - set(model_state))[:3]
            extra = sorted(set(model_state) - set(self.trainable))[:3]
            raise ValueError(f"checkpoint {ckpt.path} does not fit this model (missing {missing}, unexpected {extra})")
        with torch.no_grad():
            for name, value in model_state.items():
                self.trainable[name].copy_(value)
        self.optimizer.load_state_dict(ckpt.optimizer_state())
        s = ckpt.state
        self.step, self.c, self.c_tokens = s["step"], s["c"], s["c_tokens"]
        self.prompts_drawn, self.last_eval_step = s["prompts_drawn"], s["last_eval_step"]
        if "noise_ema" in s:
            vars(self.noise_ema).update(s["noise_ema"])
        _set_rng_state(s["rng"])

    def _result(self, status: str, error: str | None) -> RunResult:
        return RunResult(self.config.run_id, status, error, self.step, self.c, self.c_tokens)

    def run(
        self,
        store: RunStore,
        on_step: Callable[[dict], None] | None = None,
        on_eval: Callable[[dict], None] | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> RunResult:
        """Train until cumulative C >= c_max (science §1), resuming from ``store``.

        Evaluates at step 0, every ``eval_every`` steps and at the end;
        checkpoints every ``checkpoint_every`` steps and at the end, with the
        rows since the previous checkpoint. A run whose ``done.json`` says
        finished is not trained again (its last checkpoint is loaded); a failed
        one is retried from its newest valid checkpoint. ``on_step`` /
        ``on_eval`` get each row, ``progress`` gets ``(c, c_max)`` after each step.

        A non-finite loss ends the run as "failed": the rows of the good steps
        before it are checkpointed, ``done.json`` records the error. Any other
        exception is recorded in ``done.json`` as failed and raised again.
        """
        cfg = self.config
        done = store.done()
        if done is not None and done.get("status") == "finished":
            self._check_same_run(done, store)
            ckpt = store.latest()
            if ckpt is not None:
                self.load_checkpoint(ckpt)
            return self._result("finished", None)
        ckpt = store.latest()
        if ckpt is not None:
            self._check_same_run(ckpt.state, store)
            self.load_checkpoint(ckpt)
        store.rollback_to(ckpt)

        step_rows: list[dict] = []
        eval_rows: list[dict] = []

        def log_eval() -> None:
            row = self.evaluate()
            eval_rows.append(row)
            if on_eval is not None:
                on_eval(row)

        info = {"run_id": cfg.run_id, "config_hash": self.config_hash}
        try:
            if self.last_eval_step < 0:
                log_eval()  # step 0: before training
            while self.c < cfg.c_max:
                row = self.train_step()
                step_rows.append(row)
                if on_step is not None:
                    on_step(row)
                if progress is not None:
                    progress(self.c, cfg.c_max)
                if self.step % cfg.eval_every == 0:
                    log_eval()
                if self.step % cfg.checkpoint_every == 0:
                    self._save(store, step_rows, eval_rows)
            if self.last_eval_step != self.step:
                log_eval()
            if step_rows or eval_rows:
                self._save(store, step_rows, eval_rows)
        except NonFiniteLossError as err:
            if step_rows or eval_rows:
                self._save(store, step_rows, eval_rows)
            store.mark_done("failed", error=str(err), steps=self.step, c=self.c, c_tokens=self.c_tokens, **info)
            return self._result("failed", str(err))
        except Exception as err:
            try:
                store.mark_done("failed", error=f"{type(err).__name__}: {err}", steps=self.step, c=self.c,
                                c_tokens=self.c_tokens, **info)
            except OSError:
                pass  # the store itself is failing; the original error says why
            raise
        store.mark_done("finished", steps=self.step, c=self.c, c_tokens=self.c_tokens, **info)
        return self._result("finished", None)
