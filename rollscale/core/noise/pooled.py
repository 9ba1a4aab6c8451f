"""Gradient noise pooled over measurement steps, with bootstrap intervals over prompts (science §6.2, §6.3).

One step's signal ``|G|^2_hat`` from 16 prompts is often negative (the default study: 4 of 6 steps); a ratio
taken step by step is then infinite. Science §6.2 smooths numerators and denominators over steps *before* the
ratio: here every numerator and denominator is a mean over the steps' prompts, pooled over the steps, and each
ratio is taken once.

Each prompt p of a step carries four numbers of that step's Gram matrix (:func:`prompt_pieces`):
``k_diag`` = mean_i K_ii of its rollouts, ``m_self`` = M_pp, ``m_cross`` = mean_{q != p} M_pq, and ``within``
= w_p = (sum_i K_ii - n M_pp) / (n - 1). Every §6.2-6.3 quantity of a step is a mean of them over its prompts:
``|G|^2 = mean_p m_cross``, ``s = mean k_diag - |G|^2``, ``s_P = mean m_self - |G|^2``, rollout-axis noise power
``mean within`` (= MSW), ``tb = mean m_self - |G|^2 - MSW / n``, ``rho_icc = tb / (tb + MSW)`` (0 when tb <= 0),
``K_crit = (1 - rho) s / (|G|^2 - rho s)`` (science §6.3, with s = tb + MSW as :func:`decompose` has it).

Interval: prompts are resampled with replacement within each step (stratified bootstrap over prompts), the
pooled means recomputed, every ratio taken per resample; a 95 % percentile interval. ``|G|^2`` is a U-statistic
over pairs of distinct prompts, so a prompt drawn twice must not pair with itself: its contribution is resampled
as its jackknife pseudo-value ``P U - (P - 1) U_(-p)`` (mean over prompts = U exactly), whose spread carries the
U-statistic's variance.

Reading (science §6.3), what the report says of an infinite K_crit:
- ``signal not resolved``: the interval of |G|^2 reaches 0 or below: more prompts (or steps) are needed before
  any noise scale means anything.
- ``rho s > |G|^2``: the signal is resolved but rollouts of one prompt share so much of their gradient that no n
  reaches it: add prompts, not rollouts.
- ``resolved``: K_crit finite.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from rollscale.core.noise.signal import as_gram, block_means, group_order, within_sums

__all__ = ["PIECES", "PooledNoise", "RESOLVED", "RHO_S", "UNRESOLVED", "pooled_noise", "prompt_pieces",
           "prompts_to_resolve"]

PIECES = ("k_diag", "m_self", "m_cross", "within")
UNRESOLVED, RHO_S, RESOLVED = "signal not resolved", "rho s > |G|^2", "resolved"
_QUANTITIES = ("g_norm2", "b_simple", "prompt_noise", "rollout_noise", "rho_icc", "k_sat_icc", "k_crit")


def prompt_pieces(gram: np.ndarray, groups: np.ndarray) -> dict[str, np.ndarray]:
    """Per prompt (in the order of ``np.unique(groups)``) the four numbers the pooled estimates are means of."""
    k = as_gram(gram)
    order, p, n = group_order(groups, k.shape[0], 2)
    m = block_means(k, order, p, n)
    return {"k_diag": np.diag(k)[order].reshape(p, n).mean(axis=1), "m_self": np.diag(m).copy(),
            "m_cross": (m.sum(axis=1) - np.diag(m)) / (p - 1),
            "within": within_sums(k, order, p, n, m) / (n - 1)}


@dataclass(frozen=True)
class PooledNoise:
    """The §6.2-6.3 quantities pooled over steps, each ``(estimate, lo, hi)``, and what K_crit says."""

    n: int
    steps: int
    prompts: int  # prompts over all steps
    values: dict[str, tuple[float, float, float]]
    reading: str
    # rho_icc's bootstrap refits (one per resample): another estimate built on it draws from them (§6.4's CRS)
    rho_draws: np.ndarray | None = field(default=None, compare=False, repr=False)

    def row(self) -> dict[str, float | int | str]:
        out: dict[str, float | int | str] = {"n": self.n, "steps": self.steps, "prompts": self.prompts}
        for name, (v, lo, hi) in self.values.items():
            out.update({name: v, f"{name}_lo": lo, f"{name}_hi": hi})
        return {**out, "reading": self.reading}


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.inf)


def _quantities(k_diag: np.ndarray, m_self: np.ndarray, g2: np.ndarray, within: np.ndarray, n: int
                ) -> dict[str, np.ndarray]:
    """The pooled quantities from pooled means (arrays: one entry per resample)."""
    s, s_p = k_diag - g2, m_self - g2
    tb = m_self - g2 - within / n
    rho = np.where(tb > 0, tb / np.where(tb + within > 0, tb + within, 1.0), 0.0)
    s_icc = np.maximum(s, 0.0)  # s_hat = tb + MSW, as decompose's K_crit has it
    den = g2 - rho * s_icc
    k_crit = np.where(den > 0, (1 - rho) * s_icc / np.where(den > 0, den, 1.0), np.inf)
    return {"g_norm2": g2, "b_simple": _ratio(s, g2), "prompt_noise": _ratio(s_p, g2),
            "rollout_noise": _ratio(within, g2), "rho_icc": rho, "k_sat_icc": _ratio(np.ones_like(rho), rho),
            "k_crit": k_crit}


def pooled_noise(prompts: pd.DataFrame, n: int, resamples: int = 1000, level: float = 0.95,
                 seed: int = 0) -> PooledNoise:
    """Pool the steps of one group size ``n`` (``prompts``: one row per prompt and step with ``step`` and
    :data:`PIECES`; one run's steps) and bootstrap prompts within steps (module docstring)."""
    missing = [c for c in ("step", *PIECES) if c not in prompts.columns]
    if missing:
        raise ValueError(f"noise_prompts: missing columns {missing} (the measure stage of this version writes them: "
                         "run it again)")
    rows = prompts.dropna(subset=list(PIECES))
    steps = [g for _, g in rows.groupby("step", sort=True) if len(g) >= 3]  # pseudo-values need P >= 3
    if not steps:
        raise ValueError(f"noise_prompts: n = {n} has no step with 3 or more measured prompts")
    rng = np.random.default_rng(seed)
    est = {c: [] for c in PIECES}
    boot = {c: np.zeros(resamples) for c in PIECES}
    for g in steps:
        p = len(g)
        x = {c: g[c].to_numpy(float) for c in PIECES}
        u = x["m_cross"].mean()  # = sum_{p != q} M_pq / (P (P - 1))
        o = x["m_cross"] * (p - 1)  # each prompt's off-diagonal row sum
        x["m_cross"] = p * u - (o.sum() - 2 * o) / (p - 2)  # jackknife pseudo-values (mean: u)
        idx = rng.integers(0, p, size=(resamples, p))
        for c in PIECES:
            est[c].append(x[c].mean())
            boot[c] += x[c][idx].mean(axis=1)
    point = _quantities(*(np.array([np.mean(est[c])]) for c in ("k_diag", "m_self", "m_cross", "within")), n)
    refits = _quantities(*(boot[c] / len(steps) for c in ("k_diag", "m_self", "m_cross", "within")), n)
    tail = (1 - level) / 2
    values = {}
    for name in _QUANTITIES:
        r = np.sort(refits[name])  # inf sorts last: an upper bound of inf is "not bounded"
        lo, hi = r[int(math.floor(tail * (resamples - 1)))], r[int(math.ceil((1 - tail) * (resamples - 1)))]
        values[name] = (float(point[name][0]), float(lo), float(hi))
    g2, g2_lo = values["g_norm2"][0], values["g_norm2"][1]
    reading = UNRESOLVED if not g2_lo > 0 else RHO_S if math.isinf(values["k_crit"][0]) else RESOLVED
    return PooledNoise(n, len(steps), int(sum(len(g) for g in steps)), values, reading, refits["rho_icc"].copy())


def prompts_to_resolve(pooled: PooledNoise) -> tuple[int, bool] | None:
    """Prompts over all steps at which |G|^2's interval would clear 0, for a signal not resolved: the interval
    narrows as 1 / sqrt(prompts), so its half-width must fall below the signal. With an estimate <= 0 the signal
    is sized at the interval's upper end, so the count is a lower bound (the bool: True). None when resolved
    or the interval is not finite."""
    g2, lo, hi = pooled.values["g_norm2"]
    if pooled.reading != UNRESOLVED or not math.isfinite(hi - lo):
        return None
    signal, at_least = (g2, False) if g2 > 0 else (hi, True)
    if not signal > 0:
        return None
    return max(pooled.prompts, math.ceil(pooled.prompts * ((hi - lo) / 2 / signal) ** 2)), at_least
