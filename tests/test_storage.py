"""Atomic Parquet writes, read-only queries that see committed rows only, and
DuckDB views that never lock readers out."""

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pandas as pd
import pytest
import torch

from rollscale.files import write_parquet_atomic
from rollscale.pipeline.query.storage import DamagedResultError, QueryError, query, write_duckdb
from rollscale.train.checkpoint import Checkpoint, RunStore


def save(store: RunStore, step: int, rows: list[dict]) -> None:
    store.save(step, {"w": torch.zeros(2)}, {}, {"c": step}, step_rows=rows)


def test_query_views_and_missing_table(tmp_path):
    write_parquet_atomic(pd.DataFrame({"problem_id": ["a", "b"], "bucket": ["easy", "hard"], "split": ["train", "val"]}),
                         tmp_path / "bucket" / "buckets.parquet")
    df = query("select bucket, count(*) as n from buckets group by 1 order by 1", tmp_path)
    assert df.to_dict("list") == {"bucket": ["easy", "hard"], "n": [1, 1]}
    with pytest.raises(LookupError, match=r"table 'profile' does not exist yet: run the 'profile' stage"):
        query("select * from profile", tmp_path)


def test_steps_view_unions_committed_run_parts_only(tmp_path):
    for run in ("r1", "r2"):
        store = RunStore(tmp_path / f"sweep/runs/{run}")
        for part in (5, 10):
            save(store, part, [{"run_id": run, "step": part}])
    # a part written past the last checkpoint (a crash or full disk before the commit)
    write_parquet_atomic(pd.DataFrame({"run_id": ["r1"], "step": [15]}), tmp_path / "sweep/runs/r1/steps-000015.parquet")
    assert query("select count(*) as n, max(step) as s from steps", tmp_path).to_dict("list") == {"n": [4], "s": [10]}


def test_parts_a_resuming_run_deletes_under_a_reader_are_listed_again(tmp_path, monkeypatch):
    """A run resuming from an earlier checkpoint deletes its later parts (rollback_to) while a query or the DuckDB
    file's refresh has just listed them: the reader lists the table again and reads the rows committed now (CI,
    2026-11-27: the sweep died with "internal error IOException: Cannot open file steps-000010.parquet")."""
    from rollscale.pipeline.query import storage

    store = RunStore(tmp_path / "sweep/runs/r1")
    for part in (5, 10):
        save(store, part, [{"run_id": "r1", "step": part}])
    listed = storage.checked_table_files
    rolled = []

    def listing_then_rollback(artifacts, name):
        files = listed(artifacts, name)
        if name == "steps" and not rolled:  # the resuming run's rollback, between the listing and the read
            store.rollback_to(Checkpoint(5, store.root / "ckpt-000005", {}))
            rolled.append(name)
        return files

    monkeypatch.setattr(storage, "checked_table_files", listing_then_rollback)
    assert query("select max(step) as s from steps", tmp_path)["s"].tolist() == [5] and rolled
    rolled.clear()
    save(store, 10, [{"run_id": "r1", "step": 10}])
    db = write_duckdb(tmp_path)
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("select max(step) from steps").fetchone() == (5,) and rolled


def test_tampered_or_truncated_part_is_an_error_naming_the_file(tmp_path):
    store = RunStore(tmp_path / "sweep/runs/r1")
    save(store, 5, [{"run_id": "r1", "step": 5}])
    save(store, 10, [{"run_id": "r1", "step": 10}])
    part = tmp_path / "sweep/runs/r1/steps-000005.parquet"
    write_parquet_atomic(pd.DataFrame({"run_id": ["r1"], "step": [99]}), part)  # same name, other rows
    with pytest.raises(DamagedResultError, match=r"steps-000005.parquet .*checksum.*rollscale run sweep"):
        query("select * from steps", tmp_path)
    part.write_bytes(part.read_bytes()[:20])
    with pytest.raises(DamagedResultError, match=r"steps-000005.parquet has 20 bytes"):
        query("select * from steps", tmp_path)


