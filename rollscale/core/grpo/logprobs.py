"""Per-token log-probabilities and entropies of sampled completions (science §3).

The full-vocabulary softmax is the memory peak of an RL step: ``[N, T, V]``
float32 is hundreds of GB at B = 256, T = 600, V = 151k. Here the model's
logits stay in the model's dtype and the float32 log-softmax is taken over
slices of ``position_chunk`` positions, each under activation checkpointing
when gradients flow, so no float32 copy of the whole batch's logits is ever
held (the selective log-softmax of TRL, chunked as in verl's
``logprobs_from_logits``).
"""

from __future__ import annotations

import inspect
import math

import torch
from torch.utils.checkpoint import checkpoint

_POSITION_CHUNK = 256


def _accepts_logits_to_keep(model: torch.nn.Module) -> bool:
    target = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft wrappers
    try:
        return "logits_to_keep" in inspect.signature(target.forward).parameters
    except (TypeError, ValueError):
        return False


def _logp_entropy(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float, entropy: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Float32 log-prob of ``targets`` and (when asked) entropy of one slice of logits."""
    x = logits.float()
    if temperature != 1.0:
        x = x / temperature
    log_norm = torch.logsumexp(x, dim=-1)
    # gather + logsumexp avoids a second [.., V] tensor of log-probs
    logp = torch.gather(x, -1, targets.unsqueeze(-1)).squeeze(-1) - log_norm
    if not entropy:
        return logp, None
    return logp, log_norm - (torch.softmax(x, dim=-1) * x).sum(dim=-1)


def _completion_logits(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    completion_mask: torch.Tensor,
    temperature: float,
    position_chunk: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Checked inputs -> (logits of the rows predicting each completion token, those tokens)."""
    if input_ids.ndim != 2:
        raise ValueError(f"input_ids must be 2-D [N, L], got shape {tuple(input_ids.shape)}")
    if attention_mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask must have shape {tuple(input_ids.shape)}, got {tuple(attention_mask.shape)}")
    if completion_mask.ndim != 2 or completion_mask.shape[0] != input_ids.shape[0]:
        raise ValueError(f"completion_mask must be [N={input_ids.shape[0]}, T_c], got {tuple(completion_mask.shape)}")
    t_c = completion_mask.shape[1]
    if not 1 <= t_c < input_ids.shape[1]:
        raise ValueError(
            f"completion width T_c={t_c} must be in [1, L={input_ids.shape[1]}) (at least one prompt token)"
        )
    if not (math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be > 0, got {temperature!r}")
    if position_chunk < 1:
        raise ValueError(f"position_chunk must be >= 1, got {position_chunk!r}")

    position_ids = (attention_mask.long().cumsum(dim=1) - 1).clamp(min=0)
    kwargs = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "use_cache": False,
    }
    if _accepts_logits_to_keep(model):
        kwargs["logits_to_keep"] = t_c + 1
    # Row j predicts token j + 1: the rows before each completion token. In the model's dtype.
    logits = model(**kwargs).logits[:, -(t_c + 1) : -1, :]
    return logits, input_ids[:, -t_c:]


def token_logprobs_and_entropy(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    completion_mask: torch.Tensor,
    temperature: float = 1.0,
    entropy_grad: bool = True,
    position_chunk: int = _POSITION_CHUNK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-probs and entropies of the completions, one forward pass (science §3).

    ``input_ids`` is ``[N, P + T_c]``: left-padded prompts of width ``P``
    followed by right-padded completions of width ``T_c = completion_mask.shape[1]``.
    Position ids are passed as ``cumsum(attention_mask) - 1`` so each sequence
    starts at position 0 whatever its left padding; the model then sees what it
    sees unpadded (models with absolute position embeddings need this; for
    rotary ones it changes nothing beyond rounding). Logits are divided by
    ``temperature`` (as verl and TRL do) so the log-probs are those of the
    distribution sampled from. Only the last ``T_c + 1`` logit rows are
    requested (``logits_to_keep``) where the model supports it.

    Args:
        model: a Hugging Face causal LM (or a peft wrapper of one).
        input_ids: [N, L] token ids.
        attention_mask: [N, L] 1 for real tokens.
        completion_mask: [N, T_c] 1 for real completion tokens.
        temperature: sampling temperature (> 0).
        entropy_grad: False computes the entropy without autograd (for logging
            only; its gradient is then not available).
        position_chunk: completion positions per float32 log-softmax slice.

    Returns:
        ``(logp, entropy)``, each [N, T_c] float32, zero where ``completion_mask`` is 0.
        ``entropy`` is that of the full next-token distribution at each completion position.
    """
    logits, targets = _completion_logits(model, input_ids, attention_mask, completion_mask, temperature, position_chunk)
    t_c = targets.shape[1]
    logps, ents = [], []
    for lo in range(0, t_c, position_chunk):
        part, tgt = logits[:, lo : lo + position_chunk], targets[:, lo : lo + position_chunk]
        if torch.is_grad_enabled() and part.requires_grad:
            # recompute the float32 slice in backward instead of keeping it
            logp, ent = checkpoint(_logp_entropy, part, tgt, temperature, use_reentrant=False)
        else:
            logp, ent = _logp_entropy(part, tgt, temperature)
        logps.append(logp)
        ents.append(ent if entropy_grad else ent.detach())
    cm = completion_mask.to(torch.float32)
    return torch.cat(logps, dim=1) * cm, torch.cat(ents, dim=1) * cm


def token_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    completion_mask: torch.Tensor,
    temperature: float = 1.0,
    position_chunk: int = _POSITION_CHUNK,
) -> torch.Tensor:
    """Per-token log-probs only, as constants: the reference policy's for the KL term (science §3).

    The same numbers as :func:`token_logprobs_and_entropy`'s ``logp``, without
    autograd and without the entropy's second pass over the vocabulary (the
    reference forward was the step's costliest call after generation: see
    docs/benchmarks.md, "One sweep step"). Returns [N, T_c] float32, zero where
    ``completion_mask`` is 0.
    """
    with torch.no_grad():
        logits, targets = _completion_logits(model, input_ids, attention_mask, completion_mask, temperature,
                                             position_chunk)
        logps = [
            _logp_entropy(logits[:, lo : lo + position_chunk], targets[:, lo : lo + position_chunk], temperature,
                          entropy=False)[0]
            for lo in range(0, targets.shape[1], position_chunk)
        ]
        return torch.cat(logps, dim=1) * completion_mask.to(torch.float32)
