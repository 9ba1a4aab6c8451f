"""The forecast replayed on the long grid (science §11.1-11.2, "What it must show").

The long grid is the embedded default's every key n = 2 to 32 with 2 seeds trained to 160,000 rollouts
(benchmarks/long_grid.py, its tables in benchmarks/data/long_grid/). From the same runs cut at 40,000 (4x) and at
20,000 (8x) the default forecast, its interval calibrated by the cut runs' own backtest at that multiple (§11.4),
reads every key at C* = 160,000; the grid's own value there is each key's per-run fit within its data (§9.3).
Measured (docs/journal/2026-11-28-forecast.md): at 4x mean signed error -0.019, mean absolute error 0.027, median
width 0.086, coverage 3 of 5 keys (below §11's 90 %: n = 2 and 4 rise faster past 40,000 than before it); at
8x mean signed error -0.037, coverage 4 of 5. The two coverage targets are strict xfails: they pass when a
forecast meets them.
"""

from __future__ import annotations

import sys
from functools import cache
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from long_grid import cut_forecast, grid_truth, stored_evals  # noqa: E402

from rollscale.core.fit.forms import DEFAULT_FORM  # noqa: E402

DATA = ROOT / "benchmarks" / "data" / "long_grid"
C_STAR = 160_000
EPSILON = 0.02  # study.tolerance's default


@cache
def truth() -> dict[int, float]:
    return grid_truth(stored_evals(DATA), C_STAR)


@cache
def forecast_from(cut: int) -> pd.DataFrame:
    rows = cut_forecast(stored_evals(DATA), cut, C_STAR, DEFAULT_FORM, None, resamples=200)
    rows["grid"] = rows["key"].map(truth())
    rows["error"] = rows["reward"] - rows["grid"]
    rows["covered"] = (rows["reward_lo"] <= rows["grid"]) & (rows["grid"] <= rows["reward_hi"])
    return rows.set_index("key")


def test_the_long_grid_is_stored_whole():
    """Every key n = 2 to 32 with 2 seeds, every run to 160,000 rollouts."""
    runs = pd.read_parquet(DATA / "runs.parquet")
    assert sorted(runs["n"].unique().tolist()) == [2, 4, 8, 16, 32]
    assert (runs.groupby("n")["seed"].nunique() == 2).all()
    assert (runs["status"] == "finished").all() and (runs["c"] >= C_STAR).all()
    steps = pd.read_parquet(DATA / "steps.parquet")
    assert set(steps["run_id"]) == set(runs["run_id"])


def test_at_4x_the_point_is_unbiased_and_the_interval_narrow():
    rows = forecast_from(40_000)
    assert (rows["c_seen"] <= 40_000 * 1.02).all() and rows["extrapolated"].all()
    assert abs(rows["error"].mean()) <= 0.02, rows["error"].to_dict()
    assert rows["error"].abs().mean() <= 0.03, rows["error"].to_dict()
    assert rows["width"].median() <= 0.15


@pytest.mark.xfail(strict=True, reason="measured 3 of 5 keys at 4x: n = 2 and 4 rise faster past 40,000 than "
                                       "before it, and the backtest within 40,000 did not show it")
def test_at_4x_the_intervals_cover_90_percent_of_keys():
    assert forecast_from(40_000)["covered"].mean() >= 0.9


@pytest.mark.xfail(strict=True, reason="measured 4 of 5 keys at 8x: n = 2's upper bound 0.597 against the grid's "
                                       "0.604 (its rise past 20,000 faster than before it)")
def test_at_8x_the_intervals_cover_90_percent_of_keys():
    rows = forecast_from(20_000)
    assert rows["covered"].mean() >= 0.9, rows[["reward_lo", "reward_hi", "grid"]].to_dict()


@pytest.mark.parametrize("cut", [40_000, 20_000])
def test_the_forecast_decision_is_within_epsilon_of_the_long_grids_best(cut):
    true = truth()
    leader = int(forecast_from(cut)["leader"].iloc[0])
    assert true[leader] >= max(true.values()) - EPSILON, (cut, leader, true)


def test_a_grid_folder_without_a_profile_says_it_forecasts_without_the_bound(tmp_path, capsys):
    import long_grid

    for name in ("runs", "evals"):
        (tmp_path / f"{name}.parquet").write_bytes((DATA / f"{name}.parquet").read_bytes())
    sys.argv = ["long_grid.py", "--grid", str(tmp_path), "--cut", "80000", "--target", "160000", "--json",
                "--no-calibrate"]
    long_grid.main()
    import json

    rows = json.loads(capsys.readouterr().out)
    assert [r["key"] for r in rows] == [2, 4, 8, 16, 32]
    assert {"key", "reward", "reward_lo", "reward_hi", "d", "d_lo", "d_hi", "leader", "error"} <= set(rows[0])
    assert all(r["ceiling"] is None for r in rows)
    sys.argv = sys.argv[:-1]
    sys.argv.remove("--json")
    long_grid.main()
    assert "no profile table: forecast without the pass@k bound" in capsys.readouterr().out
