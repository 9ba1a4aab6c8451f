"""Model and sampling-engine construction shared by the profile, measure and sweep tasks."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import torch

from rollscale.config import LoraParams, SamplingParams
from rollscale.lm.engines import EngineConfig, SamplingEngine, make_engine
from rollscale.lm.engines.base import free_accelerator_memory
from rollscale.lm.models import ModelRef, add_lora, load_model, render_prompt
from rollscale.core.rollouts import SamplingConfig


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


# one engine per (model, engine settings) in this process, until the stage ends (close_engines)
_ENGINES: dict[tuple[ModelRef, EngineConfig], SamplingEngine] = {}


def engine_config(s: SamplingParams) -> EngineConfig:
    return EngineConfig(
        backend=s.backend, batch_size=s.batch_size, dtype=s.engine_dtype, gpu_memory_fraction=s.gpu_memory_fraction,
        cpu_kv_cache_gb=s.cpu_kv_cache_gb, max_model_len=s.max_model_len, enable_sleep=s.enable_sleep, eager=s.engine_eager,
    )


def stage_engine(ref: ModelRef, sampling: SamplingParams, device: str = "auto") -> SamplingEngine:
    """The stage's engine for the base model on ``model.device``, built on first use (``sampling.backend``)."""
    key = (ref, engine_config(sampling))
    if key not in _ENGINES:
        model, tokenizer = cached_model(ref, device)
        _ENGINES[key] = make_engine(model, tokenizer, key[1])
    return _ENGINES[key]


def close_engines() -> None:
    """End of a stage: shut its engines down and drop the cached models, so the next stage
    starts with the memory free (a vLLM engine would otherwise hold its share of the GPU)."""
    while _ENGINES:
        _ENGINES.popitem()[1].close()
    cached_model.cache_clear()
    free_accelerator_memory()


@contextlib.contextmanager
def training_model(
    ref: ModelRef, sampling: SamplingParams, lora: LoraParams | None = None, device: str = "auto"
) -> Iterator[tuple]:
    """``(model, tokenizer, engine, use_lora)`` for a training run (sweep) or a measured one
    (measure): a fresh copy of the model on ``model.device`` (training changes its weights),
    with LoRA adapters when enabled, and the ``sampling.backend`` engine that samples from it
    (the trainer syncs it after every optimizer step). The engine is closed on the way out,
    so its memory (vLLM's share of the GPU) is free for whatever runs next in this process."""
    model, tokenizer = load_model(ref, device=resolve_device(device))
    use_lora = bool(lora and lora.enabled)
    if use_lora:
        model = add_lora(model, lora.r, lora.alpha, lora.dropout, lora.target_modules)
    engine = make_engine(model, tokenizer, engine_config(sampling))
    try:
        yield model, tokenizer, engine, use_lora
    finally:
        engine.close()
        free_accelerator_memory()


def sampling_config(s: SamplingParams) -> SamplingConfig:
    return SamplingConfig(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, max_new_tokens=s.max_new_tokens)


def renderer(ref: ModelRef, engine: SamplingEngine, sampling: SamplingParams):
    return functools.partial(render_prompt, engine.tokenizer, use_chat_template=ref.chat_template,
                             chat_template_kwargs=sampling.chat_template_kwargs)
