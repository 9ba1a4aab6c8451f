"""Tasks of the ``measure`` stage: a short GRPO run at large n, noise measured every step."""

from __future__ import annotations

import pandas as pd

from rollscale.config import LoraParams, SamplingParams
from rollscale.lm.models import ModelRef
from rollscale.core.problems.problem import Problem
from rollscale.pipeline.progress import Progress
from rollscale.train.run_config import RunConfig
from rollscale.train.trainer import GRPOTrainer
from tasks.common import retried_task
from tasks.models import training_model

NOISE_STEP_COLUMNS = [
    "step", "n", "b_problem", "reward_mean", "zero_var_frac", "trace_sigma", "g_norm2", "b_simple", "b_simple_ema",
    "b_naive", "prompt_noise", "rollout_noise", "rho_icc", "k_sat_icc", "k_crit", "crs", "t_noise",
]


@retried_task(name="measure-noise")
def measure_noise(
    ref: ModelRef, config: RunConfig, bucket: str, train: list[Problem], val: list[Problem], steps: int,
    lora: LoraParams | None = None, device: str = "auto", sampling: SamplingParams | None = None,
) -> dict[str, pd.DataFrame]:
    """``steps`` GRPO steps from the base model, each measured before its update (science §6),
    sampled by the ``sampling.backend`` engine."""
    sampling = sampling or SamplingParams()
    step_rows, prompt_rows = [], []
    with training_model(ref, sampling, lora, device) as (model, tokenizer, engine, use_lora), \
            Progress(steps, f"measure n={config.n}", unit="steps") as bar:
        trainer = GRPOTrainer(model, tokenizer, train, val, config, use_chat_template=ref.chat_template, lora=use_lora,
                              engine=engine, chat_template_kwargs=sampling.chat_template_kwargs)
        for _ in range(steps):
            row = trainer.train_step()
            step_rows.append({"bucket": bucket, **{k: row.get(k) for k in NOISE_STEP_COLUMNS}})
            prompt_rows += [{"bucket": bucket, **r} for r in trainer.last_noise_prompts]
            bar.update(1, b_simple=f"{row.get('b_simple', float('nan')):.3g}", rho_icc=f"{row.get('rho_icc', float('nan')):.3f}")
        del trainer
    return {"noise_steps": pd.DataFrame(step_rows), "noise_prompts": pd.DataFrame(prompt_rows)}
