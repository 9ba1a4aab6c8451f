"""Tasks of the ``profile`` stage (science §2)."""

from __future__ import annotations

import pandas as pd

from rollscale.config import SamplingParams
from rollscale.core.seeds import derive_seed
from rollscale.lm.models import ModelRef
from rollscale.core.problems.problem import Problem
from rollscale.core.problems.profiling import count_correct, profile_problems
from tasks.common import retried_task
from tasks.models import renderer, sampling_config, stage_engine


# seed-key part of the extreme resampling call (the first k samples use the chunk seed itself)
EXTREME_KEY = 1


@retried_task(name="profile-chunk")
def profile_chunk(ref: ModelRef, problems: list[Problem], k: int, k_extreme: int, sampling: SamplingParams, seed: int,
                  device: str = "auto") -> pd.DataFrame:
    """avg@k for one chunk of problems, plus k_extreme - k more samples where avg@k = 0.

    The engine is the stage's (``sampling.backend``); request (problem i, sample j) of the
    chunk is seeded by (seed, i, j), and the extra samples use a fresh key, so they never
    repeat the first k."""
    engine = stage_engine(ref, sampling, device)
    render = renderer(ref, engine, sampling)
    config = sampling_config(sampling)
    table = profile_problems(engine.sample, render, problems, k, config, seed)
    if k_extreme:
        zero = [p for p, c in zip(problems, table["n_correct"]) if c == 0]
        extra = count_correct(engine.sample, render, zero, k_extreme - k, config, derive_seed(seed, EXTREME_KEY)) if zero else []
        by_id = dict(zip((p.problem_id for p in zero), extra))
        table["k_extreme"] = k_extreme
        # problems with a correct answer among the first k need no more samples
        table["n_correct_extreme"] = [
            c + by_id.get(pid, 0) if c == 0 else c for pid, c in zip(table["problem_id"], table["n_correct"])
        ]
    return table
