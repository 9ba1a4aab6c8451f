"""Study tables: atomic files under ``artifacts/`` and read-only DuckDB queries over them.

Every stage writes its files through :mod:`rollscale.files` (temporary file
in the same folder, then rename), so a reader or a crash never sees half a
file. Queries (:func:`query`, ``rollscale sql``) run in an in-memory DuckDB
whose tables are Arrow datasets over the study's Parquet files, with DuckDB's
own ``enable_external_access = false`` and ``lock_configuration = true``: a
query cannot read, write or attach any file (COPY … TO, EXPORT DATABASE,
ATTACH, INSTALL/LOAD are refused by DuckDB), and what it creates lives only in
its throw-away connection. Sweep rows are read only from the part files the
newest checkpoint of each run commits, after checking their checksums
(:func:`rollscale.train.manifest.committed_parts`), so rows written past the
last commit are invisible and a tampered part is an error, never a silent row.
:func:`write_duckdb` writes a database file of views for other SQL clients.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pandas as pd

from rollscale.files import write_atomic
from rollscale.tables import RUN_PART_TABLES, TABLES, table_stage
from rollscale.train.manifest import committed_parts

DB_NAME = "rollscale.duckdb"


class QueryError(ValueError):
    """A query that the read-only query engine refuses or cannot run."""


class DamagedResultError(RuntimeError):
    """A stored result does not match its checksum (tampered with, or truncated)."""


# ---------------------------------------------------------------------------- tables


def table_files(artifacts: str | Path, name: str) -> list[Path]:
    """The files of table ``name`` now: for sweep rows, only the verified committed parts.

    Raises :class:`DamagedResultError` naming the file when a committed part
    does not match its checksum."""
    root = Path(artifacts).resolve()
    pattern = TABLES[name]
    if name not in RUN_PART_TABLES:
        return sorted(root.glob(pattern))
    kind = name
    files = []
    for run_dir in sorted(p for p in (root / "sweep" / "runs").glob("*") if p.is_dir()):
        parts, problem = committed_parts(run_dir)
        if problem:
            raise DamagedResultError(f"{problem}; run `rollscale run sweep` to retrain the run from its last "
                                     "good checkpoint")
        files += [run_dir / p for p in sorted(parts) if p.startswith(f"{kind}-")]
    return files


def available_tables(artifacts: str | Path) -> dict[str, str]:
    """Tables whose Parquet files exist now: name -> absolute glob."""
    root = Path(artifacts).resolve()
    return {name: str(root / pattern) for name, pattern in TABLES.items() if any(root.glob(pattern))}


def _dataset(files: list[Path]):
    """One Arrow dataset over ``files``, columns united by name (parts may differ in columns)."""
    import pyarrow as pa
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    schema = pa.unify_schemas([pq.read_schema(f) for f in files], promote_options="permissive")
    return ds.dataset([str(f) for f in files], schema=schema, format="parquet")


def _open(artifacts: str | Path) -> tuple[duckdb.DuckDBPyConnection, list[str]]:
    con = duckdb.connect(":memory:")
    names = []
    try:
        for name in available_tables(artifacts):
            files = table_files(artifacts, name)
            if files:
                con.register(name, _dataset(files))
                names.append(name)
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
    except BaseException:
        con.close()
        raise
    return con, names


def connect(artifacts: str | Path) -> duckdb.DuckDBPyConnection:
    """A read-only, in-memory DuckDB connection with one table per study table that has rows.

    The tables are Arrow datasets registered before file access is switched
    off and the configuration locked: DuckDB itself can then open no file."""
    return _open(artifacts)[0]


def query(sql: str, artifacts: str | Path) -> pd.DataFrame:
    """Run SQL over the study's tables, read-only; a missing table gets a message naming the stage."""
    con, have = _open(artifacts)
    try:
        return con.execute(sql).df()
    except duckdb.CatalogException as err:
        missing = [t for t in TABLES if t in str(err) and t not in have]
        if missing:
            stage = table_stage(missing[0])
            raise LookupError(
                f"table {missing[0]!r} does not exist yet: run the '{stage}' stage first "
                f"(dvc repro {stage})"
            ) from None
        raise QueryError(f"{str(err).splitlines()[0]} (tables: {', '.join(have) or 'none yet'})") from None
    except (duckdb.PermissionException, duckdb.InvalidInputException) as err:
        raise QueryError(f"refused: queries are read-only and see only the study's tables "
                         f"({str(err).splitlines()[0]})") from None
    except duckdb.Error as err:
        raise QueryError(str(err).splitlines()[0]) from None
    finally:
        con.close()


def write_duckdb(artifacts: str | Path, db_path: str | Path | None = None) -> Path:
    """(Re)write the DuckDB file of views, atomically, for external SQL clients.

    The views name the table files by absolute path (for sweep rows, the
    committed parts at this moment), so the file works from any working
    directory on this machine.
    """
    artifacts = Path(artifacts)
    db_path = Path(db_path) if db_path else artifacts / DB_NAME

    def build(tmp: Path) -> None:
        tmp.unlink()  # duckdb wants to create the file itself
        con = duckdb.connect(str(tmp))
        try:
            for name in available_tables(artifacts):
                files = [str(f).replace("'", "''") for f in table_files(artifacts, name)]
                if files:
                    listed = ", ".join(f"'{f}'" for f in files)
                    con.execute(f"CREATE OR REPLACE VIEW {name} AS "
                                f"SELECT * FROM read_parquet([{listed}], union_by_name = true)")
            con.execute("CHECKPOINT")
        finally:
            con.close()
            Path(f"{tmp}.wal").unlink(missing_ok=True)

    return write_atomic(db_path, build)
