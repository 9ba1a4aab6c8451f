"""End to end: base -> profile -> bucket on a small config, through the CLI as users run it."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

pytestmark = pytest.mark.slow

SMALL = {
    "workers": 1,  # in-process; tests/test_parallel.py checks that 2 workers give the same tables
    "data": {"size": 120, "config": {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 1}},
    "base": {"hidden_size": 32, "num_layers": 2, "num_heads": 2, "intermediate_size": 64, "max_positions": 32,
             "train_size": 1000, "steps": 40, "batch_size": 32, "lr": 3e-3, "threads": 1},  # as TINY (test_study)
    "sampling": {"max_new_tokens": 4},
    "profile": {"k": 4, "k_extreme": 8, "chunk_size": 10},
    "bucket": {"val_size": 2, "used": [], "mixtures": {}},
    "fit": {"bootstrap_resamples": 20},  # as TINY (test_study): the stages are tested here, not the intervals
}


def cli(*args, cwd: Path, check=True, **kw):
    cmd = [sys.executable, "-m", "rollscale.pipeline.cli", "--artifacts", str(cwd / "artifacts"), *args]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=check, **kw)


@pytest.fixture(scope="module")
def study(dvc_study):
    """The small study that `dvc repro` ran (tests/test_dvc.py), reused: one pipeline run per session."""
    return dvc_study[0]


def test_stages_write_tables(study):
    model = study / "artifacts" / "base" / "model"
    assert (model / "config.json").exists() and (model / "tokenizer.json").exists()
    profile = pd.read_parquet(study / "artifacts" / "profile" / "profile.parquet")
    assert len(profile) == profile["problem_id"].nunique() > 50
    assert profile["avg_at_k"].between(0, 1).all() and (profile["k"] == 4).all()
    assert (profile["n_correct"] / 4 == profile["avg_at_k"]).all()
    buckets = pd.read_parquet(study / "artifacts" / "bucket" / "buckets.parquet")
    assert set(buckets["problem_id"]) <= set(profile["problem_id"])
    hard = set(profile.loc[profile.avg_at_k <= 0.0625, "problem_id"])
    assert set(buckets.loc[buckets.bucket == "hard", "problem_id"]) == hard


def test_sql_prints_bucket_counts(study):
    r = cli("sql", "select bucket, count(*) as n from buckets group by 1 order by 1", cwd=study)
    assert "bucket" in r.stdout and "hard" in r.stdout
    r = cli("sql", "select * from no_such_table", cwd=study, check=False)
    assert r.returncode != 0 and "no_such_table" in r.stderr
    # a query that would overwrite a stored table is refused by DuckDB, in one line, and nothing changes
    target = study / "artifacts" / "bucket" / "buckets.parquet"
    before = target.read_bytes()
    r = cli("sql", f"copy (select 1 as x) to '{target}' (format parquet)", cwd=study, check=False)
    assert r.returncode == 2 and "refused: queries are read-only" in r.stderr and len(r.stderr.splitlines()) == 1
    assert target.read_bytes() == before


def test_bad_params_fail_before_work(tmp_path):
    (tmp_path / "params.yaml").write_text("profile: {k: 0}\nsampling: {temprature: 1}\n")
    r = cli("run", "profile", "--params", str(tmp_path / "params.yaml"), cwd=tmp_path, check=False)
    assert r.returncode == 2
    assert "profile.k" in r.stderr and "did you mean 'sampling.temperature'" in r.stderr
    assert not (tmp_path / "artifacts").exists()


def test_killed_profile_resumes_from_finished_chunks(study, tmp_path):
    """SIGKILL mid-profile; the second run keeps finished chunks and ends equal to a straight run."""
    root = tmp_path
    # a pool of 120 (130 problems drawn, duplicates dropped): 12 chunks of 10, the kill lands after 3
    params = dict(SMALL, data=dict(SMALL["data"], size=130), profile={"k": 4, "k_extreme": 0, "chunk_size": 10})
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    (root / "artifacts").mkdir()
    os.symlink(study / "artifacts" / "base", root / "artifacts" / "base")
    cmd = [sys.executable, "-m", "rollscale.pipeline.cli", "--artifacts", str(root / "artifacts"), "run", "profile", "--params", str(root / "params.yaml")]
    # its own session, so the kill takes the CLI's temporary Prefect server with it
    proc = subprocess.Popen(cmd, cwd=study, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    chunks = root / "artifacts" / "profile" / "chunks"
    deadline = time.time() + 240
    while time.time() < deadline and len(list(chunks.glob("*/chunk-*.parquet"))) < 3:
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    finished = {p: p.stat().st_mtime_ns for p in chunks.glob("*/chunk-*.parquet")}
    assert 3 <= len(finished) < 12, "the kill should land mid-profile"
    assert not (root / "artifacts" / "profile" / "profile.parquet").exists()
    r = subprocess.run(cmd, cwd=study, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"({len(finished)} already done)" in r.stdout
    for p, mtime in finished.items():
        assert p.stat().st_mtime_ns == mtime, f"{p.name} was recomputed"
    resumed = pd.read_parquet(root / "artifacts" / "profile" / "profile.parquet")
    assert len(resumed) == resumed["problem_id"].nunique() == len(list(chunks.glob("*/chunk-*.parquet"))) * 10
    # a straight run from scratch gives the same table (seeded per chunk)
    straight = root / "straight"
    (straight / "artifacts").mkdir(parents=True)
    os.symlink(study / "artifacts" / "base", straight / "artifacts" / "base")
    r = subprocess.run([*cmd[:3], "--artifacts", str(straight / "artifacts"), *cmd[5:]], cwd=study, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    pd.testing.assert_frame_equal(resumed, pd.read_parquet(straight / "artifacts" / "profile" / "profile.parquet"))
