"""One tiny-model sweep step, phase by phase, beside the bare model calls inside it.

    python benchmarks/step_breakdown.py [--steps 20] [--n 8] [--b-problem 16]

The trainer is the sweep's (``GRPOTrainer.train_step``, unchanged); this script
only wraps, on its own instances, the calls each phase is made of and times
them: generate (``engine.sample``), score (the verifier), reference logprobs,
forward (the training forward), backward, optimizer (clip + AdamW), eval
(``evaluate``, one call, shown per step at the sweep's ``eval_every``), and
bookkeeping (the rest of the step: allocation, advantages, batching, rows).
The bare model calls are ``model.generate``, ``model.forward`` outside generate,
``Tensor.backward`` and ``optimizer.step``; overhead = step - bare calls.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rollscale.config import DataParams, SamplingParams, SweepParams  # noqa: E402
from rollscale.lm.models import char_tokenizer, tiny_llama  # noqa: E402
from rollscale.sweep.grid import run_configs  # noqa: E402
from rollscale.train.trainer import GRPOTrainer  # noqa: E402
from tasks.models import sampling_config  # noqa: E402
from tasks.problems import load_pool  # noqa: E402

T: dict[str, float] = defaultdict(float)
_inside_generate = [False]


def timed(name: str, fn):
    def wrapper(*a, **kw):
        t0 = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            T[name] += time.perf_counter() - t0
    return wrapper


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--b-problem", type=int, default=16)
    ap.add_argument("--eval-every", type=int, default=20)
    args = ap.parse_args()
    torch.set_num_threads(1)
    tokenizer = char_tokenizer()
    model = tiny_llama(len(tokenizer))
    pool = load_pool(DataParams(), size=400, seed=7)
    sweep = SweepParams(n=[args.n], b_problem=[args.b_problem], seeds=[0], c_max=10**9, eval_k=4)
    config = run_configs(sweep, sampling_config(SamplingParams()))[0]
    trainer = GRPOTrainer(model, tokenizer, pool[:300], pool[300:400], config, use_chat_template=False)

    trainer.engine.sample = timed("generate", trainer.engine.sample)
    trainer._score = timed("score", trainer._score)
    trainer._ref_logprobs = timed("ref_logprobs", trainer._ref_logprobs)
    trainer.optimizer.step = timed("optimizer_step", trainer.optimizer.step)
    generate, forward = model.generate, model.forward

    def bare_generate(*a, **kw):
        _inside_generate[0] = True
        try:
            return timed("bare_generate", generate)(*a, **kw)
        finally:
            _inside_generate[0] = False

    def bare_forward(*a, **kw):
        if _inside_generate[0]:
            return forward(*a, **kw)
        return timed("bare_forward", forward)(*a, **kw)

    model.generate, model.forward = bare_generate, bare_forward
    backward = torch.Tensor.backward
    torch.Tensor.backward = timed("backward", backward)
    clip = torch.nn.utils.clip_grad_norm_
    torch.nn.utils.clip_grad_norm_ = timed("clip", clip)

    trainer.train_step()  # warm-up
    T.clear()
    totals = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        trainer.train_step()
        totals.append(time.perf_counter() - t0)
    steps = dict(T)
    T.clear()
    t0 = time.perf_counter()
    trainer.evaluate()
    eval_total = time.perf_counter() - t0
    eval_bare = T["bare_generate"] + T["bare_forward"]
    torch.Tensor.backward, torch.nn.utils.clip_grad_norm_ = backward, clip

    k = args.steps
    per = {key: v / k for key, v in steps.items()}
    step = sum(totals) / k
    ev, ev_bare = eval_total / args.eval_every, eval_bare / args.eval_every
    # the reference model is a copy made before the wrapping: its forward is timed as ref_logprobs
    forward_train = per.get("bare_forward", 0.0)
    phases = {
        "generate": (per.get("generate", 0.0), per.get("bare_generate", 0.0)),
        "score": (per.get("score", 0.0), 0.0),
        "reference logprobs": (per.get("ref_logprobs", 0.0), per.get("ref_logprobs", 0.0)),
        "forward (policy logprobs, entropy)": (forward_train, forward_train),
        "backward": (per.get("backward", 0.0), per.get("backward", 0.0)),
        "optimizer (clip + AdamW)": (per.get("clip", 0.0) + per.get("optimizer_step", 0.0),
                                     per.get("optimizer_step", 0.0)),
        f"eval (one per {args.eval_every} steps)": (ev, ev_bare),
    }
    known = sum(v for v, _ in phases.values()) - ev
    phases["bookkeeping (allocation, advantages, batching, rows)"] = (max(step - known, 0.0), 0.0)
    total = step + ev
    bare = sum(b for _, b in phases.values())
    print(f"tiny model, B = {args.b_problem} x {args.n}, {k} steps (median step {statistics.median(totals) * 1e3:.0f} ms), "
          f"1 torch thread")
    print("\n| phase | ms per step | bare model calls, ms | overhead, ms |\n| --- | ---: | ---: | ---: |")
    for name, (t, b) in phases.items():
        print(f"| {name} | {t * 1e3:.1f} | {b * 1e3:.1f} | {(t - b) * 1e3:.1f} |")
    print(f"| **step** | **{total * 1e3:.1f}** | **{bare * 1e3:.1f}** | **{(total - bare) * 1e3:.1f} "
          f"({(total - bare) / total:.0%})** |")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
