"""Results nobody can damage (issue 42, parts 1-4), on one small finished study built once: a stage that
reads a run refuses damaged evidence in one line naming the run and the repair, and the repair gives the
untouched answer; a stage publishes its tables all at once; a damaged `search` table is rebuilt from the
runs' own records. (An interrupted study keeps its own work: the DVC case is tests/test_dvc.py's Ctrl-C test.)"""

from __future__ import annotations

import errno
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from flows.__main__ import run_stage
from rollscale.pipeline.query.storage import DamagedResultError
from rollscale.pipeline.stages.outputs import stage_problem
from tests.test_study import copy_study, prepared_study, write_params

pytestmark = pytest.mark.slow

# two keys searched by rungs (16, 32, 64 rollouts), several checkpoints per run
SWEEP = {"n": [2, 4], "b_problem": [4], "c_max": 64, "eval_every": 2, "checkpoint_every": 2,
         "search": {"method": "decision", "eta": 2.0, "first_rung": 0.25}}


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A study whose sweep and fit ran as `rollscale run` runs them (each stage's record of checksums
    written); read-only: :func:`study_copy` it."""
    prepared = prepared_study(tmp_path_factory)
    root = tmp_path_factory.mktemp("finished")
    art = copy_study(prepared, root)
    params = write_params(root, sweep=SWEEP)
    for stage in ("sweep", "fit"):
        run_stage(stage, str(params), str(art), False)
    return root


def study_copy(finished: Path, dest: Path) -> tuple[Path, Path]:
    """A copy of the finished study: (its artifacts folder, its params file)."""
    shutil.copytree(finished, dest / "study", symlinks=True, copy_function=shutil.copy2)
    return dest / "study" / "artifacts", dest / "study" / "params.yaml"


def files_of(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")}


def newest(run_dir: Path, pattern: str) -> Path:
    return sorted(run_dir.glob(pattern))[-1]


def retabled(path: Path, **changes) -> None:
    """A tamperer's edit: the same table with other values (readable Parquet, another checksum)."""
    df = pd.read_parquet(path)
    df.assign(**{k: v(df) for k, v in changes.items()}).to_parquet(path, index=False)


def edited_json(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data, indent=1))


def shifted_bytes(data: dict) -> None:  # the manifest says another size for the weights
    data["files"]["model.pt"]["bytes"] += 1


def flip_a_byte(path: Path) -> None:
    """Same size, another checksum (a bad disk): a check by size alone misses it."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


# each file a run is made of: where it is in the run folder, and how it is altered
RUN_FILES = {
    "manifest": (lambda d: newest(d, "ckpt-*") / "MANIFEST.json", lambda p: edited_json(p, shifted_bytes)),
    "evals part": (lambda d: newest(d, "evals-*.parquet"), lambda p: retabled(p, avg_at_k=lambda df: df["avg_at_k"] + 0.1)),
    "steps part": (lambda d: newest(d, "steps-*.parquet"), lambda p: retabled(p, c=lambda df: df["c"] + 1)),
    "checkpoint shard": (lambda d: newest(d, "ckpt-*") / "model.pt", flip_a_byte),
    "run.parquet": (lambda d: d / "run.parquet", lambda p: retabled(p, c=lambda df: df["c"] - 1)),
    "done.json": (lambda d: d / "done.json", lambda p: edited_json(p, lambda data: data.update(steps=1))),
}


def longest_run(art: Path) -> Path:
    """The run with the most checkpoints: its newest one has an older one to fall back on."""
    runs = sorted((art / "sweep" / "runs").iterdir(), key=lambda d: (len(list(d.glob("ckpt-*"))), d.name))
    assert len(list(runs[-1].glob("ckpt-*"))) >= 2
    return runs[-1]


def damage(run_dir: Path, what: str, how: str) -> Path:
    """Remove or alter the ``what`` of :data:`RUN_FILES` in ``run_dir``."""
    where, alter = RUN_FILES[what]
    victim = where(run_dir)
    if how == "removed":
        victim.unlink()
    else:
        alter(victim)
    return victim


@pytest.mark.parametrize("how", ["removed", "altered"])
@pytest.mark.parametrize("what", list(RUN_FILES))
def test_a_fit_refuses_a_damaged_run_in_one_line_naming_the_run_and_the_repair(finished, tmp_path, what, how):
    """Issue 42, part 1 (case 1: a removed checkpoint manifest changed the answer silently): each file a run is
    made of, removed or altered, makes `run fit` refuse in one line naming the run and `rollscale study`,
    before it writes anything: the fit's tables and their record stay as they were."""
    art, params = study_copy(finished, tmp_path)
    run_dir = longest_run(art)
    fit_before = files_of(art / "fit")
    damage(run_dir, what, how)
    with pytest.raises(DamagedResultError) as refused:
        run_stage("fit", str(params), str(art), False)
    line = str(refused.value)
    assert len(line.splitlines()) == 1 and line.startswith(f"fit: sweep run {run_dir.name} is damaged"), line
    assert "`rollscale study`" in line, line
    assert files_of(art / "fit") == fit_before  # tables and MANIFEST.json: nothing recorded over damage


