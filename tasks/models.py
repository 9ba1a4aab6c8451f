"""Model and sampler construction shared by the profile, measure and sweep tasks."""

from __future__ import annotations

import functools

from rollscale.config import SamplingParams
from rollscale.lm.models import ModelRef, load_model, render_prompt
from rollscale.lm.sampling import HFSampler, SamplingConfig


@functools.lru_cache(maxsize=2)
def cached_model(ref: ModelRef):
    """Load once per process: a chunked stage calls many tasks on the same model."""
    return load_model(ref)


@functools.lru_cache(maxsize=2)
def cached_sampler(ref: ModelRef, backend: str, batch_size: int, seed: int):
    if backend == "vllm":
        from rollscale.lm.sampling import VLLMSampler  # GPU only; never imported on the CPU path

        return VLLMSampler(ref.name_or_path, seed=seed)
    model, tokenizer = cached_model(ref)
    return HFSampler(model, tokenizer, batch_size=batch_size)


def sampling_config(s: SamplingParams) -> SamplingConfig:
    return SamplingConfig(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, max_new_tokens=s.max_new_tokens)


def renderer(ref: ModelRef, sampler):
    return functools.partial(render_prompt, sampler.tokenizer, use_chat_template=ref.chat_template)
