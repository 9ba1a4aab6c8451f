"""Gradient noise along training, from every step's two random halves of prompts (science §6.4).

Each training step splits its P prompts into halves a and b (by prompt) and records ``dot = <g_a, g_b>`` and
``diff2 = |g_a - g_b|^2`` of the halves' mean gradients, with the halves' prompts P_a, P_b. With S the noise
power of one prompt's group mean (the trace of its covariance; science §6.2's s_P) and G the mean gradient:

- ``E[dot] = |G|^2``: the halves are independent draws of prompts;
- ``E[diff2] = S (1 / P_a + 1 / P_b)``: each half's mean has covariance S / P_x. With unequal halves this is
  McCandlish's appendix A for two batch sizes: each size enters its own expected norm, so S is estimated
  without bias from any split, and the step's mean gradient ``(P_a g_a + P_b g_b) / P`` has noise S / P,
  estimated by ``diff2 P_a P_b / P^2`` (``diff2 / 4`` for equal halves).

Per compute window (one doubling of C: rollouts in [2^k, 2^(k+1))), numerators and denominators are summed over
the window's steps before any ratio: ``|G|^2 = mean dot``, ``S = sum diff2 / sum (1 / P_a + 1 / P_b)``, the
step's noise ``mean (diff2 P_a P_b / P^2)``, ``B_simple = S / |G|^2`` in prompts and ``B_simple * m`` in rollouts
(m rollouts trained per prompt). With an intraclass correlation rho (§6.3; from the steps' own Gram measurement
where ``noise_every`` took one in the window, else the measure stage's pooled rho_icc), the per-rollout noise
power is ``s = S / ((1 - rho) / m + rho)`` (S is a mean of m equicorrelated rollouts), and
``K_crit = (1 - rho) s / (|G|^2 - rho s)`` (infinite when ``|G|^2 <= rho s``), ``K_sat = 1 / rho``,
``CRS = min(K_sat, K_crit)``.

Intervals: a moving-block bootstrap over the window's steps (blocks of about T^(1/3) consecutive steps, so a
drift within the window stays in each resample), each ratio taken per resample, 95 % percentiles; a group of
several runs (a key's seeds) resamples blocks within each run. The measure stage's rho_icc comes with its own
bootstrap refits (prompts within its steps, :mod:`rollscale.core.noise.pooled`): its data are not the sweep's, so
each resample of the steps is paired with an independent draw of rho from them, and K_crit, K_sat and the CRS get
intervals that carry both uncertainties. A rho from the steps' own Gram measurements (``noise_every``) is held at
its estimate: where the CRS is then K_sat it has no interval. A window of fewer than :data:`MIN_STEPS` steps has
no interval. What an infinite K_crit says is
:mod:`rollscale.core.noise.pooled`'s reading.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pandas as pd

from rollscale.core.noise.pooled import PIECES, RESOLVED, RHO_S, UNRESOLVED, pooled_noise

__all__ = ["HALF_COLUMNS", "NOISE_ALONG_COLUMNS", "MeasuredRho", "WindowNoise", "compute_windows", "measured_rho",
           "noise_along_table", "window_noise"]

HALF_COLUMNS = ("half_dot", "half_diff2", "half_prompts_a", "half_prompts_b", "half_rollouts_a", "half_rollouts_b")
_QUANTITIES = ("g2", "noise", "s_prompt", "b_simple", "b_simple_rollouts", "k_crit", "crs")
_WITH_RHO = (*_QUANTITIES, "k_sat")
NOISE_ALONG_COLUMNS = [
    "run_id", "bucket", "rule", "n", "b_problem", "m", "runs", "c_lo", "c_hi", "steps", "prompts",
    *(f"{q}{s}" for q in _QUANTITIES for s in ("", "_lo", "_hi")),
    "rho_icc", "rho_icc_lo", "rho_icc_hi", "rho_source", "k_sat", "k_sat_lo", "k_sat_hi", "reading", "steps_to_resolve", "interval",
]
# a window with fewer steps has no interval: a percentile bootstrap of a handful of steps is far too narrow
# (measured on the embedded model: 4-step windows gave intervals excluding 0 on either side)
MIN_STEPS = 16


class MeasuredRho(NamedTuple):
    """A bucket's rho_icc, where it comes from, and its bootstrap refits (None: held at its estimate)."""

    value: float
    source: str
    draws: np.ndarray | None = None


