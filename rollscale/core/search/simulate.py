"""Whole studies simulated without training: the families the search's proof runs on (science §9.4;
:mod:`rollscale.core.search.simulate_budget`).

Each simulated study is one rollout-axis group shaped like the embedded
default (README, docs/results.md): B_problem = 16, C_max = 40,000 rollouts,
3 seeds, validation avg@4 over 100 problems every 20 steps of B = 16 n
rollouts (so a large n has fewer points), base reward 0.37 and gains of
0.13-0.26. Per key n the true curve is a §7 sigmoid; each seed moves its
asymptote (sd 0.015), log10 C_mid (sd 0.05) and beta (x e^N(0, 0.1)); each
evaluation is Binomial(400, R) / 400, the noise of 4 samples on each of 100
problems. Families (:data:`FAMILIES`):

* ``cross``: small n rise first, large n rise higher: n* rises from 2 to 8;
* ``edge_low``: n = 2 best at every budget, the grid starts at {4, 8, 16}:
  the bracket must add 2 (the embedded study's shape, where n = 4 won);
* ``edge_high``: n = 16 best at large budgets, the grid is {2, 4, 8}: the
  bracket must add 16;
* ``tie``: n = 4 and n = 8 have one true curve;
* ``a2``: large n rise first, small n rise higher: n* falls (A2 violated).

A study's grid (:func:`grid_tables`) is the sweep's ``runs`` and ``evals`` tables of every key it could train;
:class:`Runs` draws each run's evaluations once and reads them at any leg, as the run loop evaluates at the
step that ends a leg.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from rollscale.core.search.state import SearchGroup

__all__ = ["FAMILIES", "MORE_FAMILIES", "RISING_FAMILIES", "UNIVERSE", "Runs", "SimStudy", "grid_tables", "make_studies", "seed_curve"]

R0 = 0.37
# family -> (grid keys, gains A - R0 for n = 2, 4, 8, 16, C_mid for n = 2, 4, 8, 16)
FAMILIES: dict[str, tuple[tuple[int, ...], tuple[float, ...], tuple[float, ...]]] = {
    "cross": ((2, 4, 8, 16), (0.13, 0.17, 0.21, 0.24), (2500, 5000, 10000, 20000)),
    "edge_low": ((4, 8, 16), (0.20, 0.19, 0.16, 0.13), (4000, 6000, 10000, 18000)),
    "edge_high": ((2, 4, 8), (0.12, 0.15, 0.19, 0.26), (3000, 5000, 8000, 12000)),
    "tie": ((2, 4, 8, 16), (0.13, 0.20, 0.20, 0.14), (5000, 6000, 6000, 20000)),
    "a2": ((2, 4, 8, 16), (0.30, 0.20, 0.16, 0.12), (15000, 8000, 2000, 2000)),
}
# three shapes more (rollscale.core.search.simulate_budget runs both sets)
MORE_FAMILIES: dict[str, tuple[tuple[int, ...], tuple[float, ...], tuple[float, ...]]] = {
    # a late bloomer: n = 16 rises last and highest, below n = 8 until past C_max / 2 (about 25,000)
    "late": ((2, 4, 8, 16), (0.14, 0.17, 0.19, 0.32), (2500, 4000, 6000, 22000)),
    # a close race: n = 4 and n = 8 end within 0.01 of each other at C_max (closer than epsilon 0.02)
    "close": ((2, 4, 8, 16), (0.13, 0.19, 0.20, 0.14), (3000, 5000, 7000, 20000)),
    # curves unbent at C_max: every C_mid at or past 25,000, still rising steeply at 40,000
    "unbent": ((2, 4, 8, 16), (0.22, 0.28, 0.34, 0.40), (25000, 40000, 60000, 100000)),
}
# curves still rising at C_max (science §11.1): the forecast must follow them past the data, and the search must
# not stop the key that wins late
RISING_FAMILIES: dict[str, tuple[tuple[int, ...], tuple[float, ...], tuple[float, ...]]] = {
    # every C_mid past C_max (50,000-200,000): n = 2 leads at C_max, n = 8 at 4 x C_max
    "rising": ((2, 4, 8, 16), (0.22, 0.30, 0.38, 0.44), (50000, 70000, 100000, 200000)),
    # n = 16 rises last and overtakes n = 8 at about 0.8 C_max (32,000 at beta 1.6), still rising steeply there
    "late_flip": ((2, 4, 8, 16), (0.14, 0.17, 0.20, 0.34), (2500, 4000, 8000, 30000)),
}
UNIVERSE = (2, 4, 8, 16)  # every key a study may train: the bracket's limits
SEED_SD = (0.015, 0.05, 0.1)  # a seed's shift of A, log10 C_mid, log beta


@dataclass(frozen=True)
class SimStudy:
    """One simulated rollout-axis study: its grid, true curves (key -> R0, A, C_mid, beta) and noise seed."""

    name: str
    family: str
    keys: tuple[int, ...]
    curves: dict
    seed: int
    seeds: tuple[int, ...] = (0, 1, 2)
    c_max: int = 40_000
    b_problem: int = 16
    eval_every: int = 20
    eval_draws: int = 400  # avg@4 over 100 problems
    # science §9.1: evaluations at the first step reaching c_first * 2^(j / k), (c_first, k); None: every
    # eval_every steps
    schedule: tuple[float, int] | None = None

    def group(self) -> SearchGroup:
        return SearchGroup(self.name, "rollout", self.keys, self.seeds, self.c_max, fixed=self.b_problem,
                           key_min=min(UNIVERSE), key_max=max(UNIVERSE))


def make_studies(per_family: int, seed: int = 0, families: tuple[str, ...] = tuple(FAMILIES),
                 seeds: tuple[int, ...] = (0, 1, 2), schedule: tuple[float, int] | None = None,
                 eval_draws: int = 400) -> list[SimStudy]:
    """``per_family`` studies of each family (:data:`FAMILIES`, :data:`MORE_FAMILIES` or :data:`RISING_FAMILIES`); each study jitters
    its family's curves (gain sd 0.01, log10 C_mid sd 0.08, beta in [1.2, 2]); ``seeds`` each key starts with;
    ``eval_draws`` the samples behind one evaluation (400: avg@4 over 100 problems; 1,600: avg@16)."""
    rng = np.random.default_rng(seed)
    out = []
    shapes = {**FAMILIES, **MORE_FAMILIES, **RISING_FAMILIES}
    for family in families:
        keys, gains, mids = shapes[family]
        for i in range(per_family):
            beta = rng.uniform(1.2, 2.0)
            curves = {}
            shift = rng.normal(0, 0.08)  # the study's budget scale: every C_mid moves together
            for n, g, m in zip(UNIVERSE, gains, mids, strict=True):
                curves[n] = (R0, R0 + g + rng.normal(0, 0.01), 10 ** (math.log10(m) + shift + rng.normal(0, 0.03)),
                             beta)
            if family == "tie":
                curves[8] = curves[4]
            out.append(SimStudy(f"{family}-{i}", family, keys, curves, int(rng.integers(2**31)), seeds=tuple(seeds),
                                eval_draws=eval_draws, schedule=schedule))
    return out


def seed_curve(study: SimStudy, n: int, seed: int) -> tuple[tuple[float, float, float, float], np.random.Generator]:
    """The true curve ``(R0, A, C_mid, beta)`` of run ``(n, seed)``: the key's, moved by the seed (:data:`SEED_SD`);
    and the run's generator, which then draws its evaluations."""
    rng = np.random.default_rng([study.seed, n, seed])
    r0, a, c_mid, beta = study.curves[n]
    a += rng.normal(0, SEED_SD[0])
    c_mid *= 10 ** rng.normal(0, SEED_SD[1])
    beta *= math.exp(rng.normal(0, SEED_SD[2]))
    return (r0, a, c_mid, beta), rng


