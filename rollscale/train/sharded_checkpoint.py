"""Checkpoints of a sharded run (``sweep.devices_per_run`` > 1) with torch.distributed.checkpoint
(DCP): every rank writes its own shards of the trainable weights and the AdamW state, nothing is
gathered on one process (science §1: C, the data position and the rows stay in ``state.json`` and
the row parts, as in one process; the layout: :mod:`rollscale.train.manifest`).

Saving: every rank writes into the store's shard folder, rank 0 then commits the checkpoint
(state.json, the rows, a manifest with every shard file's sha256) exactly as a one-process save,
and all ranks meet at a barrier, so no rank resumes from a checkpoint that is not whole.
Loading: DCP reads each rank's shards for the model as it is sharded now, so a run may resume with
another number of processes (one process included); a one-file checkpoint (``model.pt``) is read
by rank 0 and scattered.
"""

from __future__ import annotations

import shutil

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
    set_state_dict,
)

from rollscale.train.distributed import Ranks


def checkpoint_state(model, optimizer, trainable, ranks: Ranks | None) -> tuple[dict, dict]:
    """The trainable weights and the optimizer state to checkpoint: copies in one process;
    in a sharded run this rank's shards (DTensors, keyed by parameter name), for :class:`_RankStore`."""
    if ranks is None:
        return {name: p.detach().cpu().clone() for name, p in trainable.items()}, optimizer.state_dict()
    weights, optim = get_state_dict(model, optimizer)
    return {k: v for k, v in weights.items() if k in trainable}, optim


def restore_state(model, optimizer, trainable, ckpt, ranks: Ranks | None) -> None:
    """Load ``ckpt``'s weights and optimizer state into the model as it is (sharded or not)."""
    if ckpt.shards is not None:
        weights, optim = get_state_dict(model, optimizer)  # this rank's slots, filled in place by DCP
        state = {"model": {k: v for k, v in weights.items() if k in trainable}, "optimizer": optim}
        try:
            dcp.load(state, checkpoint_id=ckpt.shards)
        except Exception as err:  # DCP raises CheckpointException (a BaseException subclass of its own) per rank
            raise ValueError(f"checkpoint {ckpt.path} does not fit this model: {err}") from None
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"],
                       options=StateDictOptions(strict=False))
        return
    if ranks is None:
        ckpt.load_weights(trainable)
        optimizer.load_state_dict(ckpt.optimizer_state())
        return
    weights, optim = {}, {}
    if ranks.leader:
        weights, optim = ckpt.model_state(), ckpt.optimizer_state()
        if set(weights) != set(trainable):
            raise ValueError(f"checkpoint {ckpt.path} does not fit this model (parameter names differ)")
    options = StateDictOptions(full_state_dict=True, cpu_offload=True, broadcast_from_rank0=True, strict=False)
    set_model_state_dict(model, weights, options=options)
    set_optimizer_state_dict(model, optimizer, optim, options=options)


def rank_store(store, ranks: Ranks | None):
    """The run's store as this rank uses it: itself in one process; in a sharded run every rank
    writes its shards, rank 0 commits the checkpoint and the rows, the others only read."""
    if ranks is None:
        return store
    return _RankStore(store, ranks)


class _RankStore:
    """A sharded run's view of its :class:`~rollscale.train.checkpoint.RunStore` (see :func:`rank_store`)."""

    def __init__(self, store, ranks: Ranks):
        self.store, self.ranks = store, ranks

    def latest(self):
        return self.store.latest()

    def done(self):
        return self.store.done()

    def check_same_run(self, *args) -> None:
        self.store.check_same_run(*args)

    def save(self, step: int, model_state: dict, optimizer_state: dict, state: dict, step_rows=(), eval_rows=()):
        """Collective: each rank's shards into the shard folder, then rank 0 commits the checkpoint."""
        folder = self.store.shard_folder(step)
        if self.ranks.leader:
            shutil.rmtree(folder, ignore_errors=True)  # a crashed save's leftovers
        self.ranks.barrier()
        try:
            dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=folder)
            self.ranks.barrier()  # every rank's file and DCP's metadata are written
            if self.ranks.leader:
                return self.store.save(step, None, None, state, step_rows, eval_rows, shards=folder)
            return None
        finally:
            self.ranks.barrier()

    def rollback_to(self, checkpoint) -> None:
        if self.ranks.leader:
            self.store.rollback_to(checkpoint)
        self.ranks.barrier()

    def mark_done(self, *args, **kwargs) -> None:
        if self.ranks.leader:
            self.store.mark_done(*args, **kwargs)
