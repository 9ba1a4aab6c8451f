"""Validation metrics of a policy at one step (science §5)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

import numpy as np

from rollscale.core.metrics import avg_at_k, best_at_k, standard_error, worst_at_k
from rollscale.core.problems.problem import Problem
from rollscale.core.rollouts import SamplingConfig


def evaluate(
    engine, prompts: Sequence[str], problems: Sequence[Problem], score: Callable[[Problem, str], float],
    k: int, temperature: float, sampling: SamplingConfig, seeds: tuple[int, int],
) -> dict:
    """avg@k (with its standard error across problems), unbiased best@k and worst@k
    from ``k`` samples per problem at ``temperature``, and greedy accuracy from one
    temperature-0 sample; ``seeds`` seed the two sampling calls."""
    t0 = time.perf_counter()
    sampled = SamplingConfig(temperature=temperature, top_p=sampling.top_p, top_k=sampling.top_k,
                             max_new_tokens=sampling.max_new_tokens)
    greedy_cfg = SamplingConfig(temperature=0.0, max_new_tokens=sampling.max_new_tokens)
    groups = engine.sample(prompts, k, sampled, seed=seeds[0])
    greedy = engine.sample(prompts, 1, greedy_cfg, seed=seeds[1])
    n_correct = np.array([sum(score(p, r.text) for r in g) for p, g in zip(problems, groups)], dtype=np.int64)
    greedy_correct = np.array([score(p, g[0].text) for p, g in zip(problems, greedy)])
    per_problem = np.atleast_1d(avg_at_k(n_correct, k))
    return {
        "k": k,
        "n_problems": len(problems),
        "avg_at_k": float(per_problem.mean()),
        "avg_at_k_se": standard_error(per_problem) if per_problem.size >= 2 else math.nan,
        "best_at_k": float(np.mean(best_at_k(k, n_correct, k))),
        "worst_at_k": float(np.mean(worst_at_k(k, n_correct, k))),
        "greedy": float(greedy_correct.mean()),
        "t_eval": time.perf_counter() - t0,
    }
