"""Noise pooled over steps before the ratio, with a bootstrap over prompts (science §6.2, §6.3; issue 41)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from rollscale.core.noise.estimators import decompose
from rollscale.core.noise.pooled import RESOLVED, RHO_S, UNRESOLVED, pooled_noise, prompt_pieces


def _gram(rng: np.random.Generator, p: int, n: int, signal: float, shared: float, dim: int = 400) -> np.ndarray:
    """Per-rollout gradients: a common mean (the signal), a prompt's own component, rollout noise."""
    g = signal * np.ones(dim) / math.sqrt(dim)
    prompt = rng.normal(0, shared / math.sqrt(dim), (p, 1, dim))
    rollouts = rng.normal(0, 1 / math.sqrt(dim), (p, n, dim))
    x = (g + prompt + rollouts).reshape(p * n, dim)
    return x @ x.T


def _prompts(grams: list[np.ndarray], n: int) -> pd.DataFrame:
    rows = []
    for step, k in enumerate(grams):
        groups = np.repeat(np.arange(k.shape[0] // n), n)
        pieces = prompt_pieces(k, groups)
        rows += [{"step": step, **{c: v[i] for c, v in pieces.items()}} for i in range(len(groups) // n)]
    return pd.DataFrame(rows)


def test_one_step_pooled_is_that_steps_decomposition():
    rng = np.random.default_rng(0)
    k = _gram(rng, 12, 8, signal=0.6, shared=0.3)
    dec = decompose(k, np.repeat(np.arange(12), 8))
    pooled = pooled_noise(_prompts([k], 8), 8, resamples=200)
    for name in ("g_norm2", "b_simple", "prompt_noise", "rollout_noise", "rho_icc", "k_sat_icc", "k_crit"):
        assert pooled.values[name][0] == pytest.approx(getattr(dec, name), rel=1e-9), name


def test_pooling_resolves_a_signal_single_steps_do_not_and_reads_an_infinite_k_crit():
    rng = np.random.default_rng(1)
    weak = [_gram(rng, 16, 8, signal=0.25, shared=0.0) for _ in range(12)]
    per_step = [decompose(k, np.repeat(np.arange(16), 8)).g_norm2 for k in weak]
    pooled = pooled_noise(_prompts(weak, 8), 8)
    g2, lo, hi = pooled.values["g_norm2"]
    assert lo < g2 < hi and lo > 0 and pooled.reading == RESOLVED
    assert math.isfinite(pooled.values["b_simple"][0]) and math.isfinite(pooled.values["k_crit"][2])
    assert min(per_step) < lo  # single steps scatter below what the pooled interval allows
    # pure noise: the signal is not resolved, whatever the ratio says
    assert pooled_noise(_prompts([_gram(rng, 16, 8, 0.0, 0.0) for _ in range(3)], 8), 8).reading == UNRESOLVED
    # a strong shared prompt component: rho s > |G|^2, an answer (add prompts), not a failure
    shared = pooled_noise(_prompts([_gram(rng, 32, 8, signal=0.5, shared=1.5) for _ in range(6)], 8), 8)
    assert shared.values["g_norm2"][1] > 0 and math.isinf(shared.values["k_crit"][0]) and shared.reading == RHO_S


def test_missing_pieces_and_too_few_prompts_say_what_is_wrong():
    with pytest.raises(ValueError, match=r"noise_prompts: missing columns \['k_diag'"):
        pooled_noise(pd.DataFrame({"step": [0]}), 16)
    two = pd.DataFrame({"step": [0, 0], "k_diag": 1.0, "m_self": 0.5, "m_cross": 0.1, "within": 0.4})
    with pytest.raises(ValueError, match="no step with 3 or more measured prompts"):
        pooled_noise(two, 16)
