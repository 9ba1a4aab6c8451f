"""The sweep stage's search (science §9.4) on the tiny study: runs pause at rung budgets and resume
bit-identically, the decisions are the replay's of the same grid, a stopped run says why, a rerun trains
nothing, and a grid sweep afterwards trains the stopped runs on to C_max."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

import rollscale.sweep.rungs as search_tasks
from flows.sweep import sweep_flow
from rollscale.config import load_params
from rollscale.core.search.replay import replay
from rollscale.pipeline.stages.status import search_progress
from rollscale.train.checkpoint import RunStore
from rollscale.sweep.groups import search_settings
from tests.test_study import copy_study, prepared_study, sweep_rows, write_params

pytestmark = pytest.mark.slow

# the search of science §9.4 from both seeds, within the grid's keys (the bracket adds none)
SWEEP = {"n": [2, 4, 8], "b_problem": [4], "c_max": 192, "seeds": [0, 1], "eval_every": 2, "checkpoint_every": 4,
         "search": {"method": "decision", "seeds_min": 2, "eta": 2.0, "first_rung": 0.25, "key_max": 8}}
GROUP = "n:bucket=easy/rule=uniform/b_problem=4"


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    return prepared_study(tmp_path_factory)


@pytest.fixture(scope="module")
def grid(prepared, tmp_path_factory):
    root = tmp_path_factory.mktemp("grid")
    art = copy_study(prepared, root)
    params = write_params(root, sweep={**SWEEP, "search": {**SWEEP["search"], "method": "grid"}})
    sweep_flow(params_path=str(params), artifacts=str(art))
    return root


def tables(art: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    runs = pd.concat([pd.read_parquet(p) for p in sorted((art / "sweep" / "runs").glob("*/run.parquet"))])
    return runs.reset_index(drop=True), sweep_rows(art, "evals")


@pytest.mark.parametrize("method", ["decision", "forecast"])
def test_search_decides_as_the_replay_of_the_same_grid(prepared, grid, tmp_path, method):
    """science §9.4 (sweep.search.method: decision) and §10.5 (forecast): the sweep's decisions are the replay's of
    the same grid (one dispatch), every row carries C*, the group ends with every key stopped or finished, and every
    run that reached C_max, paused and resumed at every rung, has the grid's rows bit for bit."""
    art = copy_study(prepared, tmp_path)
    search = {**SWEEP["search"], "method": method} | ({"bootstrap_resamples": 50} if method == "forecast" else {})
    params = write_params(tmp_path, sweep={**SWEEP, "search": search})
    sweep_flow(params_path=str(params), artifacts=str(art))
    decisions = pd.read_parquet(art / "sweep" / "search.parquet")
    assert set(decisions["group"]) == {GROUP} and (decisions["c_star"] == 192).all()  # rungs at 48, 96, 192
    last = decisions[decisions["decision"] == decisions["decision"].max()]
    assert set(last["action"]) <= {"stop", "finish"}
    p = load_params(params)
    grid_runs, grid_evals = tables(grid / "artifacts")
    replayed = replay(grid_runs, grid_evals, "n", search_settings(p.sweep, p.study, p.bucket.val_size), b_max=p.sweep.b_max)
    pd.testing.assert_frame_equal(decisions.reset_index(drop=True), replayed.decisions.reset_index(drop=True),
                                  check_dtype=False)
    # paused and resumed at every rung, each run ends with the grid's rows, bit for bit
    runs, evals = tables(art)
    finished = set(runs.loc[runs["status"] == "finished", "run_id"])
    assert finished and (runs.loc[runs["status"] == "finished", "end_reason"] == "budget reached").all()
    mine = evals[evals["run_id"].isin(finished)].reset_index(drop=True)
    pd.testing.assert_frame_equal(mine, grid_evals[grid_evals["run_id"].isin(finished)].reset_index(drop=True))


def _held(rows: pd.DataFrame) -> pd.DataFrame:
    """A forced stop held: the search resumes a stopped key its rules do not settle against the final answer
    (science §11.3), which a stop the test forced is not; these tests are about what a stopped run shows."""
    return rows[~((rows["key"] == "8") & (rows["action"] == "resume"))].reset_index(drop=True)


