"""The gradient-noise probe inside TRL's ``GRPOTrainer`` (science §6).

Two lines in a TRL GRPO script::

    from rollscale.integrations.trl import add_noise_probe
    add_noise_probe(trainer, noise_every=10)   # before trainer.train()

Every ``noise_every`` optimizer steps the probe takes the micro-batch the
trainer is about to learn from (its completions, masks and advantages, as
TRL's ``compute_loss`` receives them), builds the per-rollout Gram matrix of
that batch's GRPO loss with one extra forward and backward pass
(:func:`rollscale.core.noise.gram.gram_matrix`, science §6.1; full or LoRA/peft
training) and decomposes it with :func:`rollscale.core.noise.estimators.decompose`
(science §6.2, §6.3). The numbers go into TRL's own metric buffer, so they
are averaged and logged at the trainer's next log step wherever TRL logs
(console, TensorBoard, W&B, MLflow), as ``noise/b_simple``,
``noise/prompt_noise``, ``noise/rollout_noise``, ``noise/rho_icc``,
``noise/k_crit``, ``noise/crs`` (and ``noise/k_sat_icc``,
``noise/trace_sigma``, ``noise/g_norm2``). A one-line recommendation is
written to the ``rollscale.integrations.trl`` logger.

Training is untouched: the Gram pass never writes ``.grad``, samples
nothing and leaves the model's mode as it is, so losses are the same with the
probe on and off (dropout, if the model has any, draws its masks from torch's
generator and would shift later draws; the tiny and most LLM fine-tuning
setups have dropout 0).

Hook point (TRL 1.16): ``GRPOTrainer.compute_loss(model, inputs)`` receives
the prepared micro-batch (``prompt_ids``, ``completion_ids``,
``completion_mask``, ``advantages``, optional ``old_per_token_logps`` /
``ref_per_token_logps``). Rows are grouped by prompt from ``prompt_ids``;
the probe needs whole groups of equal size in one micro-batch, which holds
when ``steps_per_generation`` is 1 (the default with no gradient accumulation).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import numpy as np
import torch

from rollscale.core.noise.gram import gram_matrix
from rollscale.core.noise.estimators import NoiseDecomposition, decompose

__all__ = ["NoiseProbe", "add_noise_probe", "grpo_loss_terms", "rollout_groups"]

logger = logging.getLogger("rollscale.integrations.trl")

# The loss aggregations whose per-rollout terms are written out below.
SUPPORTED_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")
LOGGED = ("b_simple", "prompt_noise", "rollout_noise", "rho_icc", "k_sat_icc", "k_crit", "crs",
          "trace_sigma", "g_norm2")


def rollout_groups(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> np.ndarray:
    """Prompt-group id per row: rows with the same (masked) prompt tokens share a group."""
    keys: dict[tuple[int, ...], int] = {}
    groups = []
    for ids, mask in zip(prompt_ids.tolist(), prompt_mask.tolist(), strict=True):
        key = tuple(t for t, m in zip(ids, mask, strict=True) if m)
        groups.append(keys.setdefault(key, len(keys)))
    return np.asarray(groups)


def grpo_loss_terms(trainer: Any, model: torch.nn.Module, inputs: dict[str, Any]) -> Callable[[torch.Tensor], torch.Tensor]:
    """``loss_terms_fn`` for :func:`gram_matrix`: rollout i's own term of TRL's
    GRPO loss on this micro-batch (science §6.1), with TRL's batch-level
    normalisers held fixed so that the terms sum to ``trainer.compute_loss``.

    Mirrors ``GRPOTrainer._compute_loss`` (TRL 1.16) for the clipped surrogate
    with the KL term, token- or sequence-level importance ratios and the
    ``grpo`` / ``bnpo`` / ``dr_grpo`` / ``dapo`` aggregations.
    """
    prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
    completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
    mask = completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]
    mask = mask.float()
    advantages = inputs["advantages"]
    advantages = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
    n_rows, width = completion_ids.shape
    accum = trainer.current_gradient_accumulation_steps
    loss_type = trainer.loss_type
    if loss_type == "grpo":
        norm = mask.sum(-1).clamp(min=1.0) * n_rows * accum  # per row
    elif loss_type == "bnpo":
        norm = mask.sum().clamp(min=1.0) * accum
    elif loss_type == "dr_grpo":
        norm = torch.tensor(float(n_rows * trainer.max_completion_length * accum))
    else:  # dapo
        norm = inputs["num_items_in_batch"].clamp(min=1.0) / trainer.accelerator.num_processes
        norm = norm * accum / trainer.args.steps_per_generation

    def loss_terms(idx: torch.Tensor) -> torch.Tensor:
        dev = input_ids.device
        rows = idx.to(dev)
        # A plain forward through the LM head module (TRL's fused head bypasses the module
        # the Gram hooks watch); same log-probs: logits / temperature, log-softmax.
        with trainer.accelerator.autocast():
            logits = model(input_ids=input_ids[rows], attention_mask=attention_mask[rows]).logits
        logits = logits[:, -width - 1 : -1].float() / trainer.temperature
        logps = torch.log_softmax(logits, dim=-1).gather(-1, completion_ids[rows].unsqueeze(-1)).squeeze(-1)
        m = mask[rows]
        old = inputs.get("old_per_token_logps")
        old = logps.detach() if old is None else old[rows]
        log_ratio = logps - old
        if trainer.importance_sampling_level == "sequence":
            log_ratio = ((log_ratio * m).sum(-1) / m.sum(-1).clamp(min=1.0)).unsqueeze(-1)
        coef_1 = torch.exp(log_ratio)
        coef_2 = torch.clamp(coef_1, 1 - trainer.epsilon_low, 1 + trainer.epsilon_high)
        if trainer.args.delta is not None:
            coef_1 = torch.clamp(coef_1, max=trainer.args.delta)
        adv = advantages[rows]
        per_token = -torch.min(coef_1 * adv, coef_2 * adv)
        if trainer.beta != 0.0:
            ref = inputs["ref_per_token_logps"][rows]
            kl = torch.exp(ref - logps) - (ref - logps) - 1
            if trainer.args.use_bias_correction_kl:
                kl = kl * coef_1
            per_token = per_token + trainer.beta * kl
        sums = (per_token * m).sum(-1)
        return sums / (norm[rows] if norm.dim() else norm)

    return loss_terms


def _check_supported(trainer: Any) -> None:
    problems = []
    if trainer.loss_type not in SUPPORTED_LOSS_TYPES:
        problems.append(f"loss_type {trainer.loss_type!r} (supported: {', '.join(SUPPORTED_LOSS_TYPES)})")
    if getattr(trainer, "_entropy_bonus_enabled", False):
        problems.append("an entropy bonus")
    if getattr(trainer, "top_entropy_quantile", 1.0) < 1.0:
        problems.append("top_entropy_quantile < 1")
    if getattr(trainer, "off_policy_mask_threshold", None) is not None:
        problems.append("off_policy_mask_threshold")
    if getattr(trainer, "use_vllm", False) and getattr(trainer, "vllm_importance_sampling_correction", False):
        problems.append("vLLM importance-sampling correction")
    if getattr(trainer.args, "gradient_checkpointing", False):
        problems.append("gradient checkpointing (it re-runs forward hooks; set gradient_checkpointing=False)")
    if problems:
        raise ValueError("add_noise_probe: the probe does not model " + "; ".join(problems))


def recommendation(dec: NoiseDecomposition, step: int) -> str:
    """One line for the user: how far rollouts per prompt pay at this step (science §6.3)."""
    if not math.isfinite(dec.crs):
        return (f"step {step}: rollscale noise probe: CRS is unbounded (the batch gradient is within noise); "
                f"more rollouts per prompt still reduce noise at this step (n = {dec.n})")
    verdict = "more rollouts per prompt would still help" if dec.n < dec.crs else "you are at or past it"
    return (f"step {step}: rollscale noise probe: CRS = {dec.crs:.1f} (K_crit = {dec.k_crit:.1f}, "
            f"rho_icc = {dec.rho_icc:.2f}); rollouts per prompt beyond ~{dec.crs:.0f} buy little at this step "
            f"(n = {dec.n}: {verdict})")


class NoiseProbe:
    """Wraps a TRL ``GRPOTrainer``'s ``compute_loss`` to measure gradient noise
    every ``noise_every`` optimizer steps (see module docstring).

    ``history`` keeps ``(global_step, NoiseDecomposition)`` of every measured
    step; ``last_recommendation`` the latest one-line advice.
    """

    def __init__(self, trainer: Any, noise_every: int, *, chunk_size: int | None = None) -> None:
        if isinstance(noise_every, bool) or not isinstance(noise_every, int) or noise_every < 1:
            raise ValueError(f"noise_every: expected a positive int, got {noise_every!r}")
        _check_supported(trainer)
        self.trainer = trainer
        self.noise_every = noise_every
        self.chunk_size = chunk_size
        self.history: list[tuple[int, NoiseDecomposition]] = []
        self.last_recommendation: str | None = None
        self._measured_step = -1
        self._compute_loss = trainer.compute_loss
        trainer.compute_loss = self._wrapped

    def _wrapped(self, model: torch.nn.Module, inputs: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        step = self.trainer.state.global_step
        if model.training and step % self.noise_every == 0 and step != self._measured_step:
            self._measured_step = step
            self.measure(model, inputs, step)
        return self._compute_loss(model, inputs, *args, **kwargs)

    def measure(self, model: torch.nn.Module, inputs: dict[str, Any], step: int) -> NoiseDecomposition | None:
        """Gram + decomposition of this micro-batch; logs into TRL's metrics."""
        groups = rollout_groups(inputs["prompt_ids"], inputs["prompt_mask"])
        sizes = np.bincount(groups)
        if len(sizes) < 2 or sizes.min() < 2 or sizes.min() != sizes.max():
            logger.warning("step %d: noise probe skipped: the micro-batch holds groups of sizes %s; it needs "
                           ">= 2 whole prompt groups of equal size (set steps_per_generation=1)", step, sorted(set(sizes)))
            return None
        terms = grpo_loss_terms(self.trainer, model, inputs)
        gram = gram_matrix(model, terms, len(groups), self.chunk_size)
        dec = decompose(gram, groups)
        metrics = self.trainer._metrics["train"]
        values = asdict(dec)
        for name in LOGGED:
            metrics[f"noise/{name}"].append(float(values[name]))
        self.history.append((step, dec))
        self.last_recommendation = recommendation(dec, step)
        logger.info(self.last_recommendation)
        return dec

    def detach(self) -> None:
        """Stop measuring: restore the trainer's own ``compute_loss``."""
        self.trainer.compute_loss = self._compute_loss


def add_noise_probe(trainer: Any, noise_every: int = 10, *, chunk_size: int | None = None) -> NoiseProbe:
    """Measure B_simple, prompt/rollout-axis noise, rho_icc, K_crit and CRS
    (science §6) inside a TRL ``GRPOTrainer`` every ``noise_every`` steps.

    ``chunk_size`` bounds the rollouts per Gram forward pass (memory).
    Returns the probe (``probe.history``, ``probe.detach()``).
    """
    return NoiseProbe(trainer, noise_every, chunk_size=chunk_size)
