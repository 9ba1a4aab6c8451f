"""Model and sampler construction shared by the profile, measure and sweep tasks."""

from __future__ import annotations

import functools

import torch

from rollscale.config import SamplingParams
from rollscale.lm.models import ModelRef, load_model, render_prompt
from rollscale.lm.sampling import HFSampler, SamplingConfig


def resolve_device(device: str) -> str:
    """``model.device`` as a torch device: "auto" = CUDA when present, else CPU.
    "cpu" never asks torch about CUDA (a CPU stage touches no CUDA code path)."""
    if device == "cpu":
        return "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("model.device is 'cuda' but torch sees no CUDA device (use 'auto' or 'cpu')")
    return "cuda" if torch.cuda.is_available() else "cpu"


@functools.lru_cache(maxsize=2)
def cached_model(ref: ModelRef, device: str = "auto"):
    """Load once per process: a chunked stage calls many tasks on the same model."""
    return load_model(ref, device=resolve_device(device))


@functools.lru_cache(maxsize=2)
def cached_sampler(ref: ModelRef, backend: str, batch_size: int, seed: int, device: str = "auto"):
    if backend == "vllm":
        from rollscale.lm.sampling import VLLMSampler  # GPU only; never imported on the CPU path

        return VLLMSampler(ref.name_or_path, seed=seed)
    model, tokenizer = cached_model(ref, device)
    return HFSampler(model, tokenizer, batch_size=batch_size)


def sampling_config(s: SamplingParams) -> SamplingConfig:
    return SamplingConfig(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, max_new_tokens=s.max_new_tokens)


def renderer(ref: ModelRef, sampler):
    return functools.partial(render_prompt, sampler.tokenizer, use_chat_template=ref.chat_template)
