"""The forecast replayed on the long grids (science §11.1-11.2, "What it must show").

A long grid is one recipe's every key n = 2 to 32 with 2 seeds trained to 160,000 rollouts (benchmarks/long_grid.py,
its tables in benchmarks/data/): ``long_grid`` on the default's base, ``long_grid_seed1`` on the same recipe's base
trained from another seed (``base.seed: 1``), ``long_grid_mix`` a harder pool on the default's base (the
``easy_hard`` mixture bucket, validation avg@16 0.20 at step 0). From the same runs cut at 40,000 (4x) and at
20,000 (8x) the forecast, its interval calibrated by the cut runs' own backtest at that multiple, or at the largest
it can reach and widened for the doublings past it (§11.4), reads every key at C* = 160,000; a grid's own value
there is each key's per-run fit within its data (§9.3). §11's targets over the grids' keys are tested on the
default form, ``recent_floor``, and on ``recent`` (one rise per doubling for the group), both of which meet them
(``decay``, the default before, misses them at 4x: docs/benchmarks.md); the form chosen leave-one-grid-out meets
them too. The
default study replayed on each grid (benchmarks/grid_replay.py: its runs cut to
sweep.c_max, its search rung by rung, the fit stage's decision) must answer "use n = X" within epsilon of the grid's
best for at most 2 x C* rollouts.
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
GRIDS = {"default base": DATA, "base seed 1": ROOT / "benchmarks" / "data" / "long_grid_seed1",
         "harder pool": ROOT / "benchmarks" / "data" / "long_grid_mix"}
C_STAR = 160_000
EPSILON = 0.02  # study.tolerance's default
# §11's targets over the three grids' 15 keys (docs/benchmarks.md, "The long grids"). At 8x every form is low (the
# curves still leaving their early regime at 20,000), and the intervals cover because the backtest, which reaches
# 4x from there, widens them for the doublings it could not test (§11.4)
FORMS = sorted({"recent", DEFAULT_FORM})


# measured (docs/benchmarks.md, "The long grids"): the second base's best at C* is n = 2 (0.688), which overtakes
# n = 4 past 40,000 (0.555 against 0.535 there, 0.662 at 160,000); every form continues what the data show, so the
# forecast leads with the key ahead at 40,000
WRONG_KEY = ("measured: the second base's n = 4 (0.662 at C*) leads the forecast (recent: 0.67 [0.61, 0.73]); n = 2 "
             "reaches 0.688, 0.026 more: it overtakes past the data")
REPLAY_WRONG_KEY = ("measured: the default study replayed on the second base answers n = 4 (0.662 at C*); n = 2 "
                    "reaches 0.688, 0.026 more; its first line says 'n = 2, 8 and 16 cannot beat it by more than 0.02 "
                    "(as the search settled them, at its one-sided bound; at 95 % D reaches +0.08)'")


@cache
def truth(grid: str) -> dict[int, float]:
    return grid_truth(stored_evals(GRIDS[grid]), C_STAR)


@cache
def forecast_from(grid: str, cut: int, form: str = "recent") -> pd.DataFrame:
    """The ``form`` forecast at C* from the grid's runs cut at ``cut``, as the fit stage reads it (no pass@k bound:
    the study's forecast has none), each key's error and coverage against the grid's own value."""
    rows = cut_forecast(stored_evals(GRIDS[grid]), cut, C_STAR, form, None, resamples=200)
    rows["grid"] = rows["key"].map(truth(grid))
    rows["error"] = rows["reward"] - rows["grid"]
    rows["covered"] = (rows["reward_lo"] <= rows["grid"]) & (rows["grid"] <= rows["reward_hi"])
    return rows.set_index("key")


def both(cut: int, form: str = "recent") -> pd.DataFrame:
    """Every key of every grid at one cut."""
    return pd.concat([forecast_from(grid, cut, form).assign(source=grid) for grid in GRIDS])


@pytest.mark.parametrize("grid", GRIDS)
def test_the_long_grid_is_stored_whole(grid):
    """Every key n = 2 to 32 with 2 seeds, every run to 160,000 rollouts, with its steps and its validation
    problems' profile rows."""
    folder = GRIDS[grid]
    runs = pd.read_parquet(folder / "runs.parquet")
    assert sorted(runs["n"].unique().tolist()) == [2, 4, 8, 16, 32]
    assert (runs.groupby("n")["seed"].nunique() == 2).all()
    assert (runs["status"] == "finished").all() and (runs["c"] >= C_STAR).all()
    steps = pd.read_parquet(folder / "steps.parquet")
    assert set(steps["run_id"]) == set(runs["run_id"])


