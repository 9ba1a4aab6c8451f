"""The memory model (what a process holds: weights, optimiser state, one micro-batch), and what a
sharded run holds per rank (``sweep.devices_per_run`` > 1), for ``rollscale check``.

FSDP2 shards the weights, gradients and AdamW state (and the KL reference copy) over the run's N
processes, so each rank holds 1/N of them, plus one micro-batch whole (logits, their float32
log-softmax and the gradients of both: :func:`micro_batch_gb`, the
per-token cost measured on an H100) and, while sampling, the full weights gathered (docs/gpu.md).
The state is an estimate from the model's shapes (:func:`full_finetune_gb`'s
accounting); findings as (level, keys, message, fix) tuples that :mod:`rollscale.pipeline.check.findings` wraps.
"""

from __future__ import annotations

from pathlib import Path

from rollscale.config import StudyParams

__all__ = ["MICRO_BATCH_BYTES_PER_TOKEN_VOCAB", "full_finetune_gb", "lora_gb", "micro_batch_gb", "sharded_memory_findings"]

# What one micro-batch of the update holds, in bytes per padded token (``micro_batch_tokens``) and
# vocabulary entry: the model's logits, their float32 log-softmax slice, the gradients of both, and
# (lumped in, under 4 % at these shapes) the checkpointed hidden states. Measured on an
# NVIDIA H100 80GB (benchmarks/gpu_check.py, torch.cuda.max_memory_allocated; bf16 weights,
# autocast_bf16, gradient_checkpointing, random-initialised Qwen3-0.6B / 1.7B, vocabulary 151,936,
# 256-token completions, i.e. one 256-position float32 slice per row): 21.1-21.5 B, from update
# peaks of 55.8 GB (0.6B, 16,384 tokens), 15.6 GB (0.6B, 4,096) and 20.3 GB (1.7B, 4,096) less the
# weights and gradients; rounded up. float32 without autocast was measured on CPU only (process RSS,
# a tiny Llama of vocabulary 49,152, 2,048 tokens, the same completions): 18.8 B, under this figure
# (the logits are float32 already: no upcast copy), so one constant serves both dtypes; float32 on a
# GPU is not measured. Longer completions (several 256-position slices) held less per token on CPU
# (12.7 B at 1,008-token completions); not measured on a GPU.
MICRO_BATCH_BYTES_PER_TOKEN_VOCAB = 22.0


def micro_batch_gb(micro_batch_tokens: int, vocab: int) -> float:
    """GB that one micro-batch of the update holds (logits, their float32 log-softmax slice, the
    gradients of both): :data:`MICRO_BATCH_BYTES_PER_TOKEN_VOCAB` a padded token and vocabulary entry,
    measured on an H100 (docs/gpu.md)."""
    return micro_batch_tokens * vocab * MICRO_BATCH_BYTES_PER_TOKEN_VOCAB / 1e9


def full_finetune_gb(n_params: int, dtype: str, micro_batch_tokens: int, vocab: int, ranks: int = 1,
                     kl_reference: bool = False) -> float:
    """GB that full fine-tuning holds per process at its peak (from the second step on, when AdamW's
    moments exist): weights, gradients and AdamW's two moments, the KL reference's frozen copy of the
    weights when ``kl_reference`` (all sharded over ``ranks`` by FSDP2, so / ranks; arithmetic from
    shapes), plus one micro-batch whole (:func:`micro_batch_gb`, measured)."""
    width = 4 if dtype == "float32" else 2
    copies = 4 + (1 if kl_reference else 0)
    return n_params * copies * width / ranks / 1e9 + micro_batch_gb(micro_batch_tokens, vocab)


def lora_gb(n_params: int, dtype: str, micro_batch_tokens: int, vocab: int, ranks: int = 1) -> float:
    """GB that LoRA holds per process: the frozen weights (the KL reference is the model with its
    adapters off, no copy; the adapters and their AdamW state are small) plus one micro-batch."""
    width = 4 if dtype == "float32" else 2
    return n_params * width / ranks / 1e9 + micro_batch_gb(micro_batch_tokens, vocab)


def sharded_memory_findings(p: StudyParams) -> list[tuple[str, tuple[str, ...], str, str]]:
    """A note on a sharded run's memory per rank, when the model's files are here to size it."""
    n = p.sweep.devices_per_run
    if n == 1 or p.model.kind != "hf" or not p.model.name_or_path or not Path(p.model.name_or_path).exists():
        return []  # a hub id is not fetched by the check
    from rollscale.lm.model_info import inspect_model

    try:
        info = inspect_model(p.model.name_or_path, p.model.gguf_file)
    except (OSError, ValueError):
        return []
    width = 4 if p.model.dtype == "float32" else 2
    weights = info.n_params * width / 1e9
    micro = micro_batch_gb(p.sweep.train.micro_batch_tokens, info.vocab_size)
    gathered = info.n_params * (2 if p.sweep.train.autocast_bf16 else width) / 1e9
    if p.model.lora.enabled:  # the frozen base sharded; the adapters' gradients and AdamW state are small
        parts = [("frozen base weights", weights / n)]
    else:
        parts = [("weights", weights / n), ("gradients", weights / n), ("AdamW state", 2 * weights / n)]
        if p.sweep.train.kl_coef > 0:
            parts.append(("KL reference", weights / n))
    update = sum(gb for _, gb in parts) + micro
    said = " + ".join(f"{name} {gb:.1f}" for name, gb in parts)
    return [("note", ("sweep.devices_per_run",),
             f"per rank of {n} (estimates from the model's {info.n_params / 1e9:.2f}B parameters, docs/gpu.md): "
             f"{said} GB (sharded, each / {n}) + one micro-batch of {p.sweep.train.micro_batch_tokens:,} tokens "
             f"{micro:.1f} GB ({MICRO_BATCH_BYTES_PER_TOKEN_VOCAB:g} B a token and vocabulary entry, measured on an "
             "H100) "
             f"= ~{update:.1f} GB while updating; while sampling each rank also holds the full weights gathered "
             f"({gathered:.1f} GB) and its KV cache", "")]