def test_the_sweep_repairs_damaged_runs_and_the_fit_gives_the_untouched_decision(finished, tmp_path):
    """Issue 42, part 1: the repair `rollscale study` makes (the sweep run again, then the fit) on a run whose
    newest checkpoint lost its manifest (it falls back to the one before and trains the lost steps again) and
    a run whose done.json was removed and an evals part altered: nothing damaged is left, and the fit's
    decision is the untouched one, byte for byte."""
    art, params = study_copy(finished, tmp_path)
    fit_before = files_of(art / "fit")
    runs = sorted((art / "sweep" / "runs").iterdir())
    damage(runs[0], "manifest", "removed")
    damage(runs[1], "done.json", "removed")
    damage(runs[1], "evals part", "altered")
    run_stage("sweep", str(params), str(art), False)
    assert stage_problem(art, "sweep") is None
    run_stage("fit", str(params), str(art), False)
    after = files_of(art / "fit")
    assert {t: after[t] for t in ("decision.parquet", "record_points.parquet")} == {
        t: fit_before[t] for t in ("decision.parquet", "record_points.parquet")}


def test_a_fit_that_fails_midway_keeps_the_earlier_tables_whole_and_consistent(finished, tmp_path, monkeypatch):
    """Issue 42, part 3 (case 3: a fit failing on a full disk had replaced record_points but not fits and
    decision): the disk fills while the fit writes its third table; every table and the stage's record of
    checksums are the earlier ones, no temporary file is left, and queries read them without a note."""
    from rollscale.pipeline.query.storage import query

    art, params = study_copy(finished, tmp_path)
    write_params(params.parent, sweep=SWEEP, fit={"bin_width": 0.2})  # fewer record points: every table changes
    before = files_of(art / "fit")
    points = query("select * from record_points", art)
    to_parquet, written = pd.DataFrame.to_parquet, []

    def disk_full_at_the_third_table(df, path, *args, **kwargs):
        if Path(path).parent == art / "fit":
            written.append(path)
            if len(written) == 3:
                raise OSError(errno.ENOSPC, "No space left on device")
        return to_parquet(df, path, *args, **kwargs)

    monkeypatch.setattr(pd.DataFrame, "to_parquet", disk_full_at_the_third_table)
    with pytest.raises(OSError, match="No space left on device"):
        run_stage("fit", str(params), str(art), False)
    assert len(written) == 3
    assert files_of(art / "fit") == before
    assert not [p.name for p in (art / "fit").iterdir() if p.name.endswith(".tmp")]
    assert stage_problem(art, "fit") is None
    pd.testing.assert_frame_equal(query("select * from record_points", art), points)


def garbage_inside(path: Path) -> None:
    """14 bytes of garbage in the middle, the footer intact (issue 55, case 5: "Couldn't deserialize thrift")."""
    data = bytearray(path.read_bytes())
    data[len(data) // 3: len(data) // 3 + 14] = b"\xde\xad\xbe\xef garbage!"
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["altered", "removed", "garbage inside", "foreign"])
def test_a_damaged_search_table_is_marked_and_rebuilt_from_the_runs_own_records(finished, tmp_path, how):
    """Issue 42, part 4 (case 4: a damaged search.parquet stopped the study with "restore or delete that file",
    and deleting it asked to archive ended runs; `status` printed the tampered table): `status` says the table
    is damaged instead of printing it, and the sweep run again (what `rollscale study` runs) rebuilds it from
    the runs' evaluations to the same bytes, training nothing and archiving no run."""
    from rollscale.pipeline.stages.status import search_progress

    art, params = study_copy(finished, tmp_path)
    sweep = art / "sweep"
    table = sweep / "search.parquet"
    good, shown = table.read_bytes(), search_progress(art)
    assert shown and not pd.read_parquet(table).empty
    runs = {p.relative_to(sweep): p.read_bytes() for p in (sweep / "runs").rglob("*")
            if p.is_file() and p.name != "attempts.jsonl"}
    if how == "removed":
        table.unlink()
    else:
        {"altered": lambda p: retabled(p, c=lambda df: df["c"] * 2), "garbage inside": garbage_inside,
         "foreign": lambda p: pd.DataFrame({"answer": [42]}).to_parquet(p)}[how](table)
        [line] = search_progress(art)
        assert line.startswith("search: damaged, not shown: ") and "search.parquet" in line, line
        assert "`rollscale study` rebuilds it" in line, line
    assert "search.parquet" in stage_problem(art, "sweep")

    run_stage("sweep", str(params), str(art), False)
    assert table.read_bytes() == good and search_progress(art) == shown
    assert not (sweep / "archive").exists()
    assert {p.relative_to(sweep): p.read_bytes() for p in (sweep / "runs").rglob("*")
            if p.is_file() and p.name != "attempts.jsonl"} == runs
    assert stage_problem(art, "sweep") is None