def test_at_4x_every_key_is_read_past_its_data():
    rows = both(40_000)
    assert len(rows) == 5 * len(GRIDS) and (rows["c_seen"] <= 40_000 * 1.02).all() and rows["extrapolated"].all()


@pytest.mark.parametrize("form", FORMS)
def test_at_4x_the_point_is_unbiased(form):
    rows = both(40_000, form)
    assert abs(rows["error"].mean()) <= 0.02, rows[["source", "error"]]
    assert rows["error"].abs().mean() <= 0.03, rows[["source", "error"]]


@pytest.mark.parametrize("form", FORMS)
def test_at_4x_the_interval_is_narrow(form):
    assert both(40_000, form)["width"].median() <= 0.15


@pytest.mark.parametrize("form", FORMS)
def test_at_4x_the_intervals_cover_90_percent_of_keys(form):
    assert both(40_000, form)["covered"].mean() >= 0.9


@pytest.mark.parametrize("form", FORMS)
def test_at_8x_the_intervals_cover_90_percent_of_keys(form):
    rows = both(20_000, form)
    assert rows["covered"].mean() >= 0.9, rows[["source", "reward_lo", "reward_hi", "grid"]]


def _decisions() -> list:
    """Every (form, cut, grid); base seed 1's measured misses strict xfails. From 20,000 ``recent_floor`` names
    n = 2 there: n = 2's own rise where its data end (0.052 a doubling in the point fit) is the steepest of the
    five keys' (0.037-0.047), and kept; from 40,000 no form does."""
    return [pytest.param(form, cut, grid, marks=pytest.mark.xfail(strict=True, reason=WRONG_KEY))
            if grid == "base seed 1" and (form, cut) != (DEFAULT_FORM, 20_000) else (form, cut, grid)
            for form in FORMS for cut in (40_000, 20_000) for grid in GRIDS]


@pytest.mark.parametrize(("form", "cut", "grid"), _decisions())
def test_the_forecast_decision_is_within_epsilon_of_the_long_grids_best(grid, cut, form):
    true = truth(grid)
    leader = int(forecast_from(grid, cut, form)["leader"].iloc[0])
    assert true[leader] >= max(true.values()) - EPSILON, (cut, leader, true)


@pytest.mark.parametrize("grid", ["default base", pytest.param("base seed 1", marks=pytest.mark.xfail(
    strict=True, reason=REPLAY_WRONG_KEY)), "harder pool"])
def test_the_default_study_replayed_on_the_grid_answers_within_epsilon_for_at_most_2x(grid):
    from grid_replay import replay_study

    from rollscale.config import load_params

    r = replay_study(GRIDS[grid], load_params(ROOT / "params.yaml"))
    assert r["line"].startswith("Use n = ") and r["answered"], r["line"]
    assert r["within_epsilon"], (r["answer"], r["answer_at_c_star"], r["grid_best_key"], r["grid_best"])
    # every key of the default's four with 2 seeds to c_max is 2 x C*; a run ends at the step that crosses it
    assert r["rollouts_over_c_star"] <= 2.01, r["rollouts_over_c_star"]


@cache
def held_out(multiple: float) -> pd.Series:
    """Science §11.1: each grid scored with the form chosen on the others (rollscale.core.fit.form_choice's
    criterion) among the decay and recent forms and recent_floor; every held-out grid's keys together at
    ``multiple``."""
    from rollscale.core.fit.form_choice import leave_one_grid_out

    rows = _logo_rows()
    held = leave_one_grid_out(rows)
    print(held.to_string())
    return held[(held["held_out"] == "all") & (held["multiple"] == multiple)].iloc[0]


@cache
def _logo_rows() -> pd.DataFrame:
    from long_grid import score_rows

    return score_rows(list(GRIDS.values()), ["decay", "recent", "recent_short", "recent_long", "recent_floor"], 0,
                      resamples=100)


def test_the_form_chosen_leave_one_grid_out_meets_the_4x_targets_on_the_held_out_grids():
    four = held_out(4.0)
    assert abs(four["mean_error"]) <= 0.02 and four["mean_abs_error"] <= 0.03, four
    assert four["coverage"] >= 0.9 and four["median_width"] <= 0.15, four


def test_the_form_chosen_leave_one_grid_out_covers_90_percent_at_8x():
    assert held_out(8.0)["coverage"] >= 0.9


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
