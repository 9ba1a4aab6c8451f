"""What the data to C_max determine: the simulated studies' own curve family fitted to them (science §11.1-11.2).

    python benchmarks/true_form.py --per-family 24 --families unbent rising late_flip cross

Each study of rollscale.core.search.simulate is a sigmoid in C per key (R0, A, C_mid, beta; each seed's moved a
little). Here every key's runs (2 seeds, avg@16 over 100 problems on the §9.1 schedule) are trained to C_max =
40,000 and that very family is fitted to them by least squares: R0 known (the step-0 evaluations' mean), beta
shared by the keys (as the studies draw it), A and C_mid per key. Its refits resample the seeds (paired across
keys) and redraw the evaluation noise at the fitted values; D to the leader at C* = 4 x C_max is read refit by
refit, its percentile bound moved out by sqrt(2) (2 seeds; rollscale.core.fit.forecast's rule), and a key is
settled where that upper bound is <= epsilon = 0.02. Per family: the leader right within epsilon (the true
curves at C*), decided (every other key settled), wrong and decided. No form can do better than the true one
fitted well: where it decides nothing, the data to C_max do not determine the answer at C*.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rollscale.core.search.simulate import UNIVERSE, grid_tables, make_studies  # noqa: E402
from rollscale.core.search.simulate_budget import true_reward  # noqa: E402

C_MAX, EPSILON, DRAWS = 40_000, 0.02, 1600


def model(theta: np.ndarray, key: np.ndarray, c: np.ndarray, r0: float, k: int) -> np.ndarray:
    """theta = (log beta, log gain per key, log10 C_mid per key)."""
    gain, mid = np.exp(theta[1:1 + k]), 10 ** theta[1 + k:1 + 2 * k]
    return r0 + gain[key] / (1 + (mid[key] / np.maximum(c, 1.0)) ** math.exp(theta[0]))


def fit(key: np.ndarray, c: np.ndarray, y: np.ndarray, r0: float, k: int, start: np.ndarray) -> np.ndarray:
    lower = [math.log(0.3)] + [math.log(1e-3)] * k + [2.5] * k
    upper = [math.log(5.0)] + [math.log(1 - r0)] * k + [7.0] * k
    return least_squares(lambda t: model(t, key, c, r0, k) - y, np.clip(start, lower, upper),
                         bounds=(lower, upper)).x


def verdict(evals: pd.DataFrame, r0: float, c_star: float, refits: int, rng: np.random.Generator
            ) -> tuple[int, bool]:
    """(the leader at ``c_star``, decided) from one study's evaluations past step 0."""
    keys = np.array(sorted(evals["n"].unique()))
    k, index = keys.size, {n: i for i, n in enumerate(keys)}
    at = np.arange(k), np.full(k, float(c_star))
    theta = fit(evals["n"].map(index).to_numpy(), evals["c"].to_numpy(float), evals["avg_at_k"].to_numpy(float),
                r0, k, np.r_[math.log(1.5), [math.log(0.2)] * k, [4.5] * k])
    point = model(theta, *at, r0, k)
    seeds = sorted(evals["seed"].unique())
    draws = []
    for _ in range(refits):
        part = pd.concat([evals[evals["seed"] == s] for s in rng.choice(seeds, len(seeds))])
        key, c = part["n"].map(index).to_numpy(), part["c"].to_numpy(float)
        fitted = model(theta, key, c, r0, k)
        y = part["avg_at_k"].to_numpy(float) + rng.binomial(DRAWS, np.clip(fitted, 0, 1)) / DRAWS - fitted
        draws.append(model(fit(key, c, y, r0, k, theta), *at, r0, k))
    draws = np.array(draws)
    lead = int(np.argmax(np.median(draws, axis=0)))
    d_point = point - point[lead]
    d_hi = d_point + (np.percentile(draws - draws[:, [lead]], 97.5, axis=0) - d_point) * math.sqrt(2)
    return int(keys[lead]), bool(np.all(np.delete(d_hi, lead) <= EPSILON))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-family", type=int, default=24)
    ap.add_argument("--families", nargs="+", default=["unbent", "rising", "late_flip", "cross"])
    ap.add_argument("--refits", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print("| family | studies | leader right | decided | wrong and decided | seconds |")
    print("|---|---|---|---|---|---|")
    for family in args.families:
        start = time.time()
        studies = make_studies(args.per_family, seed=args.seed, families=(family,), seeds=(0, 1),
                               schedule=(625.0, 4), eval_draws=DRAWS)
        runs, evals = grid_tables(studies)
        evals = evals.merge(runs[["run_id", "bucket", "n", "seed"]], on="run_id")
        rng = np.random.default_rng(args.seed)
        right, decided = [], []
        for s in studies:
            mine = evals[evals["bucket"] == s.name]
            r0 = float(mine.loc[mine["c"] == 0, "avg_at_k"].mean())
            lead, done = verdict(mine[mine["c"] > 0], r0, 4 * C_MAX, args.refits, rng)
            truth = {n: true_reward(s, n, 4 * C_MAX) for n in UNIVERSE}
            right.append(max(truth.values()) - truth[lead] <= EPSILON + 1e-12)
            decided.append(done)
        r, d = np.array(right), np.array(decided)
        print(f"| {family} | {len(studies)} | {r.mean():.1%} | {d.mean():.1%} | {(d & ~r).mean():.1%} | "
              f"{time.time() - start:.0f} |", flush=True)


if __name__ == "__main__":
    main()