def test_a_rebuilt_search_replays_no_rung_from_the_runs_of_another_config(finished, tmp_path):
    """A damaged search table is rebuilt from the runs' own records, before the sweep archives the runs whose
    config changed: with `c_max` changed, those are the earlier runs (the same run ids), and the rebuilt search
    had passed its first rungs on their evaluations, so the new runs trained straight to a later rung (the
    default at c_max 80,000 from a study at 40,000, 2026-11-27). A run's records count only for its own config."""
    from rollscale.config import load_params
    from rollscale.sweep.rungs import SweepSearch
    from tasks.models import sampling_config

    art, params = study_copy(finished, tmp_path)
    same = load_params(params)
    rebuilt = SweepSearch(same, art / "sweep", sampling_config(same.sampling), damage="damaged (test)")
    assert rebuilt.rebuilt and not rebuilt.decisions.empty  # the control: its own runs replay its rungs
    longer = load_params(write_params(params.parent, sweep={**SWEEP, "c_max": 128}))
    search = SweepSearch(longer, art / "sweep", sampling_config(longer.sampling), damage="damaged (test)")
    assert not search.rebuilt and search.decisions.empty


FIT_TABLES = ("fits", "frontier", "steps_to_target", "crs_prediction", "epoch_transitions", "record_points",
              "decision", "forecast", "backtest")


def every_reader_refuses(art: Path, params: Path, table: str) -> list[str]:
    """The one line each reader of ``table`` says: `rollscale sql`, the report's and `track`'s reader (the next
    stage's table reader, tasks.fit.read_tables), the report stage's own check of its inputs and, for the
    decision, `rollscale export`: each must refuse. Returns those lines."""
    from rollscale.pipeline.errors import explain
    from rollscale.pipeline.query.storage import query
    from tasks.fit import read_tables

    lines = []
    for read in (lambda: query(f"select * from {table}", art), lambda: read_tables(art, [table]),
                 lambda: run_stage("report", str(params), str(art), False)):
        with pytest.raises(DamagedResultError) as refused:
            read()
        lines.append(str(refused.value))
    if table == "decision":
        from rollscale.integrations.export.command import export_run
        from rollscale.pipeline.query.storage import read_table

        tmp = art.parent / "exports"  # nothing may be written there
        with pytest.raises(DamagedResultError) as refused:
            export_run("trl", str(params), str(art), output=str(tmp / "trl.yaml"), read_table=read_table)
        assert not list(tmp.iterdir())
        lines.append(explain(refused.value)[0])
    return lines


@pytest.mark.parametrize("how", ["finished", "interrupted", "failed"])
def test_a_changed_fit_table_is_refused_by_every_reader_after_any_fit(finished, tmp_path, how):
    """Issue 55, part 1 (cases 1, 2: after a fit that did not finish a rewritten decision was printed by `sql`,
    reported and exported; after a finished one `export` read it unchecked): each fit table, rewritten with
    other values, is refused by every reader in one line naming the file and the command that repairs it,
    whether the fit's last run finished, was interrupted or failed; the untouched tables stay readable."""
    from rollscale.pipeline.query.storage import query
    from rollscale.pipeline.stages.specs import FAILED, RUN_INFO
    from rollscale.pipeline.stages.status import StageStatus, with_damage

    state = {"finished": "done", "interrupted": "interrupted", "failed": "failed"}
    art, params = study_copy(finished, tmp_path)
    (art.parent / "exports").mkdir()
    if how == "interrupted":  # as stage_lock leaves a run stopped by Ctrl-C
        (art / "fit" / RUN_INFO).write_text(json.dumps({"stage": "fit", "pid": 1, "interrupted_at": "now"}))
    elif how == "failed":
        (art / "fit" / FAILED).write_text(json.dumps({"stage": "fit", "error": "RuntimeError: boom"}))
    for table in FIT_TABLES:
        path = art / "fit" / f"{table}.parquet"
        good = path.read_bytes()
        df = pd.read_parquet(path)
        df.iloc[:1].assign(tampered=1).to_parquet(path, index=False)  # readable Parquet, another checksum
        for line in every_reader_refuses(art, params, table):
            assert len(line.splitlines()) == 1 and str(path) in line, line
            assert "does not match" in line or "the manifest says" in line, line
            assert "rollscale run fit" in line or "`rollscale study` runs fit again" in line, line
        # `status` names the damage too, beside the interruption or failure
        shown = with_damage(StageStatus("fit", state[how], "as the stage left it"), art)
        assert shown.state == {"finished": "damaged"}.get(how, how) and f"{table}.parquet" in shown.detail, shown
        path.write_bytes(good)
        assert len(query(f"select * from {table}", art)) == len(df)
