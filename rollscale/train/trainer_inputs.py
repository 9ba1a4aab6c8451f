"""What :class:`~rollscale.train.trainer.GRPOTrainer` refuses before it builds anything: a config that is not a
:class:`~rollscale.train.run_config.RunConfig`, empty problem sets, a tokenizer without a pad token, and a model whose
being a peft model disagrees with ``lora``."""

from __future__ import annotations

from collections.abc import Sequence

from rollscale.core.problems.problem import Problem
from rollscale.train.run_config import RunConfig

__all__ = ["check_trainer_inputs"]


def check_trainer_inputs(model, tokenizer, train_problems: Sequence[Problem], val_problems: Sequence[Problem],
                         config: RunConfig, lora: bool) -> None:
    """Raise the one ``ValueError`` that says what is wrong with the trainer's arguments; None when they fit."""
    if not isinstance(config, RunConfig):
        raise ValueError(f"config must be a RunConfig, got {type(config).__name__}")
    for name, problems in (("train_problems", train_problems), ("val_problems", val_problems)):
        if not problems or not all(isinstance(p, Problem) for p in problems):
            raise ValueError(f"{name} must be a non-empty sequence of Problem")
    if tokenizer.pad_token_id is None:
        raise ValueError("tokenizer needs a pad token (set tokenizer.pad_token, e.g. to its EOS token)")
    is_peft = hasattr(model, "disable_adapter") and hasattr(model, "peft_config")
    if lora != is_peft:
        raise ValueError("lora=True needs a peft model (see rollscale.lm.models.add_lora)" if lora else
                         "model is a peft model: pass lora=True so only adapters are trained and saved")