class Runs:
    """Every simulated run's evaluations: the true curve and noise of each step drawn once, read at any leg."""

    def __init__(self, studies: list[SimStudy]) -> None:
        self.studies = {s.name: s for s in studies}
        self.cache: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}

    def steps(self, study: SimStudy, n: int, c: float) -> int:
        return int(math.ceil(c / (study.b_problem * n) - 1e-9))

    def curve(self, study: SimStudy, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
        key = (study.name, n, seed)
        if key not in self.cache:
            (r0, a, c_mid, beta), rng = seed_curve(study, n, seed)
            c = np.arange(self.steps(study, n, study.c_max) + 1) * study.b_problem * n
            with np.errstate(divide="ignore"):
                p = r0 + (min(a, 1.0) - r0) / (1.0 + (c_mid / np.maximum(c, 1e-9)) ** beta)
            y = rng.binomial(study.eval_draws, np.clip(p, 0, 1)) / study.eval_draws
            self.cache[key] = (c.astype(float), y)
        return self.cache[key]

    def eval_steps(self, study: SimStudy, n: int, last: int) -> np.ndarray:
        """The steps up to ``last`` a run of ``n`` evaluates at (step 0 too)."""
        if study.schedule is None:
            return np.arange(0, last + 1, study.eval_every)
        c_first, per = study.schedule
        doublings = max(0.0, math.log2(study.c_max / c_first))
        budgets = c_first * 2.0 ** (np.arange(int(math.floor(doublings * per + 1e-9)) + 1) / per)
        steps = np.ceil(budgets / (study.b_problem * n) - 1e-9).astype(int)
        return np.union1d([0], steps[steps <= last])

    def points(self, legs: dict[tuple, set]) -> pd.DataFrame:
        """Evaluations of runs ``(study, n, seed)`` trained through the leg-end steps ``legs[run]``."""
        cols: dict[str, list] = {"group": [], "key": [], "run_id": [], "seed": [], "c": [], "avg_at_k": [], "b": []}
        for (name, n, seed), ends in legs.items():
            study = self.studies[name]
            c, y = self.curve(study, n, seed)
            steps = np.union1d(self.eval_steps(study, n, max(ends)), sorted(ends))
            size = len(steps)
            for col, value in (("group", name), ("key", n), ("run_id", f"n{n}_s{seed}"), ("seed", seed),
                               ("b", float(study.b_problem * n))):
                cols[col].append(np.full(size, value, dtype=object if isinstance(value, str) else None))
            cols["c"].append(c[steps])
            cols["avg_at_k"].append(y[steps])
        return pd.DataFrame({k: np.concatenate(v) for k, v in cols.items()})

    def spent(self, legs: dict[tuple, set]) -> pd.Series:
        """Rollouts each study's runs generated (up to their last leg's step)."""
        out: dict[str, float] = {}
        for (name, n, _), ends in legs.items():
            out[name] = out.get(name, 0.0) + max(ends) * self.studies[name].b_problem * n
        return pd.Series(out)


def grid_tables(studies: list[SimStudy], legs: dict | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The full grid of ``studies`` as the sweep's ``runs`` and ``evals`` tables (one bucket per study); with
    ``legs`` ((study, n, seed) -> leg-end steps, a search's) only those runs, each to where it stopped."""
    runs = Runs(studies)
    if legs is None:
        legs = {(s.name, n, seed): {runs.steps(s, n, s.c_max)} for s in studies for n in UNIVERSE for seed in s.seeds}
    pts = runs.points(legs)
    b_problem = {s.name: s.b_problem for s in studies}
    evals = pd.DataFrame({"run_id": pts["group"] + "/" + pts["run_id"], "step": pts["c"] / pts["b"],
                          "c": pts["c"], "avg_at_k": pts["avg_at_k"]})
    first = pts.drop_duplicates(["group", "run_id"])
    table = pd.DataFrame({"run_id": first["group"] + "/" + first["run_id"], "bucket": first["group"],
                          "rule": "uniform", "n": first["key"].astype(int),
                          "b_problem": first["group"].map(b_problem), "seed": first["seed"].astype(int),
                          "c_max": float(studies[0].c_max), "status": "finished"})
    return table.reset_index(drop=True), evals
