"""Batched HF ``generate`` with one random stream per request (CPU or GPU).

``generate``'s own sampling draws every row from one global generator, so a
row's sample would depend on its batch neighbours. Instead generation runs
greedy, and :class:`SeededSampling` (the last logits processor) applies
temperature, top-k and top-p, adds Gumbel noise from the row's own
``torch.Generator`` and keeps only the argmax: the argmax of logits + Gumbel
noise is an exact sample of softmax(logits) (the Gumbel-max trick). It records
the sampled token's log-prob on the way.

Under :func:`generation_deadline` a call stops inside its batch at the stop time (a decoding step's
check) and raises :class:`GenerationTimeUp`: its answers, cut short, would score as wrong.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Sequence

import torch
from transformers import (
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    TopKLogitsWarper,
    TopPLogitsWarper,
)
from transformers.generation.stopping_criteria import MaxTimeCriteria, StoppingCriteriaList

from rollscale.lm.engines.base import (
    EngineConfig,
    OnBatch,
    Prompt,
    TrainingModelEngine,
    check_call,
    eos_ids,
    make_rollout,
    prompt_ids,
    request_places,
)
from rollscale.core.seeds import derive_seed
from rollscale.core.rollouts import Rollout, SamplingConfig
from rollscale.registry import SAMPLING_ENGINES


class SeededSampling(LogitsProcessor):
    """Sample each row from its own generator; the result is a one-hot score row for greedy decoding."""

    def __init__(self, config: SamplingConfig, seeds: Sequence[int], device: torch.device):
        self.config = config
        self.generators = [torch.Generator(device=device).manual_seed(s) for s in seeds]
        self.warpers = [w for w in (
            TopKLogitsWarper(config.top_k) if config.top_k > 0 else None,
            TopPLogitsWarper(config.top_p) if config.top_p < 1 else None,
        ) if w is not None]
        self.logprobs: list[torch.Tensor] = []  # per decode step, the chosen tokens' log-probs

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        logits = scores.float()
        if self.config.temperature == 0:
            choice = logits.argmax(-1)
            logp = torch.log_softmax(logits, -1)
        else:
            logits = logits / self.config.temperature
            for warp in self.warpers:
                logits = warp(input_ids, logits)
            logp = torch.log_softmax(logits, -1)
            uniform = torch.stack([
                torch.rand(logits.shape[-1], generator=g, device=logits.device) for g in self.generators
            ])
            # Gumbel(0, 1) = -log(-log U); U = 0 gives -inf, never chosen
            choice = (logp - torch.log(-torch.log(uniform))).argmax(-1)
        self.logprobs.append(logp.gather(1, choice[:, None]).squeeze(1))
        onehot = torch.full_like(scores, float("-inf"))
        return onehot.scatter_(1, choice[:, None], 0.0)


class GenerationTimeUp(RuntimeError):
    """A generation stopped at :func:`generation_deadline`'s stop time; its batch is dropped."""


_DEADLINE: ContextVar[float | None] = ContextVar("generation_deadline", default=None)


@contextmanager
def generation_deadline(at: float | None):
    """Within it, the ``hf`` engine stops a generation at ``at`` (``time.perf_counter()``; None: no stop
    time) and raises :class:`GenerationTimeUp`: a measurement with a time budget keeps it inside a batch."""
    token = _DEADLINE.set(at)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def _stop_at(at: float | None) -> StoppingCriteriaList | None:
    """The stopping criterion of a stop time ``at`` (perf_counter), None without one; past it: time up now."""
    if at is None:
        return None
    left = at - time.perf_counter()
    if left <= 0:
        raise GenerationTimeUp("the stop time passed before the generation started")
    return StoppingCriteriaList([MaxTimeCriteria(max_time=left)])


@contextmanager
def blank_generation_config(model: PreTrainedModel):
    """transformers fills unset generation fields from the model's generation_config (e.g. a
    repetition penalty); swap in a blank one so only the settings given here apply."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft wraps the model
    saved = inner.generation_config
    inner.generation_config = GenerationConfig()
    try:
        yield
    finally:
        inner.generation_config = saved


@SAMPLING_ENGINES.register("hf")
class HFSampler(TrainingModelEngine):
    """Batched ``model.generate`` with left padding and the KV cache, on the training model itself.

    The engine *is* the training model, so ``sync_weights`` has nothing to do and its
    log-probs differ from the trainer's only by the padded, cached decode's rounding."""

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, batch_size: int = 512):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.model, self.tokenizer, self.batch_size = model, tokenizer, batch_size
        self.tokenizer.padding_side = "left"
        self.eos_ids = eos_ids(model, tokenizer)

    @classmethod
    def from_config(cls, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, config: EngineConfig) -> HFSampler:
        if config.dtype != "auto":
            raise ValueError("sampling.engine_dtype: the 'hf' engine samples with the training model itself; "
                             "use 'auto' (another dtype needs the 'vllm' engine)")
        return cls(model, tokenizer, batch_size=config.batch_size)

    @torch.no_grad()
    def sample(self, prompts: Sequence[Prompt], n: int, config: SamplingConfig, seed: int,
               on_batch: OnBatch | None = None, indices: Sequence[int] | None = None) -> list[list[Rollout]]:
        """``indices``: the prompts' places in the call's seeds (:func:`request_places`)."""
        check_call(prompts, n)
        ids = prompt_ids(self.tokenizer, prompts)
        places = request_places(len(ids), indices)
        flat = [(ids[i], derive_seed(seed, places[i], j)) for i in range(len(ids)) for j in range(n)]
        out: list[Rollout] = []
        device = next(self.model.parameters()).device
        was_training = self.model.training
        self.model.eval()
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eos_ids[0]
        try:
            for start in range(0, len(flat), self.batch_size):
                chunk = flat[start : start + self.batch_size]
                width = max(len(p) for p, _ in chunk)
                input_ids = torch.full((len(chunk), width), pad, dtype=torch.long)
                attention = torch.zeros((len(chunk), width), dtype=torch.long)
                for row, (p, _) in enumerate(chunk):
                    input_ids[row, width - len(p):] = torch.tensor(p, dtype=torch.long)
                    attention[row, width - len(p):] = 1
                sampling = SeededSampling(config, [s for _, s in chunk], device)
                generation = GenerationConfig(
                    max_new_tokens=config.max_new_tokens, do_sample=False, num_beams=1,
                    pad_token_id=pad, eos_token_id=self.eos_ids,
                )
                at = _DEADLINE.get()
                stop = _stop_at(at)
                with blank_generation_config(self.model):
                    gen = self.model.generate(
                        input_ids=input_ids.to(device), attention_mask=attention.to(device),
                        generation_config=generation, logits_processor=LogitsProcessorList([sampling]),
                        **({"stopping_criteria": stop} if stop is not None else {}),
                    )
                if at is not None and time.perf_counter() >= at:
                    raise GenerationTimeUp(f"generation stopped at its stop time, {len(chunk)} rollouts cut short")
                completions = gen[:, width:].tolist()
                logprobs = torch.stack(sampling.logprobs, 1).tolist() if sampling.logprobs else [[]] * len(chunk)
                for row_ids, row_lp in zip(completions, logprobs):
                    out.append(make_rollout(self.tokenizer, row_ids, row_lp, self.eos_ids, config.max_new_tokens))
                if on_batch is not None:
                    on_batch(len(chunk))
        finally:
            if was_training:
                self.model.train()
        return [out[i * n : (i + 1) * n] for i in range(len(prompts))]