@dataclass(frozen=True)
class WindowNoise:
    """One window's pooled estimates, each ``(estimate, lo, hi)``, and what K_crit says."""

    steps: int
    prompts: int
    m: float
    values: dict[str, tuple[float, float, float]]
    reading: str
    steps_to_resolve: float

    def row(self) -> dict:
        out: dict = {"steps": self.steps, "prompts": self.prompts, "m": self.m}
        for name, (v, lo, hi) in self.values.items():
            out.update({name: v, f"{name}_lo": lo, f"{name}_hi": hi})
        return {**out, "reading": self.reading, "steps_to_resolve": self.steps_to_resolve}


def _quantities(dot: np.ndarray, diff2: np.ndarray, inv: np.ndarray, share: np.ndarray, m: float,
                rho: float | np.ndarray) -> dict[str, np.ndarray]:
    """The pooled quantities from per-resample means of ``dot``, ``diff2``, ``inv = 1/P_a + 1/P_b`` and
    ``share = diff2 P_a P_b / P^2`` (arrays: one entry per resample), with ``rho`` one value or one a resample."""
    g2 = dot
    s_prompt = np.where(inv > 0, diff2 / np.where(inv > 0, inv, 1.0), np.nan)
    b = np.where(g2 > 0, s_prompt / np.where(g2 > 0, g2, 1.0), np.inf)
    out = {"g2": g2, "noise": share, "s_prompt": s_prompt, "b_simple": b, "b_simple_rollouts": b * m}
    rho = np.broadcast_to(np.asarray(rho, dtype=np.float64), g2.shape)
    if not np.isfinite(rho).all():
        nan = np.full_like(g2, np.nan)
        return {**out, "k_sat": nan, "k_crit": nan, "crs": nan}
    s = s_prompt / ((1 - rho) / m + rho)
    den = g2 - rho * s
    k_crit = np.where(den > 0, (1 - rho) * s / np.where(den > 0, den, 1.0), np.inf)
    k_sat = np.where(rho > 0, 1 / np.where(rho > 0, rho, 1.0), np.inf)
    return {**out, "k_sat": k_sat, "k_crit": k_crit, "crs": np.minimum(k_crit, k_sat)}


