"""Cost of exporting the sweep's rows to TensorBoard and MLflow (rollscale.train.trackers).

Target (issue 16): with tracking on, a training step is at most 5 % slower.
One run of the tiny model (full size: hidden 128, 4 layers; 32 prompts x 8
rollouts per step, chain_sum, untrained weights so no warm start is needed)
is trained for ``--steps`` steps with a checkpoint every ``--checkpoint-every``
steps (the sweep default is 20), three ways in the same process, round by
round interleaved so machine load drifts hit them alike: plain RunStore,
ExportingRunStore to TensorBoard + MLflow, and the export alone (the time the
exporter took, measured inside). Reports per-step wall-clock medians over the
rounds and the overhead ratio.

    python benchmarks/trackers.py [--steps 40] [--checkpoint-every 20] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from rollscale.config import TrackingParams
from rollscale.core.problems.sets import reasoning_gym_problems
from rollscale.lm.models import char_tokenizer, tiny_llama
from rollscale.core.rollouts import SamplingConfig
from rollscale.train.trackers import ExportingRunStore, RunExporter, tracker_targets
from rollscale.train.checkpoint import RunStore
from rollscale.train.run_config import RunConfig
from rollscale.train.trainer import GRPOTrainer

TINY_ARCH = dict(hidden_size=128, num_layers=4, num_heads=4, intermediate_size=384, max_positions=64)


def one_run(tracked: bool, steps: int, checkpoint_every: int, root: Path) -> tuple[float, float]:
    """(seconds per step, export seconds per step) of one run."""
    tok = char_tokenizer()
    problems = reasoning_gym_problems("chain_sum", 2000, 0, dict(min_terms=2, max_terms=2, min_digits=1, max_digits=1),
                                      prompt_style="expression")
    b_problem, n = 32, 8
    cfg = RunConfig(run_id="bench", n=n, b_problem=b_problem, c_max=steps * b_problem * n, train=dict(lr_base=1e-4, b_base=256),
                    eval_per_doubling=0, eval_every=10**6, eval_k=1, checkpoint_every=checkpoint_every,
                    sampling=SamplingConfig(temperature=1.0, max_new_tokens=4))
    trainer = GRPOTrainer(tiny_llama(len(tok), **TINY_ARCH).eval(), tok, problems[:-8], problems[-8:], cfg,
                          use_chat_template=False)
    run_dir = root / ("tracked" if tracked else "plain") / str(time.monotonic_ns())
    export_s = [0.0]
    if tracked:
        targets = tracker_targets(TrackingParams(tensorboard=True, mlflow=True), root / "trackers")
        exporter = RunExporter(targets, run_dir, f"bench-{run_dir.name}", cfg.to_dict())
        real = exporter.export

        def timed(status=None):
            t = time.perf_counter()
            out = real(status)
            export_s[0] += time.perf_counter() - t
            return out

        exporter.export = timed
        store = ExportingRunStore(run_dir, exporter)
    else:
        store = RunStore(run_dir)
    t0 = time.perf_counter()
    trainer.run(store)
    total = time.perf_counter() - t0
    return total / trainer.step, export_s[0] / trainer.step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--checkpoint-every", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    plain, tracked, export = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        one_run(True, 2, 1, Path(tmp))  # warm-up: imports of torch.utils.tensorboard and mlflow
        for r in range(args.rounds):
            for tracked_first in ((r % 2 == 0),):  # alternate which goes first
                for is_tracked in (tracked_first, not tracked_first):
                    step, exp = one_run(is_tracked, args.steps, args.checkpoint_every, Path(tmp))
                    (tracked if is_tracked else plain).append(step)
                    if is_tracked:
                        export.append(exp)
    p, t, e = (statistics.median(x) for x in (plain, tracked, export))
    print(f"| steps | checkpoint every | plain s/step | tracked s/step | export s/step | tracked / plain | export / plain |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    print(f"| {args.steps} | {args.checkpoint_every} | {p:.3f} | {t:.3f} | {e:.4f} | {t / p:.3f} | {100 * e / p:.2f} % |")


if __name__ == "__main__":
    main()
