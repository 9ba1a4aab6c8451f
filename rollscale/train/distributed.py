"""One run over several processes on one node: torch FSDP2 (science §1, §3).

A run with ``sweep.devices_per_run = N > 1`` is N processes (``torchrun --nproc_per_node N``),
one per device. Every decoder layer and the root are ``fully_shard``-ed, so each rank holds
1/N of the parameters, gradients and AdamW state. The step stays the step of one process:

- sampling is data-parallel by whole prompt groups (:class:`ShardedSampler`): of each
  sampling call's prompts, rank r generates prompts r, r+N, ..., each request with the seed
  the one-process call gives it (the engine's ``indices``), and the groups are gathered,
  so every rank sees every group: the allocation rule (seeded identically on every rank)
  decides the same on all of them, and C counts each rollout once;
- each rank trains on its share of the groups (:func:`group_rows`), with the loss
  normalisers of the whole batch, so the ranks' losses add up to the one-process loss;
  FSDP averages gradients over ranks, so each rank's loss is scaled by N (:attr:`Ranks.loss_scale`);
- the ``steps`` row's sums and token-weighted means are all-reduced (:meth:`Ranks.sum`).

Gloo on CPU (what the tests run), NCCL on CUDA; multi-node runs are out of scope.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from rollscale.core.rollouts import Rollout, SamplingConfig
from rollscale.lm.engines.base import OnBatch, Prompt, SamplingEngine
from rollscale.lm.engines.hf import HFSampler
from rollscale.lm.engines.vllm import VLLMEngine


@dataclass(frozen=True)
class Ranks:
    """This process's place in a sharded run: ``rank`` of ``world`` processes."""

    rank: int
    world: int

    @property
    def loss_scale(self) -> float:
        """FSDP's reduce-scatter averages gradients over ranks; a rank's share of the batch loss
        times N makes the average the sum, i.e. the one-process gradient."""
        return float(self.world)

    @property
    def leader(self) -> bool:
        return self.rank == 0

    def share(self, n: int) -> list[int]:
        """This rank's items of ``n`` (r, r+N, ...)."""
        return list(range(self.rank, n, self.world))

    def sum(self, values: Sequence[float]) -> list[float]:
        """Element-wise sum over ranks (float64)."""
        t = torch.tensor(list(values), dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t.tolist()

    def max(self, value: int) -> int:
        t = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())

    def gather(self, obj) -> list:
        """Every rank's ``obj``, in rank order, on every rank."""
        out: list = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        dist.barrier()


def init_ranks(device_type: str) -> Ranks:
    """Join the process group torchrun set up (RANK, WORLD_SIZE, MASTER_ADDR in the environment):
    gloo on CPU; on CUDA NCCL for CUDA tensors (FSDP2) beside gloo for the CPU tensors
    :meth:`Ranks.sum` / :meth:`Ranks.max` and the Gram reduce (an NCCL-only group has no backend
    for CPU tensors), each rank on its LOCAL_RANK's GPU."""
    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise RuntimeError(f"a sharded run needs torchrun's environment; missing {', '.join(missing)}")
    if device_type == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    if not dist.is_initialized():
        dist.init_process_group("cpu:gloo,cuda:nccl" if device_type == "cuda" else "gloo")
    return Ranks(dist.get_rank(), dist.get_world_size())


def destroy_ranks() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def shard_model(model: torch.nn.Module, bf16: bool = False) -> torch.nn.Module:
    """``fully_shard`` each decoder layer (the model's ``_no_split_modules``) and then the root, in
    place; ``bf16``: compute in bfloat16, reduce gradients in float32 (as today's autocast)."""
    inner = _root(model)
    layer_names = set(getattr(model, "_no_split_modules", None) or ()) | set(getattr(inner, "_no_split_modules", None) or ())
    if not layer_names:
        raise ValueError(f"{type(model).__name__}: no decoder layer class (_no_split_modules) to shard by")
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else MixedPrecisionPolicy()
    layers = [m for m in model.modules() if type(m).__name__ in layer_names]
    for layer in layers:
        fully_shard(layer, mp_policy=mp)
    fully_shard(inner, mp_policy=mp)
    return model


