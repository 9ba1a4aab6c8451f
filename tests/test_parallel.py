"""Both cores: profile chunks, measure's group sizes and sweep runs in a pool of 2 worker
processes give exactly the tables of one worker, because every unit is seeded by itself
(chunk index, run config), never by the worker that runs it."""

from __future__ import annotations

import os

import pandas as pd
import pytest

from flows.measure import measure_flow
from flows.profile import profile_flow
from flows.sweep import sweep_flow
from rollscale.pipeline.stages.status import read_attempts
from tests.test_study import copy_study, prepared_study, sweep_rows, write_params

pytestmark = pytest.mark.slow

# 2 x 2 runs and 3 profile chunks: more units than workers
SWEEP = {"n": [2, 4], "seeds": [0, 1], "c_max": 48}
MEASURE = {"bucket": "easy", "n": [3, 4], "b_problem": 4, "steps": 2}


@pytest.fixture(scope="module")
def stages(tmp_path_factory):
    prepared = prepared_study(tmp_path_factory)
    out = {}
    for workers in (1, 2):
        root = tmp_path_factory.mktemp(f"workers{workers}")
        art = copy_study(prepared, root)
        params = str(write_params(root, workers=workers, sweep=SWEEP, measure=MEASURE))
        if workers == 1:  # the prepared study's profile is one worker's (TINY, the same pool and sampling)
            profile = pd.read_parquet(art / "profile" / "profile.parquet")
        else:
            (art / "profile").rename(art / "profile-prepared")  # profiled again, by two workers
            (art / "profile").mkdir()
            profile = profile_flow(params_path=params, artifacts=str(art))
        out[workers] = {
            "artifacts": art,
            "profile": profile,
            "measure": measure_flow(params_path=params, artifacts=str(art)),
            "runs": sweep_flow(params_path=params, artifacts=str(art)),
        }
    return out


def test_profile_chunks_in_two_workers_equal_one(stages):
    one, two = stages[1]["profile"], stages[2]["profile"]
    assert len(one) > 2 * 40  # three chunks of 40
    pd.testing.assert_frame_equal(two, one)


def test_measure_n_values_in_two_workers_equal_one(stages):
    for table in ("noise_steps", "noise_prompts"):
        one, two = stages[1]["measure"][table], stages[2]["measure"][table]
        assert set(one["n"]) == {3, 4}
        timings = [c for c in one if c.startswith("t_")]  # seconds: the machine's, not the science's
        pd.testing.assert_frame_equal(two.drop(columns=timings), one.drop(columns=timings))


def test_sweep_runs_in_two_workers_equal_one(stages):
    one, two = stages[1], stages[2]
    assert list(two["runs"]["status"]) == ["finished"] * 4
    for kind in ("steps", "evals"):
        pd.testing.assert_frame_equal(sweep_rows(two["artifacts"], kind), sweep_rows(one["artifacts"], kind))
    cols = ["run_id", "seed", "status", "steps", "c", "c_tokens"]
    pd.testing.assert_frame_equal(two["runs"][cols], one["runs"][cols])


def test_two_workers_are_two_processes_besides_this_one(stages):
    runs = stages[2]["artifacts"] / "sweep" / "runs"
    pids = {read_attempts(d)[0]["pid"] for d in runs.iterdir() if d.is_dir()}
    assert len(pids) == 2 and os.getpid() not in pids
    one = stages[1]["artifacts"] / "sweep" / "runs"
    assert {read_attempts(d)[0]["pid"] for d in one.iterdir() if d.is_dir()} == {os.getpid()}
