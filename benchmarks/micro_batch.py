"""The update's time against ``sweep.train.micro_batch_tokens`` on CPU, for the tiny model.

    python benchmarks/micro_batch.py --n 4 8 16 --tokens 8192 2048 1024

One trainer per micro-batch size (random-initialised tiny model, B = 16 x n, one torch
thread), stepped in turn so each size sees the same machine load; prints the median
``t_train`` (policy forward and backward, reference forward, optimizer) over ``--steps``
steps. The gradient is the same whatever the size (tests/test_step.py); only the time
differs: on CPU, small micro-batches keep activations in cache.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tasks/ runs from the project folder

from rollscale.config import DataParams, SamplingParams, SweepParams  # noqa: E402
from rollscale.lm.models import char_tokenizer, tiny_llama  # noqa: E402
from rollscale.sweep.grid import run_configs  # noqa: E402
from rollscale.train.trainer import GRPOTrainer  # noqa: E402
from tasks.models import sampling_config  # noqa: E402
from tasks.problems import load_pool  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, nargs="+", default=[4, 8, 16])
    ap.add_argument("--tokens", type=int, nargs="+", default=[8192, 2048, 1024])
    ap.add_argument("--steps", type=int, default=6)
    args = ap.parse_args()
    torch.set_num_threads(1)
    tokenizer = char_tokenizer()
    pool = load_pool(DataParams(), size=400, seed=7)
    print("| n | B | " + " | ".join(f"{t} tokens, ms" for t in args.tokens) + " |")
    print("| ---: | ---: | " + " | ".join("---:" for _ in args.tokens) + " |")
    for n in args.n:
        trainers = {}
        for tokens in args.tokens:
            sweep = SweepParams(n=[n], b_problem=[16], seeds=[0], c_max=10**9, eval_k=4,
                                train={"micro_batch_tokens": tokens})
            config = run_configs(sweep, sampling_config(SamplingParams()))[0]
            trainers[tokens] = GRPOTrainer(tiny_llama(len(tokenizer)), tokenizer, pool[:300], pool[300:],
                                           config, use_chat_template=False)
            trainers[tokens].train_step()  # warm-up
        times = {t: [] for t in args.tokens}
        for _ in range(args.steps):
            for tokens, trainer in trainers.items():
                times[tokens].append(trainer.train_step()["t_train"])
        print(f"| {n} | {16 * n} | " + " | ".join(f"{statistics.median(times[t]) * 1000:.0f}" for t in args.tokens)
              + " |")


if __name__ == "__main__":
    main()