def _root(model: torch.nn.Module) -> torch.nn.Module:
    """The module every forward goes through: the model, or the transformers model a peft (LoRA)
    model wraps (peft's ``generate`` calls it directly, so FSDP's root is there)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


class _Unsharded:
    """Full parameters on every rank while sampling: forwards then run without collectives, so
    ranks may decode different numbers of tokens (what data-parallel ``generate`` needs)."""

    def __init__(self, model: torch.nn.Module):
        self.modules = [m for m in model.modules() if isinstance(m, FSDPModule)]
        self.root = _root(model)

    def __enter__(self):
        for m in self.modules:
            m.unshard()
        self.root.set_reshard_after_forward(False)

    def __exit__(self, *exc):
        self.root.set_reshard_after_forward(True)
        for m in self.modules:
            m.reshard()


class ShardedSampler(SamplingEngine):
    """The engine of a sharded run: each rank generates its share of a call's prompts
    (r, r+N, ...), and every rank gets every group. Request (i, j) has the seed the one-process
    call gives it, so the rollouts equal the one-process engine's (to the rounding of a different
    padding width or batch). The rank's engine is the training model with its weights gathered
    (``hf``) or a colocated vLLM engine per rank, synced with the gathered weights (``vllm``)."""

    def __init__(self, engine: SamplingEngine, model: torch.nn.Module, ranks: Ranks):
        if not isinstance(engine, (HFSampler, VLLMEngine)):
            raise ValueError(f"sweep.devices_per_run > 1 samples with the 'hf' or 'vllm' engine; got "
                             f"{type(engine).__name__} (set sampling.backend: hf or vllm)")
        self.engine, self.model, self.ranks = engine, model, ranks
        self.tokenizer = engine.tokenizer

    def sample(self, prompts: Sequence[Prompt], n: int, config: SamplingConfig, seed: int,
               on_batch: OnBatch | None = None) -> list[list[Rollout]]:
        mine = self.ranks.share(len(prompts))
        # hf samples with the training model: its full weights on every rank meanwhile; vLLM holds its own
        whole = _Unsharded(self.model) if isinstance(self.engine, HFSampler) else contextlib.nullcontext()
        with whole:
            groups = self.engine.sample([prompts[i] for i in mine], n, config, seed, on_batch=on_batch,
                                        indices=mine) if mine else []
        out: list[list[Rollout] | None] = [None] * len(prompts)
        for rank, rank_groups in enumerate(self.ranks.gather(groups)):
            for i, group in zip(range(rank, len(prompts), self.ranks.world), rank_groups):
                out[i] = group
        return out  # type: ignore[return-value]

    def sync_weights(self, model) -> None:
        """Collective for vLLM: every rank gathers the sharded weights into its engine."""
        self.engine.sync_weights(model)

    def sleep(self) -> None:
        self.engine.sleep()

    def wake_up(self) -> None:
        self.engine.wake_up()

    def close(self) -> None:
        self.engine.close()


def group_rows(group_sizes: Sequence[int], ranks: Ranks) -> np.ndarray:
    """The batch rows of this rank's groups (r, r+N, ...) when groups are laid out in order."""
    starts = np.concatenate([[0], np.cumsum(group_sizes)]).astype(np.int64)
    rows = [np.arange(starts[g], starts[g + 1]) for g in ranks.share(len(group_sizes))]
    return np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64)



def shard_run(model, ref_model, engine: SamplingEngine, config, ranks: Ranks
              ) -> tuple[SamplingEngine, dict[str, torch.nn.Parameter]]:
    """Shard a run's model (and its KL reference copy) in place; returns the data-parallel engine
    and the trainable parameters (sharded: the optimizer must be built on these). On CUDA with
    ``train.autocast_bf16`` FSDP computes in bfloat16 and reduces gradients in float32."""
    bf16 = config.train.autocast_bf16 and next(model.parameters()).device.type == "cuda"
    shard_model(model, bf16)
    if ref_model is not None:
        shard_model(ref_model, bf16)
    trainable = {name: p for name, p in model.named_parameters() if p.requires_grad}
    return ShardedSampler(engine, model, ranks), trainable


def gram_over_ranks(model: torch.nn.Module, ranks: Ranks, gram: Callable[[list[str]], np.ndarray]) -> np.ndarray:
    """The Gram matrix of every rollout's gradient (science §6.1) in a sharded run, equal to the
    one-process matrix: with full parameters on every rank (as for sampling), each rank runs the
    whole batch and computes the blocks of its share of the trainable parameters (``gram(exclude)``
    with the others excluded; shares balanced by size), and the shares' matrices are summed over ranks."""
    sizes = sorted(((p.numel(), name) for name, p in model.named_parameters() if p.requires_grad), reverse=True)
    load, exclude = [0] * ranks.world, []
    for numel, name in sizes:  # largest first, each to the least-loaded rank: the same on every rank
        owner = load.index(min(load))
        load[owner] += numel
        if owner != ranks.rank:
            exclude.append(name)
    with _Unsharded(model):
        k = torch.from_numpy(np.ascontiguousarray(gram(exclude), dtype=np.float64))
    dist.all_reduce(k, op=dist.ReduceOp.SUM)
    return k.numpy()


def rank_rows(ranks: Ranks | None, groups: Sequence[Sequence]) -> dict:
    """``policy_update``'s arguments for this rank's share of the step's groups ({} in one process)."""
    if ranks is None:
        return {}
    return {"rows": group_rows([len(g) for g in groups], ranks), "ranks": ranks}
