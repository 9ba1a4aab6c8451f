"""`rollscale sql` as a hostile or careless user runs it (issue 23, parts 3 and 4): a time limit and
Ctrl-C stop a query at once, no query writes anywhere (not even DuckDB's spill folder), bad bytes
and empty queries get one line, and a damaged table file is named while the others stay queryable."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from rollscale.pipeline.stages.outputs import write_outputs_manifest
from rollscale.files import write_parquet_atomic
from rollscale.train.checkpoint import RunStore

REPO = Path(__file__).resolve().parents[1]
# a 3-way self-join of 3,000 rows: 2.7e10 combinations, minutes of work
SLOW = "select count(*) from profile a, profile b, profile c where a.x + b.x + c.x = 7777"


def sql_cmd(root: Path, *args: str | bytes) -> list:
    return [sys.executable, "-m", "rollscale.pipeline.cli", "--artifacts", str(root / "artifacts"), "sql", *args]


def sql(root: Path, *args: str | bytes, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(sql_cmd(root, *args), cwd=root, env=env, capture_output=True, text=True, timeout=timeout)


def one_line(r: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    return r.stderr.strip()


def hashes(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def study(tmp_path) -> Path:
    """Tables as finished stages leave them: files plus each stage's record of checksums."""
    art = tmp_path / "artifacts"
    write_parquet_atomic(pd.DataFrame({"x": np.arange(3000)}), art / "profile" / "profile.parquet")
    write_parquet_atomic(pd.DataFrame({"problem_id": ["a", "b"], "bucket": ["easy", "hard"], "split": ["train", "val"]}),
                         art / "bucket" / "buckets.parquet")
    write_parquet_atomic(pd.DataFrame({"bucket": ["easy", "hard"], "n": [1, 1]}), art / "bucket" / "bucket_counts.parquet")
    for run in ("r1", "r2"):
        store = RunStore(art / "sweep" / "runs" / run)
        for step in (5, 10):
            store.save(step, {"w": torch.zeros(2)}, {}, {"c": step}, step_rows=[{"run_id": run, "step": step}])
        write_parquet_atomic(pd.DataFrame({"run_id": [run], "status": ["finished"], "c": [100]}),
                             store.root / "run.parquet")
    for stage in ("profile", "bucket", "sweep"):
        write_outputs_manifest(art, stage)
    return tmp_path


def test_no_query_writes_through_duckdb_spill_folder(study):
    """Issue 23: DuckDB allowed writes to its temp folder `.tmp/`; with `.tmp` a link into artifacts/
    `COPY ... TO '.tmp/evil.csv'` wrote a file among the results."""
    os.symlink(study / "artifacts" / "bucket", study / ".tmp")
    before = hashes(study / "artifacts")
    for target in (".tmp/evil.csv", str(study / ".tmp" / "evil.csv")):
        r = sql(study, f"copy (select 1 as x) to '{target}'")
        assert r.returncode == 2 and "refused: queries are read-only" in one_line(r)
    assert hashes(study / "artifacts") == before


