"""The sampling-engine interface every stage uses, and what all engines share.

An engine turns prompts (token ids, or rendered prompt strings that already
carry the chat template's BOS) into ``n`` :class:`Rollout` per prompt, each with
its token ids and the sampled tokens' log-probs. Request ``(prompt i, sample j)``
of a call with key ``seed`` is drawn with its own seed
``derive_seed(seed, i, j)``: samples are independent of one another and of how
the engine batches them, and the same call repeats exactly (science §3: the
rollouts of a group are i.i.d. draws of the policy).

After each optimizer step the trainer calls ``sync_weights(model)`` so the
engine samples the new policy (colocated, as TRL's and verl's colocate modes
do), and ``close()`` at the end of a stage releases the engine's memory.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable, Literal, Sequence

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from rollscale.core.rollouts import Rollout, SamplingConfig

Prompt = str | Sequence[int]
OnBatch = Callable[[int], None]


@dataclass(frozen=True)
class EngineConfig:
    """How an engine is built (the ``sampling`` section of params, minus the per-call settings)."""

    backend: str = "hf"  # a name of rollscale.registry.SAMPLING_ENGINES
    # sequences per HF generate call
    batch_size: int = 512
    # engine weights' dtype: "auto" = the training model's; another dtype makes the sampler
    # differ from the trainer (what the off-policy correction measures)
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    # vLLM's share of GPU memory while the trainer shares the GPU
    gpu_memory_fraction: float = 0.5
    # vLLM's KV cache on CPU, whole GB (VLLM_CPU_KVCACHE_SPACE)
    cpu_kv_cache_gb: int = 1
    # longest prompt + completion; None = the model's max_position_embeddings
    max_model_len: int | None = None
    # vLLM sleep mode: free the KV cache (and offload weights) during the backward (GPU only)
    enable_sleep: bool = False
    # vLLM without compilation / graph capture: starts in seconds, decodes slower (tests, short stages)
    eager: bool = False


def eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """End markers: the model's generation_config EOS ids plus the tokenizer's."""
    ids = model.generation_config.eos_token_id if model.generation_config is not None else None
    found = set(ids if isinstance(ids, list) else [ids] if ids is not None else [])
    if tokenizer.eos_token_id is not None:
        found.add(tokenizer.eos_token_id)
    return sorted(found)


def prompt_ids(tokenizer: PreTrainedTokenizerBase, prompts: Sequence[Prompt]) -> list[list[int]]:
    """Token ids of each prompt. A string is a rendered prompt: its BOS (from the chat
    template or :func:`render_prompt`) is already in the text, so none is added."""
    out = []
    for p in prompts:
        if isinstance(p, str):
            out.append(tokenizer(p, add_special_tokens=False)["input_ids"])
        else:
            out.append([int(t) for t in p])
    return out


def make_rollout(tokenizer, ids: Sequence[int], logprobs: Sequence[float] | None, end_ids, max_new_tokens: int) -> Rollout:
    """Cut at the first end marker (what follows is padding) and decode."""
    ids = list(ids)
    end = next((i for i, t in enumerate(ids) if t in end_ids), None)
    kept = ids[: end + 1] if end is not None else ids
    lp = [float(x) for x in logprobs[: len(kept)]] if logprobs is not None else None
    text = tokenizer.decode(kept, skip_special_tokens=True)
    return Rollout(text=text, token_ids=kept, n_tokens=len(kept),
                   truncated=end is None and len(ids) >= max_new_tokens, logprobs=lp)


def check_call(prompts: Sequence[Prompt], n: int) -> None:
    if n < 1:
        raise ValueError(f"n (samples per prompt) must be >= 1, got {n}")
    if isinstance(prompts, str):
        raise TypeError("prompts must be a sequence of prompts, got one string")


def request_places(n_prompts: int, indices: Sequence[int] | None) -> list[int]:
    """Each prompt's place in the call's seeds, ``derive_seed(seed, place, j)``: 0, 1, ... or ``indices``
    (a rank of a sharded run sampling its share of a call draws what the whole call would)."""
    places = list(range(n_prompts)) if indices is None else [int(i) for i in indices]
    if len(places) != n_prompts:
        raise ValueError(f"indices: {len(places)} for {n_prompts} prompts")
    return places


class SamplingEngine(ABC):
    """One engine per stage: ``sample`` many times, ``sync_weights`` after each optimizer step,
    ``close`` at the end. An engine is a module of :mod:`rollscale.lm.engines` whose class is
    registered with ``@SAMPLING_ENGINES.register(<the module's name, "_" as "-">)``."""

    tokenizer: PreTrainedTokenizerBase

    @classmethod
    def from_config(cls, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                    config: EngineConfig) -> "SamplingEngine":
        """The engine for ``model`` built from the stage's ``config`` (what ``make_engine`` calls)."""
        return cls(model, tokenizer)

    @abstractmethod
    def sample(self, prompts: Sequence[Prompt], n: int, config: SamplingConfig, seed: int,
               on_batch: OnBatch | None = None) -> list[list[Rollout]]:
        """``n`` rollouts per prompt; request (i, j) drawn with ``derive_seed(seed, i, j)``."""

    def sync_weights(self, model: PreTrainedModel) -> None:
        """Make the engine sample from ``model``'s current weights (no-op when it *is* the model)."""

    def sleep(self) -> None:
        """Release the engine's accelerator memory during the backward (where supported)."""

    def wake_up(self) -> None:
        """Undo :meth:`sleep` before the next ``sample``."""

    def close(self) -> None:
        """Shut the engine down and release its memory; the engine is unusable after."""

    def __enter__(self) -> "SamplingEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class TrainingModelEngine(SamplingEngine):
    """An engine that samples from the training model itself (the HF engines): the weights are
    always current, and the model belongs to the caller."""

    model: PreTrainedModel | None

    def sync_weights(self, model: PreTrainedModel) -> None:
        if model is not self.model:
            raise ValueError(f"{type(self).__name__} samples from the model it was built on; "
                             "build a new one for another model")

    def close(self) -> None:
        self.model = None  # drop only this engine's reference: the trainer goes on using the model


def free_accelerator_memory(collect: bool = False) -> None:
    """Give an ended run's or a closed engine's memory back now. With CUDA: a full garbage collection (a tensor
    held in a reference cycle is not freed before one) and the allocator's cached blocks released. Without, the last
    reference frees a tensor (a sweep run of the tiny model, with LoRA and the hf engine: no tensor left in a cycle
    after it), and a full collection scans every object of the process: 0.3 s in a stage process, more
    in a test worker, after every run and rung; ``collect`` where the caller holds cycles (vLLM's engine)."""
    import gc

    cuda = torch.cuda.is_available()
    if collect or cuda:
        gc.collect()
    if cuda:
        torch.cuda.empty_cache()
