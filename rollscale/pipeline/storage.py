"""Study tables: atomic Parquet files under ``artifacts/`` and DuckDB views over them.

Every stage writes Parquet (temporary file, then rename, so a reader or a
crash never sees half a file). Queries never open a database for writing:
:func:`query` builds views in an in-memory DuckDB, and :func:`write_duckdb`
writes a database file of views for other SQL clients into a temporary file
that replaces the old one atomically. So nothing holds a write lock on the
file users query, even while a sweep is writing.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import duckdb
import pandas as pd

# table name -> Parquet glob relative to the artifacts folder (the contract users query)
TABLES: dict[str, str] = {
    "profile": "profile/profile.parquet",
    "buckets": "bucket/buckets.parquet",
    "bucket_counts": "bucket/bucket_counts.parquet",
    "noise_prompts": "measure/noise_prompts.parquet",
    "noise_steps": "measure/noise_steps.parquet",
    "runs": "sweep/runs/*/run.parquet",
    "steps": "sweep/runs/*/steps-*.parquet",
    "evals": "sweep/runs/*/evals-*.parquet",
    "fits": "fit/fits.parquet",
    "frontier": "fit/frontier.parquet",
    "steps_to_target": "fit/steps_to_target.parquet",
    "crs_prediction": "fit/crs_prediction.parquet",
    "epoch_transitions": "fit/epoch_transitions.parquet",
    "record_points": "fit/record_points.parquet",
}

DB_NAME = "rollscale.duckdb"


def write_parquet_atomic(df: pd.DataFrame, path: str | Path) -> Path:
    """Write ``df`` to ``path`` via a temporary file in the same folder and a rename."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
    except OSError as err:
        raise OSError(f"cannot write {path}: {err.strerror or err}") from err
    try:
        df.to_parquet(tmp, index=False)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; results are for every reader of the folder
        os.replace(tmp, path)
    except BaseException as err:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(err, OSError):
            raise OSError(f"cannot write {path}: {err.strerror or err}") from err
        raise
    return path


def write_text_atomic(text: str, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def available_tables(artifacts: str | Path) -> dict[str, str]:
    """Tables whose Parquet files exist now: name -> absolute glob."""
    root = Path(artifacts).resolve()
    found = {}
    for name, pattern in TABLES.items():
        if any(root.glob(pattern)):
            found[name] = str(root / pattern)
    return found


def _create_views(con: duckdb.DuckDBPyConnection, tables: dict[str, str]) -> None:
    for name, glob in tables.items():
        esc = glob.replace("'", "''")
        con.execute(f"CREATE OR REPLACE VIEW {name} AS SELECT * FROM read_parquet('{esc}', union_by_name = true)")


def connect(artifacts: str | Path) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with a view per available table."""
    con = duckdb.connect(":memory:")
    _create_views(con, available_tables(artifacts))
    return con


def query(sql: str, artifacts: str | Path) -> pd.DataFrame:
    """Run SQL over the study's tables; a missing table gets a message naming the stage."""
    con = connect(artifacts)
    try:
        return con.execute(sql).df()
    except duckdb.CatalogException as err:
        missing = [t for t in TABLES if t in str(err) and t not in available_tables(artifacts)]
        if missing:
            stage = TABLES[missing[0]].split("/")[0]
            raise LookupError(
                f"table {missing[0]!r} does not exist yet: run the '{stage}' stage first (dvc repro {stage})"
            ) from None
        raise
    finally:
        con.close()


def write_duckdb(artifacts: str | Path, db_path: str | Path | None = None) -> Path:
    """(Re)write the DuckDB file of views, atomically, for external SQL clients.

    The views use absolute paths to the Parquet files, so the file works from
    any working directory on this machine.
    """
    artifacts = Path(artifacts)
    db_path = Path(db_path) if db_path else artifacts / DB_NAME
    db_path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{db_path.name}.", suffix=".tmp", dir=db_path.parent)
    os.close(fd)
    os.unlink(tmp)  # duckdb wants to create the file itself
    try:
        con = duckdb.connect(tmp)
        try:
            _create_views(con, available_tables(artifacts))
            con.execute("CHECKPOINT")
        finally:
            con.close()
        os.replace(tmp, db_path)
    finally:
        Path(tmp).unlink(missing_ok=True)
        Path(tmp + ".wal").unlink(missing_ok=True)
    return db_path
