"""Memory per rank of a sharded run (``sweep.devices_per_run``) against N, on CPU (gloo).

    python benchmarks/sharded_memory.py --devices 1 2 4

For each N, N processes (one torch thread each) build the same random-initialised Llama
(``--hidden`` wide, ``--layers`` deep; KL on, so with its reference copy), shard it with FSDP2
(N = 1: today's one-process trainer) and run two GRPO steps. Each rank reports the bytes it
holds of weights, AdamW state and the KL reference (their local shards) and its peak resident
memory (``ru_maxrss``) less its resident memory before the model was built, which also counts
the full weights gathered for sampling, gradients and one micro-batch's activations.
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import sys
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rollscale.core.problems.sets import reasoning_gym_problems  # noqa: E402
from rollscale.core.rollouts import SamplingConfig  # noqa: E402
from rollscale.lm.models import char_tokenizer, tiny_llama  # noqa: E402
from rollscale.train.distributed import destroy_ranks, init_ranks  # noqa: E402
from rollscale.train.checkpoint import RunStore  # noqa: E402
from rollscale.train.run_config import RunConfig  # noqa: E402
from rollscale.train.sharded_checkpoint import checkpoint_state, rank_store  # noqa: E402
from rollscale.train.trainer import GRPOTrainer  # noqa: E402


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _local_mb(tensors) -> float:
    total = 0
    for t in tensors:
        t = t.to_local() if hasattr(t, "to_local") else t
        total += t.numel() * t.element_size()
    return total / 2**20


def _rank(rank: int, world: int, port: int, hidden: int, layers: int, out: str) -> None:
    torch.set_num_threads(1)
    ranks = None
    if world > 1:
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        ranks = init_ranks("cpu")
    tok = char_tokenizer()
    problems = reasoning_gym_problems("chain_sum", 40, 0, dict(min_terms=2, max_terms=2, min_digits=1, max_digits=1),
                                      prompt_style="expression")
    config = RunConfig(n=4, b_problem=8, c_max=64, noise_every=0, sampling=SamplingConfig(temperature=1.0, max_new_tokens=8),
                       train=dict(kl_coef=0.01, micro_batch_tokens=512, warmup_steps=0))
    base = _rss_mb()
    model = tiny_llama(len(tok), hidden_size=hidden, num_layers=layers, num_heads=8, intermediate_size=hidden * 3,
                       max_positions=64)
    trainer = GRPOTrainer(model, tok, problems[:32], problems[32:], config, use_chat_template=False, ranks=ranks)
    for _ in range(2):
        trainer.train_step()
    optim = [v for s in trainer.optimizer.state.values() for v in s.values() if torch.is_tensor(v) and v.dim()]
    row = {"world": world, "rank": rank, "weights_mb": _local_mb(trainer.trainable.values()),
           "adamw_mb": _local_mb(optim),
           "reference_mb": _local_mb(trainer.ref_model.parameters()) if trainer.ref_model is not None else 0.0,
           "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - base,
           "params": sum((p.full_tensor() if hasattr(p, "full_tensor") else p).numel() for p in trainer.trainable.values())}
    # one checkpoint: N = 1 writes model.pt + optimizer.pt; N > 1 each rank its DCP shard file
    store = rank_store(RunStore(f"{out}.{world}.store"), ranks)
    t0 = time.perf_counter()
    ckpt = store.save(1, *checkpoint_state(trainer.model, trainer.optimizer, trainer.trainable, ranks), {"step": 1})
    row["save_s"] = time.perf_counter() - t0
    if ranks is not None:
        ranks.barrier()
        ckpt = RunStore(f"{out}.{world}.store").latest()
    files = [ckpt.shards / f"__{rank}_0.distcp"] if ckpt.shards else [ckpt.path / "model.pt", ckpt.path / "optimizer.pt"]
    row["ckpt_mb"] = sum(f.stat().st_size for f in files) / 2**20
    torch.save(row, f"{out}.{world}.{rank}.pt")
    destroy_ranks()


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    args = ap.parse_args()
    out = f"/tmp/sharded_memory_{os.getpid()}"
    rows = []
    for world in args.devices:
        mp.start_processes(_rank, args=(world, _port(), args.hidden, args.layers, out), nprocs=world, join=True,
                           start_method="spawn")
        rows += [torch.load(f"{out}.{world}.{r}.pt") for r in range(world)]
    print(f"model: {rows[0]['params'] / 1e6:.1f} M trainable parameters (hidden {args.hidden}, {args.layers} layers)")
    print("| N | weights per rank, MB | AdamW state per rank, MB | KL reference per rank, MB | peak RSS growth per rank, MB "
          "(max over ranks) | checkpoint written per rank, MB | checkpoint save, s |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for world in args.devices:
        mine = [r for r in rows if r["world"] == world]
        print(f"| {world} | {max(r['weights_mb'] for r in mine):.1f} | {max(r['adamw_mb'] for r in mine):.1f} | "
              f"{max(r['reference_mb'] for r in mine):.1f} | {max(r['peak_rss_mb'] for r in mine):.0f} | "
              f"{max(r['ckpt_mb'] for r in mine):.1f} | {max(r['save_s'] for r in mine):.2f} |")


if __name__ == "__main__":
    main()
