"""Tasks of the ``base`` stage: the tiny model's supervised warm start."""

from __future__ import annotations

import logging

import torch

from rollscale.config import BaseParams, DataParams
from rollscale.lm.models import char_tokenizer, tiny_llama, train_supervised
from rollscale.core.problems.problem import disjoint
from tasks.common import retried_task
from tasks.problems import load_pool

log = logging.getLogger("rollscale.base")


@retried_task(name="train-tiny-model")
def train_tiny_model(base: BaseParams, data: DataParams, pool_ids: frozenset[str]) -> dict:
    """Train the tiny Llama on problems disjoint from the profiled pool, with ``base.threads``
    torch threads (one unit of work alone on the machine; 2 threads train 1.54x faster than 1
    on 2 idle cores, docs/benchmarks.md).

    Returns the weights and config (values, not files: safe to cache).
    """
    if data.source != "reasoning_gym":
        raise ValueError("model.kind 'tiny' needs data.source 'reasoning_gym' (it is trained on that task family)")
    train = disjoint(load_pool(data, size=base.train_size, seed=base.train_seed), set(pool_ids))
    torch.set_num_threads(base.threads)
    tokenizer = char_tokenizer()
    model = tiny_llama(
        len(tokenizer),
        base.hidden_size,
        base.num_layers,
        base.num_heads,
        base.intermediate_size,
        base.max_positions,
        tokenizer.pad_token_id,
        tokenizer.bos_token_id,
        tokenizer.eos_token_id,
        seed=base.seed,
    )
    every = max(base.steps // 10, 1)

    def on_step(step: int, loss: float) -> None:
        if (step + 1) % every == 0:
            log.info("base: step %d/%d, loss %.4f", step + 1, base.steps, loss)

    stats = train_supervised(
        model, tokenizer, [(p.prompt, p.answer) for p in train], base.steps, base.batch_size, base.lr, base.seed, on_step,
        label_smoothing=base.label_smoothing,
    )
    log.info("base: %d parameters, %d training problems, %.0f s", stats.n_parameters, len(train), stats.seconds)
    return {
        "state_dict": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "config": model.config.to_dict(),
        "stats": {**stats.__dict__, "train_problems": len(train)},
    }