def _blocks(lengths: Sequence[int], resamples: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Per run, [resamples, T] step indices of a moving-block bootstrap (blocks of ~T^(1/3) steps)."""
    out = []
    for t in lengths:
        size = max(1, round(t ** (1 / 3)))
        count = math.ceil(t / size)
        starts = rng.integers(0, t - size + 1, size=(resamples, count))
        idx = (starts[:, :, None] + np.arange(size)[None, None, :]).reshape(resamples, -1)[:, :t]
        out.append(idx)
    return out


def window_noise(runs: Sequence[pd.DataFrame], rho: float = math.nan, resamples: int = 1000, level: float = 0.95,
                 seed: int = 0, rho_draws: np.ndarray | None = None) -> WindowNoise:
    """Pool one window's steps (``runs``: one frame per run, each with :data:`HALF_COLUMNS`, in step order)
    and bootstrap blocks of steps within each run (module docstring); ``rho_draws``, rho's own bootstrap refits,
    are drawn from independently in each resample (None: rho held at ``rho``). Rows without a split (NaN
    ``half_dot``) are left out; with no step left a ValueError names the window."""
    kept = []
    for r in runs:
        missing = [c for c in HALF_COLUMNS if c not in r.columns]
        if missing:
            raise ValueError(f"steps: missing columns {missing} (the trainer writes them with sweep.noise_halves)")
        r = r[np.isfinite(r["half_dot"].to_numpy(float)) & (r["half_prompts_a"] > 0) & (r["half_prompts_b"] > 0)]
        if len(r):
            kept.append(r)
    if not kept:
        raise ValueError("steps: no step of this window has two halves (sweep.noise_halves off, or one prompt a step)")
    arrays = []
    for r in kept:
        pa, pb = r["half_prompts_a"].to_numpy(float), r["half_prompts_b"].to_numpy(float)
        diff2 = r["half_diff2"].to_numpy(float)
        arrays.append(np.stack([r["half_dot"].to_numpy(float), diff2, 1 / pa + 1 / pb, diff2 * pa * pb / (pa + pb) ** 2]))
    prompts = int(sum((r["half_prompts_a"] + r["half_prompts_b"]).sum() for r in kept))
    rollouts = float(sum((r["half_rollouts_a"] + r["half_rollouts_b"]).sum() for r in kept))
    m = rollouts / prompts
    steps = sum(a.shape[1] for a in arrays)
    point = _quantities(*(np.array([v]) for v in np.concatenate(arrays, axis=1).mean(axis=1)), m, rho)
    values = {name: (float(point[name][0]), math.nan, math.nan) for name in _WITH_RHO}
    drawn = rho_draws is not None and len(rho_draws) > 0 and math.isfinite(rho) and bool(np.isfinite(rho_draws).all())
    if steps >= MIN_STEPS and resamples > 0:
        rng = np.random.default_rng(seed)
        sums = np.zeros((4, resamples))
        for a, idx in zip(arrays, _blocks([a.shape[1] for a in arrays], resamples, rng)):
            sums += a[:, idx].sum(axis=2)
        # the measure stage's prompts are not the sweep's steps: an independent draw of rho for each resample
        rho_b = rng.choice(np.asarray(rho_draws, dtype=np.float64), size=resamples) if drawn else rho
        refits = _quantities(*(sums / steps), m, rho_b)
        tail = (1 - level) / 2
        for name in _WITH_RHO:
            r = np.sort(refits[name])  # inf sorts last: an upper bound of inf is "not bounded"
            if np.isnan(r).all():
                continue
            lo, hi = r[int(math.floor(tail * (resamples - 1)))], r[int(math.ceil((1 - tail) * (resamples - 1)))]
            values[name] = (values[name][0], float(lo), float(hi))
        if not drawn:  # rho held at its estimate: K_sat has no interval, nor the CRS where it is K_sat
            values["k_sat"] = (values["k_sat"][0], math.nan, math.nan)
            if math.isfinite(rho) and rho > 0 and not values["k_crit"][0] < 1 / rho:
                values["crs"] = (values["crs"][0], math.nan, math.nan)
    g2, lo, hi = values["g2"]
    resolved = lo > 0
    reading = UNRESOLVED if not resolved else RHO_S if math.isinf(values["k_crit"][0]) else RESOLVED
    return WindowNoise(steps, prompts, m, values, reading, _steps_to_resolve(steps, g2, lo, hi) if not resolved
                       else math.nan)


def _steps_to_resolve(steps: int, g2: float, lo: float, hi: float) -> float:
    """Steps at which |G|^2's interval would clear 0: it narrows as 1 / sqrt(steps), so its half-width must fall
    below the signal (sized at the interval's upper end when the estimate is <= 0: then a lower bound)."""
    signal = g2 if g2 > 0 else hi
    if not (signal > 0 and math.isfinite(hi - lo)):
        return math.nan
    return float(max(steps + 1, math.ceil(steps * ((hi - lo) / 2 / signal) ** 2)))


def compute_windows(c: np.ndarray) -> np.ndarray:
    """Each step's compute window k: C (rollouts after the step) in [2^k, 2^(k+1))."""
    c = np.asarray(c, dtype=np.float64)
    return np.floor(np.log2(np.maximum(c, 1.0))).astype(np.int64)


_CONFIG = ["bucket", "rule", "n", "b_problem"]


def noise_along_table(runs: pd.DataFrame, steps: pd.DataFrame | None,
                      rho: dict[str, MeasuredRho | tuple[float, str]] | None = None, resamples: int = 1000,
                      seed: int = 0) -> pd.DataFrame:
    """The ``noise_along`` table (science §6.4): one row per run and compute window, and one per config
    (bucket, rule, n, B_problem: a key's seeds pooled, ``run_id`` empty, ``runs`` their count) and window.

    ``rho`` maps a bucket to the measure stage's :class:`MeasuredRho` (a ``(rho_icc, where it comes from)`` pair:
    held at its estimate); a window whose steps carry their own ``rho_icc`` (``sweep.noise_every``) uses their
    mean instead, held at it. Windows of steps without halves
    (``sweep.noise_halves: false``, or a study from before the setting) give no rows.
    """
    rho = {str(b): MeasuredRho(*r) for b, r in (rho or {}).items()}
    if steps is None or steps.empty or not set(HALF_COLUMNS) <= set(steps.columns):
        return pd.DataFrame(columns=NOISE_ALONG_COLUMNS)
    missing = [c for c in ["run_id", *_CONFIG] if c not in runs.columns]
    if missing:
        raise ValueError(f"runs: missing columns {missing}")
    info = runs.drop_duplicates("run_id").set_index("run_id")[_CONFIG]
    st = steps[steps["run_id"].isin(info.index)].copy()
    st = st[np.isfinite(pd.to_numeric(st["half_dot"], errors="coerce").to_numpy(float))]
    if st.empty:
        return pd.DataFrame(columns=NOISE_ALONG_COLUMNS)
    # the runs table's config wins (the steps table repeats n and b_problem)
    st = st.drop(columns=[c for c in _CONFIG if c in st.columns]).sort_values(["run_id", "step"]).join(info, on="run_id")
    st["window"] = compute_windows(st["c"].to_numpy(float))
    rows = []
    for key, cfg in st.groupby(_CONFIG, sort=True, dropna=False):
        for window, w in cfg.groupby("window", sort=True):
            per_run = [g for _, g in w.groupby("run_id", sort=True)]
            groups = [(str(r["run_id"].iloc[0]), [r]) for r in per_run] + ([("", per_run)] if len(per_run) > 1 else [])
            for run_id, frames in groups:
                r = _rho(frames, rho.get(str(key[0]), MeasuredRho(math.nan, "not measured")))
                est = window_noise(frames, r.value, resamples, seed=seed + int(window), rho_draws=r.draws)
                rho_lo, rho_hi = _interval(r.draws) if est.steps >= MIN_STEPS else (math.nan, math.nan)
                rows.append({"run_id": run_id or None, **dict(zip(_CONFIG, key)), "runs": len(frames),
                             "c_lo": float(2 ** int(window)), "c_hi": float(2 ** (int(window) + 1)), **est.row(),
                             "rho_icc": r.value, "rho_icc_lo": rho_lo, "rho_icc_hi": rho_hi, "rho_source": r.source,
                             "interval": (f"block bootstrap over steps ({resamples})"
                                          + (" x the measure stage's rho_icc refits" if r.draws is not None else
                                             ", rho_icc held at its estimate")) if est.steps >= MIN_STEPS
                             else f"{est.steps} steps, no interval"})
    return pd.DataFrame(rows, columns=NOISE_ALONG_COLUMNS)


def _rho(frames: Sequence[pd.DataFrame], measured: MeasuredRho) -> MeasuredRho:
    """The window's rho_icc: its steps' own Gram measurements (``noise_every``) where any, else ``measured``."""
    own = pd.concat([f.get("rho_icc", pd.Series(dtype=float)) for f in frames]).astype(float)
    own = own[np.isfinite(own)]
    if len(own):
        return MeasuredRho(float(own.mean()), "steps (noise_every)")
    return measured


def _interval(draws: np.ndarray | None, level: float = 0.95) -> tuple[float, float]:
    if draws is None or not len(draws) or not np.isfinite(draws).all():
        return math.nan, math.nan
    lo, hi = np.quantile(draws, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def measured_rho(noise_prompts: pd.DataFrame | None, resamples: int = 1000) -> dict[str, MeasuredRho]:
    """Per bucket, the measure stage's rho_icc pooled over its steps at its largest n (science §6.3,
    :func:`~rollscale.core.noise.pooled.pooled_noise`), where it comes from and its ``resamples`` bootstrap
    refits; {} without the table."""
    if noise_prompts is None or noise_prompts.empty or not {"bucket", "n", "step", *PIECES} <= set(noise_prompts.columns):
        return {}
    out = {}
    for bucket, g in noise_prompts.groupby("bucket"):
        n = int(pd.to_numeric(g["n"], errors="coerce").max())
        try:
            pooled = pooled_noise(g[pd.to_numeric(g["n"], errors="coerce") == n], n, resamples=resamples)
        except ValueError:
            continue
        out[str(bucket)] = MeasuredRho(pooled.values["rho_icc"][0], f"measure stage (n = {n})", pooled.rho_draws)
    return out
