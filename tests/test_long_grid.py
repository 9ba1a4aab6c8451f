"""The forecast replayed on the long grid (science §10, "What it must show"; issue 39, part 5).

The long grid is the embedded default's every key n = 2 to 32 with 2 seeds trained to 160,000 rollouts
(benchmarks/long_grid.py, its tables in benchmarks/data/long_grid/). From the same runs cut at 40,000 and at
80,000 the forecast (science §10.2) reads every key at C* = 160,000; the long grid's own value there is each key's
per-run fit within its data (§9.3, the forecast table's ``per_run``). The nominal 95 % intervals must cover it in
at least 90 % of keys x cuts, and the forecast's leader must be within epsilon of the long grid's best.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pandas as pd
import pytest

from rollscale.core.fit.forecast import ForecastSettings, forecast_group

DATA = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "long_grid"
C_STAR = 160_000
CUTS = (40_000, 80_000)
EPSILON = 0.02  # study.tolerance's default
# the default study's validation: avg@16 over 100 problems (each evaluation's redrawn noise in the bootstrap)
SETTINGS = ForecastSettings(resamples=200, eval_draws=100 * 16, seed=0)


@cache
def long_grid() -> pd.DataFrame:
    """The long grid's evaluations with their runs' key and seed."""
    runs = pd.read_parquet(DATA / "runs.parquet")
    return pd.read_parquet(DATA / "evals.parquet").merge(runs[["run_id", "n", "seed"]], on="run_id")


@cache
def truth() -> pd.Series:
    """Each key's per-run fit at C* within its data (its runs reached C*), by key."""
    rows = forecast_group(long_grid(), "n", C_STAR, settings=SETTINGS)
    trained = rows[rows["trained"]].set_index("key")
    assert not trained["extrapolated"].any(), trained["c_seen"]
    return trained["per_run"]


@cache
def forecast_from(cut: int) -> pd.DataFrame:
    evals = long_grid()
    rows = forecast_group(evals[evals["c"] <= cut], "n", C_STAR, settings=SETTINGS)
    return rows[rows["trained"]].set_index("key")


def test_the_long_grid_is_stored_whole():
    """Every key n = 2 to 32 with 2 seeds, every run to 160,000 rollouts."""
    runs = pd.read_parquet(DATA / "runs.parquet")
    assert sorted(runs["n"].unique().tolist()) == [2, 4, 8, 16, 32]
    assert (runs.groupby("n")["seed"].nunique() == 2).all()
    assert (runs["status"] == "finished").all() and (runs["c"] >= C_STAR).all()
    steps = pd.read_parquet(DATA / "steps.parquet")
    assert set(steps["run_id"]) == set(runs["run_id"])


@pytest.mark.parametrize("cut", CUTS)
def test_forecasts_from_cut_runs_are_read_past_the_data(cut):
    rows = forecast_from(cut)
    assert (rows["c_seen"] <= cut).all() and rows["extrapolated"].all()
    assert rows["reward_lo"].between(0, 1).all() and rows["reward_hi"].between(0, 1).all()


def test_forecasts_cover_the_long_grid_in_90_percent_of_keys_and_cuts():
    true = truth()
    covered = [bool(forecast_from(cut).loc[k, "reward_lo"] <= true[k] <= forecast_from(cut).loc[k, "reward_hi"])
               for cut in CUTS for k in true.index]
    assert sum(covered) >= 0.9 * len(covered), (covered, true.to_dict(),
                                                 {cut: forecast_from(cut)[["reward_lo", "reward_hi"]].to_dict()
                                                  for cut in CUTS})


@pytest.mark.parametrize("cut", CUTS)
def test_the_forecast_decision_is_within_epsilon_of_the_long_grids_best(cut):
    true = truth()
    leader = int(forecast_from(cut)["leader"].iloc[0])
    assert true[leader] >= true.max() - EPSILON, (cut, leader, true.to_dict())
