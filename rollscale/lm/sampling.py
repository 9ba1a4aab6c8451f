"""Rollout samplers: batched HF ``generate`` (CPU or GPU) and vLLM (GPU only).

Both return, per prompt, ``n`` :class:`Rollout` objects with the completion,
its token ids and count, and whether it was truncated at ``max_new_tokens``.
vLLM is imported only when that backend is constructed, so the CPU path never
touches it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    max_new_tokens: int = 8

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")


@dataclass
class Rollout:
    """One sampled completion of one prompt."""

    text: str
    token_ids: list[int]  # completion tokens, EOS included when produced
    n_tokens: int
    truncated: bool  # hit max_new_tokens without an end marker
    reward: float = float("nan")
    extra: dict = field(default_factory=dict)
    # log-probs of token_ids under the sampler (a separate engine); None when the
    # sampler is the training model itself, whose log-probs the trainer computes
    logprobs: list[float] | None = None


class Sampler(Protocol):
    tokenizer: PreTrainedTokenizerBase

    def sample(
        self, prompts: Sequence[str], n: int, config: SamplingConfig, seed: int
    ) -> list[list[Rollout]]: ...


class HFSampler:
    """Batched ``model.generate`` with left padding and the KV cache.

    ``prompts`` are already rendered (chat template or BOS applied, see
    :func:`rollscale.lm.models.render_prompt`). Sampling is seeded per call, so the
    same call on CPU repeats exactly.
    """

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, batch_size: int = 512):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.model, self.tokenizer, self.batch_size = model, tokenizer, batch_size
        self.tokenizer.padding_side = "left"
        self.eos_ids = self._eos_ids()

    def sync_weights(self, model: PreTrainedModel) -> None:
        """Nothing to do: this sampler generates with the training model itself."""

    def close(self) -> None:
        """Nothing to release: the model belongs to the trainer."""

    def _eos_ids(self) -> set[int]:
        ids = self.model.generation_config.eos_token_id
        ids = set(ids if isinstance(ids, list) else [ids] if ids is not None else [])
        if self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        return ids

    def _generation_kwargs(self, config: SamplingConfig) -> dict:
        if config.temperature == 0:
            return {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
        # set all three explicitly: transformers otherwise applies top_k=50 silently
        return {
            "do_sample": True,
            "temperature": config.temperature,
            "top_p": config.top_p,
            "top_k": config.top_k if config.top_k > 0 else None,
        }

    @torch.no_grad()
    def sample(
        self,
        prompts: Sequence[str],
        n: int,
        config: SamplingConfig,
        seed: int,
        on_batch: Callable[[int], None] | None = None,
    ) -> list[list[Rollout]]:
        if n < 1:
            raise ValueError(f"n (samples per prompt) must be >= 1, got {n}")
        torch.manual_seed(seed)
        flat = [p for p in prompts for _ in range(n)]
        out: list[Rollout] = []
        device = next(self.model.parameters()).device
        was_training = self.model.training
        self.model.eval()
        pad = self.tokenizer.pad_token_id
        for start in range(0, len(flat), self.batch_size):
            chunk = flat[start : start + self.batch_size]
            enc = self.tokenizer(chunk, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
            gen = self.model.generate(
                **enc,
                max_new_tokens=config.max_new_tokens,
                pad_token_id=pad,
                eos_token_id=sorted(self.eos_ids),
                **self._generation_kwargs(config),
            )
            completions = gen[:, enc["input_ids"].shape[1] :].tolist()
            for ids in completions:
                out.append(self._rollout(ids, config.max_new_tokens))
            if on_batch is not None:
                on_batch(len(chunk))
        if was_training:
            self.model.train()
        return [out[i * n : (i + 1) * n] for i in range(len(prompts))]

    def _rollout(self, ids: list[int], max_new_tokens: int) -> Rollout:
        # cut at the first end marker; what follows is padding
        end = next((i for i, t in enumerate(ids) if t in self.eos_ids), None)
        kept = ids[: end + 1] if end is not None else ids
        text = self.tokenizer.decode(kept, skip_special_tokens=True)
        return Rollout(text=text, token_ids=kept, n_tokens=len(kept), truncated=end is None and len(ids) >= max_new_tokens)


class VLLMSampler:
    """vLLM's ``LLM.generate`` with ``SamplingParams(n=k)`` (GPU only)."""

    def __init__(self, model_path: str, seed: int = 0, gpu_memory_utilization: float = 0.85, **llm_kwargs):
        from vllm import LLM  # imported here: the CPU path never imports vLLM

        self.llm = LLM(model=model_path, seed=seed, gpu_memory_utilization=gpu_memory_utilization, **llm_kwargs)
        self.tokenizer = self.llm.get_tokenizer()

    def sample(self, prompts: Sequence[str], n: int, config: SamplingConfig, seed: int, on_batch=None) -> list[list[Rollout]]:
        from vllm import SamplingParams

        params = SamplingParams(
            n=n,
            temperature=config.temperature,
            top_p=config.top_p,
            top_k=config.top_k if config.top_k > 0 else -1,
            max_tokens=config.max_new_tokens,
            seed=seed,
        )
        results = self.llm.generate(list(prompts), params, use_tqdm=False)
        if on_batch is not None:
            on_batch(len(prompts) * n)
        return [
            [
                Rollout(
                    text=o.text,
                    token_ids=list(o.token_ids),
                    n_tokens=len(o.token_ids),
                    truncated=o.finish_reason == "length",
                )
                for o in r.outputs
            ]
            for r in results
        ]
