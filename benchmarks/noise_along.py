"""The noise along training (science §6.4) on the embedded model, without a whole study: GRPO runs of the
default sweep's settings from the study's base model (``artifacts/base``, the ``base`` stage), on problems drawn
at random from the configured pool (no profile: not the Easy bucket), then the ``noise_along`` table of their steps.

    python benchmarks/noise_along.py --n 2 8 --c-max 20000 --out /tmp/noise_along   # a process per n

rho_icc comes from the runs' own Gram measurements (``--noise-every`` steps), as the fit stage takes it where
``sweep.noise_every`` is on. Prints each key's windows: |G|^2 with its interval, B_simple, K_crit and the CRS.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch


def train_one(n: int, c_max: int, noise_every: int, out: Path, seed: int) -> None:
    from rollscale.train.checkpoint import RunStore
    from rollscale.sweep.grid import GridPoint, point_config
    from rollscale.train.trainer import GRPOTrainer
    from tasks.common import read_model_ref, read_params
    from tasks.models import sampling_config, training_model
    from tasks.problems import load_pool

    torch.set_num_threads(1)
    params = read_params("params.yaml")
    sweep = params.sweep.model_copy(update={"c_max": c_max, "noise_every": noise_every, "eval_per_doubling": 0,
                                            "eval_every": 10**6, "eval_k": 1, "checkpoint_every": 40})
    pool = load_pool(params.data)
    order = np.random.default_rng(0).permutation(len(pool))
    train, val = [pool[i] for i in order[:340]], [pool[i] for i in order[340:360]]
    point = GridPoint(n, sweep.b_problem[0], sweep.rules[0], seed)
    config = point_config(sweep, sampling_config(params.sampling), point)
    ref = read_model_ref(Path("artifacts"))
    with training_model(ref, params.sampling, None, "cpu") as (model, tok, engine, lora):
        trainer = GRPOTrainer(model, tok, train, val, config, use_chat_template=ref.chat_template, lora=lora,
                              engine=engine)
        t0 = time.perf_counter()
        trainer.run(RunStore(out / config.run_id))
        print(f"{config.run_id}: {trainer.step} steps, C = {trainer.c} in {time.perf_counter() - t0:.0f} s",
              file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[2, 8])
    parser.add_argument("--c-max", type=int, default=20000)
    parser.add_argument("--noise-every", type=int, default=25)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="rollscale-noise-along-"))
    if args.one is not None:
        train_one(args.one, args.c_max, args.noise_every, out, args.seed)
        return
    procs = [subprocess.Popen([sys.executable, __file__, "--one", str(n), "--c-max", str(args.c_max),
                               "--noise-every", str(args.noise_every), "--seed", str(args.seed), "--out", str(out)])
             for n in args.n]
    if any(p.wait() for p in procs):
        raise SystemExit("a run failed (its error above)")
    report(out)


def report(out: Path) -> pd.DataFrame:
    from rollscale.core.noise.along import noise_along_table
    from rollscale.train.checkpoint import RunStore

    steps = pd.concat([RunStore(d).rows("steps") for d in sorted(out.iterdir()) if d.is_dir()], ignore_index=True)
    runs = steps.groupby("run_id", as_index=False).first()[["run_id", "n", "b_problem"]].assign(
        bucket="pool", rule="uniform")
    table = noise_along_table(runs, steps, resamples=400)
    table.to_parquet(out / "noise_along.parquet")
    cols = ["n", "c_lo", "c_hi", "steps", "g2", "g2_lo", "g2_hi", "b_simple_rollouts", "b_simple_rollouts_lo",
            "b_simple_rollouts_hi", "rho_icc", "k_crit", "k_crit_lo", "k_crit_hi", "crs", "crs_lo", "crs_hi",
            "reading", "steps_to_resolve"]
    with pd.option_context("display.width", 250, "display.max_columns", 30, "display.float_format", "{:.4g}".format):
        print(table[cols].to_string(index=False))
    return table


if __name__ == "__main__":
    main()