def test_a_stopped_run_says_why_a_rerun_trains_nothing_and_a_grid_trains_it_on(prepared, grid, tmp_path,
                                                                               monkeypatch, capsys):
    decide = search_tasks.decide

    def stop_n8_at_rung_1(points, groups, decisions, settings):
        rows = decide(points, groups, decisions, settings)
        forced = (rows["rung"] == 1) & (rows["key"] == "8")
        rows.loc[forced, ["action", "rule", "note"]] = ["stop", "epsilon", "forced by the test"]
        rows.loc[forced, "c_train"] = 64.0  # as a stop decides: trained to this rung's leg (its evaluation past 48)
        return _held(rows)

    monkeypatch.setattr(search_tasks, "decide", stop_n8_at_rung_1)
    art = copy_study(prepared, tmp_path)
    params = write_params(tmp_path, sweep=SWEEP)
    sweep_flow(params_path=str(params), artifacts=str(art))
    assert "stop 8 (rule epsilon)" in capsys.readouterr().out
    runs, evals = tables(art)
    stopped = runs[runs["n"] == 8]
    assert (stopped["status"] == "stopped").all() and (stopped["end_reason"] == "stopped at rung 1 by rule epsilon").all()
    # rung 1 is C = 48; a run's leg ends at its first evaluation past it (every 2 steps of 32 rollouts: 64)
    assert (stopped["stop_rung"] == 1).all() and (stopped["c"] == 64).all()
    for run_id in stopped["run_id"]:
        assert RunStore(art / "sweep" / "runs" / run_id).done()["status"] == "stopped"
    lines = search_progress(art)
    assert any("stopped" in line and "8" in line for line in lines), lines

    # the rerun reads the decisions back: nothing trains, nothing is written again
    before = {p: p.stat().st_mtime_ns for p in (art / "sweep").rglob("*.parquet")}
    sweep_flow(params_path=str(params), artifacts=str(art))
    assert "sweep: 0 runs to train now" in capsys.readouterr().out
    assert {p: p.stat().st_mtime_ns for p in (art / "sweep").rglob("*.parquet") if p in before} == before

    # other settings: the decisions are made anew (the old ones archived) from the same runs, and the runs
    # stopped again say so again (in between, the new rung 1 had them paused)
    write_params(tmp_path, sweep={**SWEEP, "search": {**SWEEP["search"], "alpha": 0.35}})
    sweep_flow(params_path=str(params), artifacts=str(art))
    assert list((art / "sweep" / "archive").glob("search-*.parquet"))
    again, _ = tables(art)
    pd.testing.assert_frame_equal(again, runs)

    # a grid sweep afterwards trains the stopped runs on, and every run ends with the grid's rows
    monkeypatch.setattr(search_tasks, "decide", decide)
    write_params(tmp_path, sweep={**SWEEP, "search": {**SWEEP["search"], "method": "grid"}})
    sweep_flow(params_path=str(params), artifacts=str(art))
    runs, evals = tables(art)
    assert (runs["status"] == "finished").all()
    assert pd.read_parquet(art / "sweep" / "search.parquet").empty
    assert len(list((art / "sweep" / "archive").glob("search-*.parquet"))) == 2
    pd.testing.assert_frame_equal(evals, tables(grid / "artifacts")[1])


def test_a_damaged_ended_run_is_shown_damaged_and_retrained_to_the_untouched_tables(prepared, tmp_path, monkeypatch):
    """Issue 31, part 1: with the search done (so nothing is in its plan), a finished run whose run.parquet
    was edited and a stopped run with a byte flipped in an evals part are "damaged" in `status` and for the
    study; the next sweep trains them again from their last good checkpoints (the stopped one back to its
    stop budget, marked stopped again) to the untouched tables, and leaves nothing damaged to record. Then a
    grid change the sweep refuses (it would drop ended runs) moves nothing, the search table included."""
    from rollscale.pipeline.stages.outputs import run_damage, stage_problem, unrebuilt_damage, write_outputs_manifest
    from rollscale.pipeline.stages.status import sweep_progress

    decide = search_tasks.decide

    def stop_n8_at_rung_1(points, groups, decisions, settings):
        rows = decide(points, groups, decisions, settings)
        forced = (rows["rung"] == 1) & (rows["key"] == "8")
        rows.loc[forced, ["action", "rule", "note"]] = ["stop", "epsilon", "forced"]
        rows.loc[forced, "c_train"] = rows.loc[forced, "c"]  # as a stop decides: trained to this rung's budget
        return _held(rows)

    monkeypatch.setattr(search_tasks, "decide", stop_n8_at_rung_1)
    art = copy_study(prepared, tmp_path)
    params = write_params(tmp_path, sweep=SWEEP)
    sweep_flow(params_path=str(params), artifacts=str(art))
    write_outputs_manifest(art, "sweep")  # as the stage does when it finishes
    runs_dir = art / "sweep" / "runs"
    untouched = {p.relative_to(runs_dir): p.read_bytes() for p in runs_dir.glob("*/*") if p.is_file()
                 and p.name in ("run.parquet", "done.json")}
    steps, evals = sweep_rows(art, "steps"), sweep_rows(art, "evals")
    runs, _ = tables(art)
    finished = runs.loc[runs["status"] == "finished", "run_id"].iloc[0]
    stopped = runs.loc[runs["status"] == "stopped", "run_id"].iloc[0]
    assert stage_problem(art, "sweep") is None

    edited = runs_dir / finished / "run.parquet"
    pd.read_parquet(edited).assign(status="failed").to_parquet(edited, index=False)
    part = sorted((runs_dir / stopped).glob("evals-*.parquet"))[0]
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 0xFF
    part.write_bytes(bytes(data))

    shown = {r.run_id: r for r in sweep_progress(art, sweep_running=False)}
    assert shown[finished].status == "damaged" and f"{finished}/run.parquet" in shown[finished].error
    assert shown[stopped].status == "damaged" and part.name in shown[stopped].error
    assert stage_problem(art, "sweep") is not None  # `rollscale study` runs the sweep again
    left = unrebuilt_damage(art, "sweep")

    sweep_flow(params_path=str(params), artifacts=str(art))
    assert left() is None  # every damaged file rebuilt: the stage may record its outputs
    assert {p.relative_to(runs_dir): p.read_bytes() for p in runs_dir.glob("*/*") if p.is_file()
            and p.name in ("run.parquet", "done.json")} == untouched
    pd.testing.assert_frame_equal(sweep_rows(art, "steps"), steps)
    pd.testing.assert_frame_equal(sweep_rows(art, "evals"), evals)
    write_outputs_manifest(art, "sweep")
    assert not any(run_damage(art, d) for d in runs_dir.iterdir())

    # part 2: a grid that would drop ended runs is refused before anything is moved (the search table too)
    decisions = (art / "sweep" / "search.parquet").read_bytes()
    write_params(tmp_path, sweep={**SWEEP, "n": [2, 4]})
    with pytest.raises(ValueError, match="would move 2 ended runs"):
        sweep_flow(params_path=str(params), artifacts=str(art))
    assert (art / "sweep" / "search.parquet").read_bytes() == decisions
    assert not (art / "sweep" / "archive").exists() and stage_problem(art, "sweep") is None
