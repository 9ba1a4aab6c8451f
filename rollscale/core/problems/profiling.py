"""Difficulty profiling: avg@k per problem (science §2)."""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import pandas as pd

from rollscale.core.problems.problem import Problem
from rollscale.core.problems.rewards import reward_fn
from rollscale.core.rollouts import Rollout, SamplingConfig

PROFILE_COLUMNS = ["problem_id", "source", "prompt", "answer", "reward", "k", "n_correct", "avg_at_k", "mean_len", "trunc_rate"]


def score_rollouts(problem: Problem, rollouts: Sequence[Rollout]) -> np.ndarray:
    """0/1 reward of each rollout under the problem's verifier (no partial credit)."""
    verify = reward_fn(problem.reward)
    rewards = np.array([verify(r.text, problem.answer) for r in rollouts], dtype=float)
    for r, value in zip(rollouts, rewards):
        r.reward = float(value)
    return rewards


def profile_problems(
    sample: Callable[[list[str], int, SamplingConfig, int], list[list[Rollout]]],
    render: Callable[[str], str],
    problems: Sequence[Problem],
    k: int,
    config: SamplingConfig,
    seed: int,
) -> pd.DataFrame:
    """avg@k of each problem from k independent samples (science §2).

    One row per problem: k, n_correct, avg_at_k, mean response length in
    tokens and the fraction of samples truncated at max_new_tokens.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    groups = sample([render(p.prompt) for p in problems], k, config, seed)
    rows = []
    for problem, rollouts in zip(problems, groups):
        rewards = score_rollouts(problem, rollouts)
        rows.append(
            {
                "problem_id": problem.problem_id,
                "source": problem.source,
                "prompt": problem.prompt,
                "answer": problem.answer,
                "reward": problem.reward,
                "k": k,
                "n_correct": int(rewards.sum()),
                "avg_at_k": float(rewards.mean()),
                "mean_len": float(np.mean([r.n_tokens for r in rollouts])),
                "trunc_rate": float(np.mean([r.truncated for r in rollouts])),
            }
        )
    return pd.DataFrame(rows, columns=PROFILE_COLUMNS)


def count_correct(
    sample: Callable[[list[str], int, SamplingConfig, int], list[list[Rollout]]],
    render: Callable[[str], str],
    problems: Sequence[Problem],
    k: int,
    config: SamplingConfig,
    seed: int,
) -> np.ndarray:
    """Correct counts from k further samples per problem (for the Extremely hard test)."""
    groups = sample([render(p.prompt) for p in problems], k, config, seed)
    return np.array([int(score_rollouts(p, rs).sum()) for p, rs in zip(problems, groups)], dtype=int)


def problems_from_profile(profile: pd.DataFrame) -> dict[str, Problem]:
    """The profiled problems again, by id (later stages read them from the ``profile`` table)."""
    return {
        row.problem_id: Problem.create(row.source, row.prompt, row.answer, row.reward)
        for row in profile.itertuples(index=False)
    }