def _hashes(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


HOSTILE = [
    "copy (select * from steps where step <= 5) to '{run}/steps-000010.parquet' (format parquet)",
    "copy (select 1 as x) to '{outside}/leak.csv'",
    "export database '{art}/exported'",
    "attach '{art}/rollscale.duckdb' as db",
    "attach '{art}/rollscale.duckdb' as db (read_only)",
    "install httpfs",
    "load httpfs",
    "select * from read_csv('/etc/passwd')",
    "select * from read_parquet('{run}/steps-000005.parquet')",
    "select * from glob('{art}/*')",
    "set enable_external_access = true",
    "set lock_configuration = false",
    # DuckDB's spill folder (.tmp in the working directory) was writable with file access off
    "copy (select 1 as x) to '.tmp/evil.csv'",
    "copy (select 1 as x) to '{tmp}/evil.csv'",
    "set temp_directory = '{art}'",
]


@pytest.mark.parametrize("sql", HOSTILE)
def test_queries_cannot_write_attach_or_read_files(tmp_path, sql, monkeypatch):
    art, outside = tmp_path / "artifacts", tmp_path / "outside"
    outside.mkdir()
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".tmp").symlink_to(art)  # the spill folder, linked into the results
    store = RunStore(art / "sweep/runs/r1")
    save(store, 5, [{"run_id": "r1", "step": 5}])
    save(store, 10, [{"run_id": "r1", "step": 10}])
    write_duckdb(art)
    before = _hashes(tmp_path)
    with pytest.raises(QueryError, match="refused: queries are read-only"):
        query(sql.format(run=store.root, art=art, outside=outside, tmp=tmp_path / ".tmp"), art)
    assert _hashes(tmp_path) == before


def test_create_and_drop_touch_only_the_query_connection(tmp_path):
    write_parquet_atomic(pd.DataFrame({"x": [1, 2]}), tmp_path / "profile" / "profile.parquet")
    write_duckdb(tmp_path)
    before = _hashes(tmp_path)
    assert query("drop view profile; create table profile as select 42 as x; select * from profile", tmp_path)["x"].tolist() == [42]
    assert query("select sum(x) as s from profile", tmp_path)["s"].tolist() == [3]
    assert _hashes(tmp_path) == before
    with pytest.raises(QueryError, match="Parser Error"):
        query("selec 1", tmp_path)


def test_failed_write_leaves_old_file(tmp_path, monkeypatch):
    path = tmp_path / "t.parquet"
    write_parquet_atomic(pd.DataFrame({"x": [1]}), path)

    def boom(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pd.DataFrame, "to_parquet", boom)
    with pytest.raises(OSError, match=f"cannot write {path}: No space left on device"):
        write_parquet_atomic(pd.DataFrame({"x": [2]}), path)
    monkeypatch.undo()
    assert pd.read_parquet(path)["x"].tolist() == [1]
    assert [p.name for p in tmp_path.iterdir()] == ["t.parquet"]  # no temp files left


