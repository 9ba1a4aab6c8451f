"""transformers' continuous batching with paged attention (``generate_batch``), meant for GPU.

Requests of different lengths share the batch without padding and finished ones
free their KV blocks at once, which is where batched ``generate`` loses its time
on RL rollouts of uneven length. transformers seeds the whole call with one
generator, so samples are independent draws but a request's sample depends on
how the scheduler batched it; the call as a whole repeats on the same machine
(seed = ``derive_seed(seed)``). Log-probs are of the sampled token after
temperature, top-k and top-p, as in the other engines.
"""

from __future__ import annotations

from typing import Sequence

import torch
from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase
from transformers.generation.configuration_utils import ContinuousBatchingConfig

from rollscale.lm.engines.base import (
    OnBatch,
    Prompt,
    TrainingModelEngine,
    check_call,
    eos_ids,
    make_rollout,
    prompt_ids,
)
from rollscale.lm.engines.hf import blank_generation_config
from rollscale.core.seeds import derive_seed
from rollscale.core.rollouts import Rollout, SamplingConfig
from rollscale.registry import SAMPLING_ENGINES


CPU_MAX_BATCH_TOKENS = 8192  # transformers' own default: a forward pass holds every prompt up to this


@SAMPLING_ENGINES.register("hf-paged")
class HFPagedEngine(TrainingModelEngine):
    """``model.generate_batch`` on the training model itself (``sync_weights`` is a no-op)."""

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase):
        if not hasattr(model, "generate_batch"):
            raise ValueError("sampling.backend 'hf-paged' needs transformers' continuous batching "
                             "(model.generate_batch, transformers >= 4.56)")
        self.model, self.tokenizer = model, tokenizer
        self.eos_ids = eos_ids(model, tokenizer)

    def generation_config(self, config: SamplingConfig) -> GenerationConfig:
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eos_ids[0]
        sampled = config.temperature > 0
        return GenerationConfig(
            max_new_tokens=config.max_new_tokens, do_sample=sampled, num_beams=1,
            temperature=config.temperature if sampled else 1.0,
            top_k=config.top_k, top_p=config.top_p,
            pad_token_id=pad, eos_token_id=self.eos_ids,
        )

    def cache_size(self, flat: Sequence[Sequence[int]], max_new_tokens: int) -> dict[str, int]:
        """On CPU, a cache for this call's requests at full length: transformers sizes it from the free memory
        (meant for a GPU's), and on a 24 GiB host zero-filled its attention-mask buffers for ~17 s per call (the
        tiny model's 18 rollouts: 21 s). On a GPU its own sizing stands."""
        if self.model.device.type != "cpu":
            return {}
        page = ContinuousBatchingConfig.page_size  # its default
        longest = max(len(ids) for ids in flat) + max_new_tokens
        return {"num_blocks": len(flat) * -(-longest // page),
                "max_batch_tokens": min(CPU_MAX_BATCH_TOKENS, sum(len(ids) for ids in flat) + len(flat))}

    @torch.no_grad()
    def sample(self, prompts: Sequence[Prompt], n: int, config: SamplingConfig, seed: int,
               on_batch: OnBatch | None = None) -> list[list[Rollout]]:
        check_call(prompts, n)
        flat = [p for p in prompt_ids(self.tokenizer, prompts) for _ in range(n)]
        was_training = self.model.training
        self.model.eval()
        try:
            with blank_generation_config(self.model):
                results = self.model.generate_batch(
                    inputs=flat, generation_config=self.generation_config(config),
                    continuous_batching_config=ContinuousBatchingConfig(
                        return_logprobs=True, seed=derive_seed(seed), **self.cache_size(flat, config.max_new_tokens)),
                )
        finally:
            if was_training:
                self.model.train()
        outputs = list(results.values())
        failed = [o.request_id for o in outputs if o.error is not None]
        if len(outputs) != len(flat) or failed:
            raise RuntimeError(f"hf-paged: {len(flat)} requests, {len(outputs)} results, failed: {failed[:5]}")
        rollouts = [make_rollout(self.tokenizer, o.generated_tokens, o.logprobs or None, self.eos_ids,
                                 config.max_new_tokens) for o in outputs]
        if on_batch is not None:
            on_batch(len(flat))
        return [rollouts[i * n : (i + 1) * n] for i in range(len(prompts))]
