"""What a sharded run holds per rank (``sweep.devices_per_run`` > 1), for ``rollscale check``.

FSDP2 shards the weights, gradients and AdamW state (and the KL reference copy) over the run's N
processes, so each rank holds 1/N of them, plus one micro-batch whole (logits, their float32
log-softmax and the gradients of both: :func:`rollscale.pipeline.init_values.micro_batch_gb`, the
per-token cost measured on an H100) and, while sampling, the full weights gathered (docs/gpu.md).
The state is an estimate from the model's shapes (:func:`~rollscale.pipeline.init_values.full_finetune_gb`'s
accounting); findings as (level, keys, message, fix) tuples that :mod:`rollscale.pipeline.check` wraps.
"""

from __future__ import annotations

from pathlib import Path

from rollscale.config import StudyParams
from rollscale.pipeline.init_values import MICRO_BATCH_BYTES_PER_TOKEN_VOCAB, micro_batch_gb

__all__ = ["sharded_memory_findings"]


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