def test_duckdb_file_readable_while_rewritten(tmp_path):
    write_parquet_atomic(pd.DataFrame({"x": [1, 2]}), tmp_path / "profile" / "profile.parquet")
    db = write_duckdb(tmp_path)
    reader = duckdb.connect(str(db), read_only=True)
    # a stage rewrites the file while a reader holds it open: neither fails
    write_parquet_atomic(pd.DataFrame({"x": [1, 2, 3]}), tmp_path / "profile" / "profile.parquet")
    write_duckdb(tmp_path)
    assert reader.execute("select count(*) from profile").fetchone()[0] == 3
    reader.close()
    # and another process can open the new file at once
    out = subprocess.run([sys.executable, "-c", f"import duckdb; print(duckdb.connect({str(db)!r}, read_only=True).execute('select sum(x) from profile').fetchone()[0])"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "6"


def test_stage_record_covers_its_files_and_names_what_changed(tmp_path):
    from rollscale.pipeline.stages.outputs import outputs_problem, stage_output_files, write_outputs_manifest

    store = RunStore(tmp_path / "sweep/runs/r1")
    save(store, 5, [{"run_id": "r1", "step": 5}])
    write_parquet_atomic(pd.DataFrame({"run_id": ["r1"], "c": [5]}), store.root / "run.parquet")
    (store.root / "done.json").write_text("{}")
    (tmp_path / "sweep/.stage.lock").write_text("")
    (tmp_path / "sweep/archive/old").mkdir(parents=True)
    (tmp_path / "sweep/archive/old/run.parquet").write_text("moved out of the tables")
    # checkpoints and their row parts have manifests of their own; locks and archive/ are not outputs
    assert [str(p) for p in stage_output_files(tmp_path, "sweep")] == ["runs/r1/done.json", "runs/r1/run.parquet"]
    assert outputs_problem(tmp_path, "sweep") is None  # no record yet: not checked
    write_outputs_manifest(tmp_path, "sweep")
    assert outputs_problem(tmp_path, "sweep") is None
    (store.root / "done.json").write_text("{ }")
    assert "done.json has 3 bytes, the manifest says 2" in outputs_problem(tmp_path, "sweep")
    (store.root / "done.json").write_text("[]")
    assert "done.json does not match its sha256" in outputs_problem(tmp_path, "sweep")
    assert outputs_problem(tmp_path, "sweep", files=[store.root / "run.parquet"]) is None
    (store.root / "done.json").write_text("{}")
    (tmp_path / "sweep/runs/r2").mkdir()
    (tmp_path / "sweep/runs/r2/run.parquet").write_text("added later")
    assert "r2/run.parquet was not written by the stage's last finished run" in outputs_problem(tmp_path, "sweep")
    (tmp_path / "sweep/runs/r2/run.parquet").unlink()
    (store.root / "run.parquet").unlink()
    assert "run.parquet is missing" in outputs_problem(tmp_path, "sweep")


def test_damage_found_when_a_stage_starts_must_be_rebuilt_before_its_record_is_written(tmp_path):
    """Issue 31, part 2: a stage that starts after a finished run takes the files that no longer match the
    record; one the run leaves as it found it is named (its record is not rewritten over it), one it
    rewrote is not. After an unfinished run (its run record there) the files it changed are its own, and
    queries do not judge files written after the record while a run is unfinished."""
    from rollscale.pipeline.stages.outputs import outputs_problem, unrebuilt_damage, write_outputs_manifest
    from rollscale.pipeline.stages.specs import RUN_INFO

    folder = tmp_path / "fit"
    folder.mkdir()
    (folder / "fits.parquet").write_text("good")
    (folder / "frontier.parquet").write_text("good")
    write_outputs_manifest(tmp_path, "fit")
    (folder / "fits.parquet").write_text("edit")
    (folder / "frontier.parquet").write_text("edit")
    left = unrebuilt_damage(tmp_path, "fit")
    (folder / "frontier.parquet").write_text("rebuilt")  # the run rewrote one of them
    assert "fits.parquet does not match its sha256" in left() and "did not rebuild it" in left()
    (folder / "fits.parquet").write_text("new!")
    assert left() is None

    write_outputs_manifest(tmp_path, "fit")
    (folder / RUN_INFO).write_text("{}")  # a run that did not finish
    (folder / "fits.parquet").write_text("half")
    assert unrebuilt_damage(tmp_path, "fit")() is None
    os.utime(folder / "fits.parquet", (time.time() + 5, time.time() + 5))
    assert "fits.parquet" in outputs_problem(tmp_path, "fit")
    assert outputs_problem(tmp_path, "fit", unfinished_ok=True) is None


def test_an_ended_run_is_checked_as_fit_reads_it_from_any_working_folder(tmp_path, monkeypatch):
    """Issue 31, part 1: a finished run's committed parts, newest checkpoint and run.parquet / done.json
    (against the sweep's record) are one check, with the artifacts folder given relative (as the CLI does)."""
    from rollscale.pipeline.stages.outputs import run_damage, write_outputs_manifest

    monkeypatch.chdir(tmp_path)
    store = RunStore(Path("artifacts/sweep/runs/r1"))
    save(store, 5, [{"run_id": "r1", "step": 5}])
    write_parquet_atomic(pd.DataFrame({"run_id": ["r1"], "status": ["finished"]}), store.root / "run.parquet")
    store.mark_done("finished", steps=5)
    write_outputs_manifest("artifacts", "sweep")
    assert run_damage("artifacts", store.root) is None
    write_parquet_atomic(pd.DataFrame({"run_id": ["r1"], "status": ["failed"]}), store.root / "run.parquet")
    assert run_damage("artifacts", store.root).startswith("artifacts/sweep/runs/r1/run.parquet ")
    write_parquet_atomic(pd.DataFrame({"run_id": ["r1"], "status": ["finished"]}), store.root / "run.parquet")
    assert run_damage("artifacts", store.root) is None
    part = store.root / "steps-000005.parquet"
    part.write_bytes(part.read_bytes()[:-1] + b"!")
    assert "steps-000005.parquet does not match its sha256" in run_damage("artifacts", store.root)
    store.mark_done("failed", error="x")  # a failed run is resumed anyway: not judged
    assert run_damage("artifacts", store.root) is None


def test_query_time_limit_and_bad_text(tmp_path):
    from rollscale.pipeline.query.storage import QueryTimeout

    write_parquet_atomic(pd.DataFrame({"x": range(3000)}), tmp_path / "profile" / "profile.parquet")
    slow = "select count(*) from profile a, profile b, profile c where a.x + b.x + c.x = 7777"
    start = time.monotonic()
    with pytest.raises(QueryTimeout, match="time limit of 0.5 s"):
        query(slow, tmp_path, timeout_s=0.5)
    assert time.monotonic() - start < 10
    assert query("select count(*) as n from profile", tmp_path, timeout_s=30)["n"].tolist() == [3000]
    for bad, why in (("select '\udcff'", "not UTF-8 text"), ("  ", "the query is empty"), ("-- x", "empty")):
        with pytest.raises(QueryError, match=why):
            query(bad, tmp_path)
    assert query("create table t as select 1 as x", tmp_path).columns.tolist() == ["Count"]


def test_a_stage_file_named_from_a_relative_artifacts_folder_is_checked_as_recorded(tmp_path, monkeypatch):
    """`--artifacts artifacts` (the default, relative): the sweep named its own search table
    artifacts/sweep/search.parquet, which the check read as under the stage folder (artifacts/sweep/artifacts/...)
    and called unrecorded, so every sweep rebuilt its decisions and said the table was damaged."""
    from rollscale.pipeline.stages.outputs import outputs_problem, search_table_damage, write_outputs_manifest

    monkeypatch.chdir(tmp_path)
    table = Path("artifacts/sweep/search.parquet")
    table.parent.mkdir(parents=True)
    from rollscale.sweep.rungs import empty_decisions

    write_parquet_atomic(empty_decisions(), table)  # a search table's columns (a foreign table is damage)
    write_outputs_manifest("artifacts", "sweep")
    assert outputs_problem("artifacts", "sweep", [table]) is None
    assert outputs_problem("artifacts", "sweep", [Path("search.parquet")]) is None
    assert search_table_damage(Path("artifacts/sweep")) is None
    write_parquet_atomic(empty_decisions().assign(note=pd.Series(["changed"])), table)
    assert "artifacts/sweep/search.parquet has " in search_table_damage(Path("artifacts/sweep"))  # another size


def test_an_unfinished_stage_keeps_its_work_but_its_tables_are_read_only_as_recorded(tmp_path):
    """Issue 55, part 1: after a profile run that did not finish, its chunks (resumable work, written after the
    record) do not stop the next stage, but a profile table changed since its last finished run does, and
    without any finished run its table is no result."""
    from rollscale.pipeline.stages.outputs import input_damage, table_problem, write_outputs_manifest
    from rollscale.pipeline.stages.specs import RUN_INFO

    folder = tmp_path / "profile"
    write_parquet_atomic(pd.DataFrame({"x": [1, 2]}), folder / "profile.parquet")
    (folder / RUN_INFO).write_text("{}")  # a first run that did not finish
    assert "is no result: the profile stage's run did not finish" in input_damage(tmp_path, ["profile"])
    write_outputs_manifest(tmp_path, "profile")
    future = time.time() + 5
    write_parquet_atomic(pd.DataFrame({"x": [3]}), folder / "work" / "chunk-00000.parquet")
    os.utime(folder / "work" / "chunk-00000.parquet", (future, future))
    assert input_damage(tmp_path, ["profile"]) is None
    write_parquet_atomic(pd.DataFrame({"x": [9, 9, 9]}), folder / "profile.parquet")
    os.utime(folder / "profile.parquet", (future, future))
    assert "only a finished run's tables are read" in table_problem(tmp_path, "profile", [folder / "profile.parquet"])
    assert "its input profile cannot be read" in input_damage(tmp_path, ["profile"])
