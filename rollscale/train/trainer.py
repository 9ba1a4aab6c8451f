"""The GRPO training loop: exact compute accounting, evaluation, checkpoint and
resume (science §1, §3, §4, §5).

One step (:meth:`GRPOTrainer.train_step`) reads top to bottom, each part a call
into a plain function: sample and score (the allocation rule draws prompts and
calls the engine, science §4) -> advantages -> gradient noise (optional,
science §6) -> loss over micro-batches and the optimizer step
(:func:`~rollscale.train.step.policy_update`) -> weight sync to the engine ->
log. Every rollout generated counts in ``C`` (science §1). :meth:`GRPOTrainer.run`
adds the outer loop: evaluation at step 0, on the shared budget schedule (science §9.1) or every
``eval_every`` steps, and at the end (science §5), checkpoints every ``checkpoint_every`` steps into a
:class:`~rollscale.train.checkpoint.RunStore`, and resuming from its newest valid checkpoint.

Repeatability: the data order is a permutation seeded by ``(seed, epoch)`` and
each sampling call is seeded by ``(seed, step, call)``, so a resumed run
samples exactly what the uninterrupted run would have (bit-identical on CPU).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import math
import time
import warnings
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch.optim.lr_scheduler import LambdaLR
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from rollscale.core.fit.schedule import eval_due
from rollscale.core.grpo.allocation import allocate
from rollscale.core.grpo.shaping import warmup_factor
from rollscale.core.grpo.logprobs import token_logprobs
from rollscale.core.noise.ema import EmaNoiseScale
from rollscale.core.problems.problem import Problem
from rollscale.core.problems.rewards import reward_fn
from rollscale.core.seeds import derive_seed
from rollscale.lm.models import render_prompt
from rollscale.core.rollouts import Rollout
from rollscale.lm.engines.hf import HFSampler
from rollscale.train.checkpoint import Checkpoint, RunStore
from rollscale.train.evaluate import evaluate
from rollscale.train.online_noise import batch_gram, noise_figures
from rollscale.train.rng_state import rng_state, set_rng_state
from rollscale.train.run_config import RunConfig, RunResult, config_hash, data_hash
from rollscale.train.data_order import DataOrder
from rollscale.train.distributed import Ranks, rank_rows, shard_run
from rollscale.train.sharded_checkpoint import checkpoint_state, rank_store, restore_state
from rollscale.train.halves import half_columns, split_halves
from rollscale.train.step import LOSS_COLUMNS, NonFiniteLossError, StepSettings, TrainBatch, policy_update, train_batch
from rollscale.train.step_columns import allocation_columns
from rollscale.train.trainer_inputs import check_trainer_inputs

# Purposes that keep the seed streams of data order, training and evaluation apart.
_DATA, _TRAIN, _EVAL, _NOISE, _HALVES = 0, 1, 2, 3, 4

RewardFn = Callable[[str, str], float]


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
        sample_batch_size: rollouts per ``generate`` call of the default engine.
        engine: the sampling engine (:class:`~rollscale.lm.engines.SamplingEngine`), synced after every
            optimizer step; None samples from the training model (:class:`~rollscale.lm.engines.HFSampler`).
            Rollouts carrying log-probs get the off-policy correction (science §3). The caller closes it.
        chat_template_kwargs: passed to the chat template (e.g. Qwen3's ``enable_thinking``).
        ranks: this process's place in a sharded run (FSDP2, :mod:`rollscale.train.distributed`); None: one process.

    Full-parameter training with ``kl_coef > 0`` keeps a frozen copy of the initial model (KL reference).
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
        engine=None,
        chat_template_kwargs: dict | None = None,
        ranks: Ranks | None = None,
    ) -> None:
        check_trainer_inputs(model, tokenizer, train_problems, val_problems, config, lora)
        self.model, self.tokenizer, self.config, self.lora = model, tokenizer, config, lora
        self.train_problems, self.val_problems = list(train_problems), list(val_problems)
        self.device = next(model.parameters()).device
        self.engine = engine if engine is not None else HFSampler(model, tokenizer, batch_size=sample_batch_size)
        self.rule = config.allocation_rule()
        self.step_settings = StepSettings.of_run(config)
        self.config_hash = config_hash(config)
        self.data_hash = data_hash(self.train_problems)
        self._reward = reward
        self.trainable = {name: p for name, p in model.named_parameters() if p.requires_grad}
        if not self.trainable:
            raise ValueError("model has no trainable parameters (requires_grad)")
        # The KL reference (science §3) is the initial policy; LoRA gets it by disabling adapters.
        self.ref_model = copy.deepcopy(model).eval().requires_grad_(False) if config.train.kl_coef > 0 and not lora else None
        if config.train.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.ranks = ranks  # sharded: FSDP2 here, before the optimizer is built on the shards
        if ranks is not None:
            self.engine, self.trainable = shard_run(model, self.ref_model, self.engine, config, ranks)
        self.optimizer = torch.optim.AdamW(self.trainable.values(), lr=config.lr, weight_decay=config.train.weight_decay)
        # linear warm-up, then constant (science §3); stepped once per training step
        self.scheduler = LambdaLR(self.optimizer, lambda s: warmup_factor(s, config.train.warmup_steps))
        render = functools.partial(render_prompt, tokenizer, use_chat_template=use_chat_template,
                                   chat_template_kwargs=chat_template_kwargs)
        self._train_prompts = [render(p.prompt) for p in self.train_problems]
        self._val_prompts = [render(p.prompt) for p in self.val_problems]
        self._prompt_ids: dict[str, list[int]] = {}
        self.data_order = DataOrder(len(self.train_problems), config.seed, _DATA)
        # Run progress: everything a checkpoint must hold besides weights and optimizer.
        self.step, self.c, self.c_tokens, self.prompts_drawn, self.last_eval_step = 0, 0, 0, 0, -1
        # gradient noise (science §6), measured every noise_every steps
        self.noise_ema = EmaNoiseScale(config.noise_ema)
        self.last_noise_prompts: list[dict] = []

    def _seed(self, purpose: int, step: int, call: int) -> int:
        return derive_seed(self.config.seed, purpose, step, call, bits=32)

    @property
    def epochs(self) -> float:
        """Prompts drawn for training so far / D (science §1). Drawn, not trained:
        pilot-pool prompts and groups dropped by dynamic sampling count."""
        return self.prompts_drawn / len(self.train_problems)

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

    @torch.no_grad()
    def _ref_logprobs(self, input_ids, attention, completion_mask) -> torch.Tensor:
        temperature = self.config.sampling.temperature
        if self.lora:
            with self.model.disable_adapter():
                return token_logprobs(self.model, input_ids, attention, completion_mask, temperature)
        return token_logprobs(self.ref_model, input_ids, attention, completion_mask, temperature)

    # ------------------------------------------------------------------ the step

    def train_step(self) -> dict:
        """One GRPO step (science §1, §3, §4); returns its row of the ``steps`` table.

        Raises :class:`NonFiniteLossError` (naming run and step) before the update
        when the loss or the gradient norm is not finite; the trainer is then
        left exactly as after the previous step (with ``ppo_epochs > 1``, a
        failure in a later epoch keeps the earlier epochs' updates; the run then
        fails and resumes from its last checkpoint).
        """
        cfg = self.config
        step = self.step + 1
        t_generate = t_score = 0.0
        generated: list[Rollout] = []
        drawn = self.prompts_drawn
        sample_calls = 0

        def next_prompts(k: int) -> list[int]:
            nonlocal drawn
            indices = self.data_order.indices(drawn, k)
            drawn += k
            return indices

        def sample_fn(indices: list[int], n: int) -> list[list[Rollout]]:
            nonlocal t_generate, t_score, sample_calls
            # 1a. generate: each call of a step has its own seed, so a resumed run repeats it
            t0 = time.perf_counter()
            seed = self._seed(_TRAIN, step, sample_calls)
            sample_calls += 1
            groups = self.engine.sample([self._train_prompts[i] for i in indices], n, cfg.sampling, seed=seed)
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

        # 2. advantages on the kept groups (science §3); PODS groups are already the kept subset
        self.engine.sleep()  # a vLLM engine with sampling.enable_sleep frees its KV cache for the update
        t_start_train = time.perf_counter()
        self.last_noise_prompts = []
        lr = self.optimizer.param_groups[0]["lr"]  # this step's scheduled rate (warm-up, science §3)
        row_loss = dict.fromkeys(LOSS_COLUMNS, math.nan) | {"n_tokens": 0, "micro_batches": 0} | half_columns(None)
        row_noise: dict = {}
        if alloc.groups:  # dynamic sampling can end a step with no group; then C grows and nothing trains
            groups = [g.rollouts for g in alloc.groups]
            prompts = [self._ids(self._train_prompts[g.problem]) for g in alloc.groups]
            rewards, batch = train_batch(groups, prompts, cfg)

            # 3. gradient noise of this batch, before its update (science §6)
            if cfg.noise_every and step % cfg.noise_every == 0:
                row_noise = self._measure_noise(step, alloc, rewards, batch)

            # 4. loss over micro-batches and the optimizer step(s) (science §3), the step's prompts split in two
            #    random halves whose mean gradients give the noise along training (science §6.4)
            halves = split_halves([len(g) for g in groups], np.random.default_rng(self._seed(_HALVES, step, 0))
                                  ) if cfg.noise_halves else None
            try:
                update = policy_update(self.model, self.optimizer, list(self.trainable.values()), batch,
                                       self.step_settings, self.tokenizer.pad_token_id, self._ref_logprobs,
                                       halves=halves, **rank_rows(self.ranks, groups))
            except NonFiniteLossError as err:
                raise NonFiniteLossError(f"run {cfg.run_id}: step {step}: {err}") from None
            row_loss = {**update, "zero_var_frac_trained": float(np.mean([np.ptp(r) == 0 for r in rewards]))}
            self.engine.sync_weights(self.model)
        t_train = time.perf_counter() - t_start_train

        # 5. commit the step and log it; the warm-up counts training steps, updated or not
        with warnings.catch_warnings():  # torch warns when a step trained nothing (dynamic sampling)
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step", category=UserWarning)
            self.scheduler.step()
        self.step = step
        self.c += alloc.rollouts_generated
        self.c_tokens += sum(r.n_tokens for r in generated)
        self.prompts_drawn = drawn
        return {"run_id": cfg.run_id, "step": step, "c": self.c, "c_tokens": self.c_tokens, "epochs": self.epochs,
                "b_problem": cfg.b_problem, "n": cfg.n, "m": cfg.trained_group_size,
                **allocation_columns(alloc, generated), "lr": lr, **row_loss, **row_noise,
                "t_generate": t_generate, "t_score": t_score, "t_train": t_train}

    def _measure_noise(self, step: int, alloc, rewards: list[np.ndarray], batch: TrainBatch) -> dict:
        """Gradient-noise figures of this step's batch before its update (science §6): the
        step-level numbers for the ``steps`` row; per-prompt rows in ``last_noise_prompts``."""
        t0 = time.perf_counter()
        gram = batch_gram(self.model, batch, self.step_settings, self.tokenizer.pad_token_id, self._ref_logprobs,
                          ranks=self.ranks)  # sharded: each rank its parameters' blocks, summed over ranks
        figures, prompt_rows = noise_figures(  # groups of equal size (RunConfig checks the rule)
            gram, np.stack(rewards), self.noise_ema, lambda gi: np.random.default_rng(self._seed(_NOISE, step, gi))
        )
        self.last_noise_prompts = [
            {"run_id": self.config.run_id, "step": step,
             "problem_id": self.train_problems[g.problem].problem_id, **row}
            for g, row in zip(alloc.groups, prompt_rows)
        ]
        return {**figures, "t_noise": time.perf_counter() - t0}

    # ------------------------------------------------------------------ evaluation

    @torch.no_grad()
    def evaluate(self) -> dict:
        """Validation metrics at the current step (science §5); returns an ``evals`` row."""
        cfg = self.config
        row = evaluate(
            self.engine, self._val_prompts, self.val_problems, self._score, cfg.eval_k, cfg.eval_temperature,
            cfg.sampling, seeds=(self._seed(_EVAL, self.step, 0), self._seed(_EVAL, self.step, 1)),
        )
        self.last_eval_step = self.step
        return {"run_id": cfg.run_id, "step": self.step, "c": self.c, "c_tokens": self.c_tokens,
                "epochs": self.epochs, **row}

    # ------------------------------------------------------------------ checkpoint / resume

    def _state(self) -> dict:
        d = len(self.train_problems)
        return {"run_id": self.config.run_id, "step": self.step, "c": self.c, "c_tokens": self.c_tokens,
                "prompts_drawn": self.prompts_drawn, "data_epoch": self.prompts_drawn // d,
                "data_position": self.prompts_drawn % d, "data_seed": self.config.seed, "n_train_problems": d,
                "data_hash": self.data_hash, "last_eval_step": self.last_eval_step,
                "noise_ema": vars(self.noise_ema).copy(), "rule_state": self.rule.state_dict(),
                "config_hash": self.config_hash, "config": self.config.to_dict(),
                "rng": rng_state(cuda=self.device.type == "cuda")}

    def _save(self, store: RunStore, step_rows: list, eval_rows: list) -> Checkpoint | None:
        model_state, optimizer_state = checkpoint_state(self.model, self.optimizer, self.trainable, self.ranks)
        ckpt = store.save(self.step, model_state, optimizer_state, self._state(), step_rows, eval_rows)
        step_rows.clear()
        eval_rows.clear()
        return ckpt

    def load_checkpoint(self, ckpt: Checkpoint) -> None:
        """Restore weights (trainable parameters), optimizer, progress and RNG states; sync the engine."""
        restore_state(self.model, self.optimizer, self.trainable, ckpt, self.ranks)
        self.engine.sync_weights(self.model)
        s = ckpt.state
        # the schedule resumes at the checkpoint's step (its rate follows from the step alone)
        for group in self.optimizer.param_groups:
            group.setdefault("initial_lr", self.config.lr)  # checkpoints written before the scheduler
        self.scheduler = LambdaLR(self.optimizer, self.scheduler.lr_lambdas[0], last_epoch=s["step"] - 1)
        self.step, self.c, self.c_tokens = s["step"], s["c"], s["c_tokens"]
        self.prompts_drawn, self.last_eval_step = s["prompts_drawn"], s["last_eval_step"]
        if "noise_ema" in s:
            vars(self.noise_ema).update(s["noise_ema"])
        self.rule.load_state_dict(s.get("rule_state", {}))
        set_rng_state(s["rng"], cuda=self.device.type == "cuda")

    def _result(self, status: str, error: str | None) -> RunResult:
        return RunResult(self.config.run_id, status, error, self.step, self.c, self.c_tokens)

    # ------------------------------------------------------------------ the run

    def run(self, store: RunStore, on_step: Callable[[dict], None] | None = None,
            on_eval: Callable[[dict], None] | None = None,
            progress: Callable[[int, int], None] | None = None, budget: float | None = None) -> RunResult:
        """Train until C >= c_max (science §1), resuming from ``store``; evaluate at step 0, every
        ``eval_every`` steps and at the end (§5); checkpoint every ``checkpoint_every`` steps and at the
        end. A finished run (``done.json``) is loaded, not trained again; a failed or stopped one resumes.
        ``on_step`` / ``on_eval`` get each row, ``progress`` ``(c, c_max)`` after each step. A non-finite
        loss ends the run "failed" (good steps checkpointed); other exceptions are recorded and raised.
        ``budget`` < c_max (a search rung, §9.4): pause at the first step with C >= budget, evaluated and
        checkpointed, status "paused", no done marker."""
        cfg = self.config
        end = cfg.c_max if budget is None else min(cfg.c_max, budget)
        store = rank_store(store, self.ranks)  # a sharded run's rank 0 writes, the others read
        done = store.done()
        if done is not None and done.get("status") == "finished":
            store.check_same_run(done, self.config.run_id, self.config_hash, self.data_hash)
            if (ckpt := store.latest()) is not None:
                self.load_checkpoint(ckpt)
            return self._result("finished", None)
        if (ckpt := store.latest()) is not None:
            store.check_same_run(ckpt.state, self.config.run_id, self.config_hash, self.data_hash)
            self.load_checkpoint(ckpt)
        store.rollback_to(ckpt)

        step_rows: list[dict] = []  # rows since the last checkpoint, committed by the next one
        eval_rows: list[dict] = []

        def log_eval() -> None:
            eval_rows.append(self.evaluate())
            if on_eval is not None:
                on_eval(eval_rows[-1])

        ended = {"run_id": cfg.run_id, "config_hash": self.config_hash}
        try:
            if self.last_eval_step < 0:
                log_eval()  # step 0: before training
            while self.c < end:
                c_before = self.c
                step_rows.append(self.train_step())
                if on_step is not None:
                    on_step(step_rows[-1])
                if progress is not None:
                    progress(self.c, cfg.c_max)
                if eval_due(self.step, c_before, self.c, cfg.eval_every, cfg.eval_schedule):  # science §9.1
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
            store.mark_done("failed", error=str(err), steps=self.step, c=self.c, c_tokens=self.c_tokens, **ended)
            return self._result("failed", str(err))
        except Exception as err:
            with contextlib.suppress(OSError):  # the store itself failing: the original error says why
                store.mark_done("failed", error=f"{type(err).__name__}: {err}", steps=self.step, c=self.c,
                                c_tokens=self.c_tokens, **ended)
            raise
        if self.c < cfg.c_max:
            return self._result("paused", None)
        store.mark_done("finished", steps=self.step, c=self.c, c_tokens=self.c_tokens, **ended)
        return self._result("finished", None)