@pytest.mark.parametrize("text", [b"select \xff", b"", b"   \n\t", b"-- nothing", b";;"])
def test_bad_bytes_and_empty_queries_are_one_line_exit_2(study, text):
    """Issue 23: these ended as "internal error" (std::bad_cast, 'NoneType' ... 'df'), exit 3."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run(sql_cmd(study, text), cwd=study, env=env, capture_output=True, text=True, timeout=120)
    message = one_line(r)
    assert r.returncode == 2, r.stderr
    assert ("not UTF-8 text (byte 0xff" in message) if b"\xff" in text else ("the query is empty" in message)


def test_a_query_stops_at_its_time_limit(study):
    t0 = time.monotonic()
    r = sql(study, "--timeout", "2", SLOW)
    assert r.returncode == 2 and "stopped at its time limit of 2 s" in one_line(r)
    assert time.monotonic() - t0 < 30
    (study / "params.yaml").write_text("query: {timeout_s: 1.5}\n")
    r = sql(study, SLOW)
    assert r.returncode == 2 and "time limit of 1.5 s" in one_line(r) and "query.timeout_s" in r.stderr
    r = sql(study, "--timeout", "0", "select 1")
    assert r.returncode == 2 and "--timeout" in one_line(r)


def test_ctrl_c_stops_a_query_at_once(study):
    """Issue 23: a 4-way self-join ran on after SIGINT (DuckDB does not check for Ctrl-C while it
    scans the Arrow datasets); only SIGTERM stopped it."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    # Ctrl-C as a terminal sends it, whatever this test runs under (a shell's background job starts its
    # children with SIGINT ignored, and that disposition is inherited)
    proc = subprocess.Popen(sql_cmd(study, "--timeout", "600", SLOW), cwd=study, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(6)  # the command has started and the join is running (it runs for minutes)
    assert proc.poll() is None
    proc.send_signal(signal.SIGINT)
    t0 = time.monotonic()
    try:
        _, err = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail("the query ran on after Ctrl-C")
    assert time.monotonic() - t0 < 5 and proc.returncode == 130, err
    assert "Traceback" not in err and "terminate called" not in err


def test_a_damaged_table_is_named_and_the_others_stay_queryable(study):
    """Issue 23: a flipped byte in bucket/buckets.parquet gave "internal error SystemError" naming
    no file; one damaged sweep part made every table unqueryable; an edited `runs` value was served."""
    art = study / "artifacts"
    buckets = art / "bucket" / "buckets.parquet"
    data = bytearray(buckets.read_bytes())
    data[len(data) // 3] ^= 0xFF  # same size: only the checksum can tell
    buckets.write_bytes(bytes(data))
    r = sql(study, "select * from buckets")
    assert r.returncode == 1 and f"{buckets} does not match its sha256 checksum" in one_line(r)
    assert "rollscale run bucket" in r.stderr
    for table, rows in (("bucket_counts", 2), ("profile", 3000), ("runs", 2), ("steps", 4)):
        r = sql(study, f"select count(*) as n from {table}")
        assert r.returncode == 0 and r.stdout.split()[-1] == str(rows), (table, r.stderr)

    part = art / "sweep" / "runs" / "r2" / "steps-000005.parquet"
    write_parquet_atomic(pd.DataFrame({"run_id": ["r2"], "step": [99]}), part)
    r = sql(study, "select count(*) from steps")
    assert r.returncode == 1 and "steps-000005.parquet" in one_line(r)
    r = sql(study, "select count(*) as n from profile")
    assert r.returncode == 0 and r.stdout.split()[-1] == "3000"

    run_row = art / "sweep" / "runs" / "r1" / "run.parquet"
    write_parquet_atomic(pd.DataFrame({"run_id": ["r1"], "status": ["finished"], "c": [999]}), run_row)
    r = sql(study, "select sum(c) from runs")
    assert r.returncode == 1 and f"{run_row} does not match its sha256 checksum" in one_line(r)


def test_a_large_result_prints_its_first_rows_and_says_how_many_were_cut(study):
    """Issue 42, case 7: a 3,000,000-row result printed for 13 s using 1.5 GB, past `--timeout 5`."""
    pairs = "select a.x, b.x as y from profile a, profile b where b.x < 1000"  # 3,000,000 rows
    t0 = time.monotonic()
    r = sql(study, "--timeout", "5", pairs)
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 1 + 1000, r.stdout[-300:]
    assert one_line(r) == ("rollscale sql: the first 1,000 rows of 3,000,000; --limit N prints more, "
                           "--output FILE.parquet writes them all")
    r = sql(study, "--limit", "3", pairs)
    assert r.stdout.split() == ["x", "y", "0", "0", "1", "0", "2", "0"] and "first 3 rows of 3,000,000" in one_line(r)
    # the time limit covers reading the rows: a count of 2.7e10 rows stops there, the first rows still printed
    r = sql(study, "--timeout", "2", "select a.x, b.x as y, c.x as z from profile a, profile b, profile c")
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 1001
    assert "rows of more than" in one_line(r) and "counting stopped at the 2 s time limit" in r.stderr
    assert time.monotonic() - t0 < 90


def test_output_writes_every_row_to_parquet_within_the_time_limit(study):
    import pyarrow.parquet as pq

    out = study / "pairs.parquet"
    r = sql(study, "--output", str(out), "select a.x, b.x as y from profile a, profile b where b.x < 1000")
    assert r.returncode == 0 and r.stdout == "" and one_line(r) == f"rollscale sql: wrote 3,000,000 rows to {out}"
    assert pq.read_metadata(out).num_rows == 3_000_000
    big = study / "big.parquet"
    r = sql(study, "--timeout", "2", "--output", str(big), "select a.x, b.x, c.x from profile a, profile b, profile c")
    assert r.returncode == 2 and "time limit of 2 s" in one_line(r)
    assert not big.exists() and not list(study.glob(".big.parquet*"))  # nothing half-written left
    r = sql(study, "--output", str(study / "pairs.csv"), "select 1")
    assert r.returncode == 2 and "--output: expected a .parquet file" in one_line(r)


def test_output_never_writes_into_the_study_outputs(study):
    """Issue 55, part 2 (case 3: `sql --output artifacts/fit/decision.parquet "select 42"` replaced a study
    table): a path under the artifacts folder, given relative, absolute or through a symlink, is refused in
    one line, exit 2, and nothing of the study changes."""
    (study / "elsewhere").symlink_to(study / "artifacts" / "bucket")
    before = hashes(study / "artifacts")
    for target in ("artifacts/bucket/buckets.parquet", str(study / "artifacts" / "fit" / "decision.parquet"),
                   "artifacts/new.parquet", "elsewhere/buckets.parquet"):
        r = sql(study, "--output", target, "select 42 as answer")
        assert r.returncode == 2 and "inside the study's outputs" in one_line(r) and target in r.stderr, r.stderr
    assert hashes(study / "artifacts") == before
    r = sql(study, "--output", "answer.parquet", "select 42 as answer")
    assert r.returncode == 0 and pd.read_parquet(study / "answer.parquet")["answer"].tolist() == [42]


def test_a_result_too_large_for_memory_is_refused_in_one_line(study):
    """Issue 55, part 5 (case 6: `sql --timeout 2 "select repeat('x', 100000000) as s from range(40)"` ran 22.4 s
    and took 4.3 GB before its time-limit message): the result counts against query.memory_gb (here 0.5), so it
    stops at once, one line, exit 2; a query within it still answers."""
    (study / "params.yaml").write_text("query: {memory_gb: 0.5}\n")
    t0 = time.monotonic()
    r = sql(study, "--timeout", "50", "select repeat('x', 100000000) as s from range(40)")
    assert r.returncode == 2 and "needs more memory than a query may take" in one_line(r), r.stderr
    assert "query.memory_gb" in r.stderr and time.monotonic() - t0 < 60
    r = sql(study, "select count(*) as n from profile")
    assert r.returncode == 0 and "3000" in r.stdout, r.stderr
