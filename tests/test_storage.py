"""Atomic Parquet writes and DuckDB views that never lock readers out."""

import os
import subprocess
import sys

import duckdb
import pandas as pd
import pytest

from rollscale.pipeline.storage import query, write_duckdb, write_parquet_atomic


def test_query_views_and_missing_table(tmp_path):
    write_parquet_atomic(pd.DataFrame({"problem_id": ["a", "b"], "bucket": ["easy", "hard"], "split": ["train", "val"]}),
                         tmp_path / "bucket" / "buckets.parquet")
    df = query("select bucket, count(*) as n from buckets group by 1 order by 1", tmp_path)
    assert df.to_dict("list") == {"bucket": ["easy", "hard"], "n": [1, 1]}
    with pytest.raises(LookupError, match=r"table 'profile' does not exist yet: run the 'profile' stage"):
        query("select * from profile", tmp_path)


def test_steps_view_unions_run_parts(tmp_path):
    for run in ("r1", "r2"):
        for part in (5, 10):
            write_parquet_atomic(pd.DataFrame({"run_id": [run], "step": [part]}), tmp_path / f"sweep/runs/{run}/steps-{part:06d}.parquet")
    assert query("select count(*) as n from steps", tmp_path)["n"][0] == 4


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
