"""Study tables: atomic files under ``artifacts/`` and read-only DuckDB queries over them.

Every stage writes its files through :mod:`rollscale.files` (temporary file
in the same folder, then rename), so a reader or a crash never sees half a
file. Queries (:func:`query`, ``rollscale sql``) run in an in-memory DuckDB
whose tables are Arrow datasets over the study's Parquet files, with DuckDB's
own ``enable_external_access = false`` and ``lock_configuration = true``: a
query cannot read, write or attach any file (COPY … TO, EXPORT DATABASE,
ATTACH, INSTALL/LOAD are refused by DuckDB), it cannot spill to disk (DuckDB
would allow writes to its temp folder), and what it creates lives only in
its throw-away connection; it runs for at most a time limit, and Ctrl-C stops
it (:mod:`rollscale.pipeline.query.sql`). Sweep rows are read only from the part
files the newest checkpoint of each run commits, after checking their checksums
(:func:`rollscale.train.manifest.committed_parts`), so rows written past the
last commit are invisible and a tampered part is an error, never a silent row;
every other table file is checked against its stage's record of checksums
(:mod:`rollscale.pipeline.stages.outputs`). A damaged table is left out, and a query
of it names the file: the other tables stay queryable.
:func:`write_duckdb` writes a database file of views for other SQL clients.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any, Callable, TypeVar

import duckdb
import pandas as pd

from rollscale.files import write_atomic
from rollscale.pipeline.query.sql import (  # noqa: F401 (re-exported)
    Consumer, OutputWriteError, QueryError, QueryTimeout, all_rows, checked_sql, run_bounded)
from rollscale.tables import RUN_PART_TABLES, TABLES, TRACKED_TABLES, table_stage
from rollscale.train.manifest import committed_parts

DB_NAME = "rollscale.duckdb"
# a run resuming from an earlier checkpoint deletes its later parts (RunStore.rollback_to): a reader that listed
# them just before sees them vanish, and lists the table again (CI: "Cannot open file steps-000010")
RELIST_TRIES = 5

T = TypeVar("T")


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


def _rerun(name: str) -> str:
    if name in TRACKED_TABLES:
        return f"run `{TRACKED_TABLES[name]}` again"
    stage = table_stage(name)
    return f"run the '{stage}' stage again (`rollscale run {stage}`, or `rollscale study`)"


def _dataset(name: str, files: list[Path]):
    """One Arrow dataset over ``files``, columns united by name (parts may differ in columns);
    :class:`DamagedResultError` naming the first file that is not readable Parquet."""
    import pyarrow as pa
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    schemas = []
    for f in files:
        try:
            schemas.append(pq.read_schema(f))
        except Exception as err:  # noqa: BLE001 - Arrow raises many types for a damaged footer
            raise DamagedResultError(f"{f} is not readable Parquet ({type(err).__name__}: "
                                     f"{(str(err).splitlines() or [''])[0][:120]}); {_rerun(name)}") from None
    schema = pa.unify_schemas(schemas, promote_options="permissive")
    return ds.dataset([str(f) for f in files], schema=schema, format="parquet")


def checked_table_files(artifacts: str | Path, name: str) -> list[Path]:
    """:func:`table_files`, each checked against its stage's record of checksums by the one rule every reader
    follows (:func:`rollscale.pipeline.stages.outputs.table_problem`: only as the stage's last finished run
    wrote it); :class:`DamagedResultError` names the first bad file and the command that repairs it."""
    from rollscale.pipeline.stages.outputs import table_problem

    files = table_files(artifacts, name)
    if name not in RUN_PART_TABLES and (problem := table_problem(artifacts, table_stage(name), files)):
        raise DamagedResultError(f"{problem}; {_rerun(name)}")
    return files


def with_table_files(artifacts: str | Path, name: str, use: Callable[[list[Path]], T]) -> T:
    """``use`` of table ``name``'s checked files (:func:`checked_table_files`), listed again where one of them was
    deleted before ``use`` opened it (a run rolled back as it resumed); any other error is ``use``'s own."""
    for attempt in range(RELIST_TRIES):
        files = checked_table_files(artifacts, name)
        try:
            return use(files)
        except (duckdb.IOException, DamagedResultError, OSError):
            if attempt == RELIST_TRIES - 1 or all(f.exists() for f in files):
                raise
            time.sleep(0.05 * (attempt + 1))
    raise AssertionError("unreachable")


def _open(artifacts: str | Path) -> tuple[duckdb.DuckDBPyConnection, list[str], dict[str, str]]:
    """The query connection, the tables it has, and the damaged ones (name -> why), left out:
    one damaged table never makes the others unqueryable."""
    con = duckdb.connect(":memory:")
    names, damaged = [], {}
    try:
        for name in available_tables(artifacts):
            try:
                dataset = with_table_files(artifacts, name, lambda files: _dataset(name, files) if files else None)
                if dataset is not None:
                    con.register(name, dataset)
                    names.append(name)
            except DamagedResultError as err:
                damaged[name] = str(err)
        # no spilling to disk: DuckDB allows writes to its temp folder even with file access off
        con.execute("SET temp_directory = ''")
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
    except BaseException:
        con.close()
        raise
    return con, names, damaged


def connect(artifacts: str | Path) -> duckdb.DuckDBPyConnection:
    """A read-only, in-memory DuckDB connection with one table per study table that has rows
    (damaged tables left out).

    The tables are Arrow datasets registered before file access is switched
    off and the configuration locked: DuckDB itself can then open no file."""
    return _open(artifacts)[0]


def _missing_table(err: duckdb.CatalogException) -> str | None:
    match = re.search(r"Table with name (\w+) does not exist", str(err))
    return match.group(1) if match else None


def query(sql: str, artifacts: str | Path, timeout_s: float | None = None, read: Consumer = all_rows) -> Any:
    """Run SQL over the study's tables, read-only, for at most ``timeout_s`` seconds (None: no limit,
    as the stages read their tables; ``rollscale sql`` sets ``query.timeout_s``); Ctrl-C stops it at
    once. ``read``: what of the result is read, within the same limit (default every row, as a DataFrame;
    :func:`rollscale.pipeline.query.sql.first_rows`, :func:`~rollscale.pipeline.query.sql.rows_to_parquet`).
    A missing table gets a message naming the stage, a damaged one naming its file."""
    sql = checked_sql(sql)
    con, have, damaged = _open(artifacts)
    try:
        return run_bounded(con, sql, timeout_s, read)
    except duckdb.CatalogException as err:
        name = _missing_table(err)
        if name in damaged:
            raise DamagedResultError(damaged[name]) from None
        if name in TABLES and name not in have:
            how = f"`{TRACKED_TABLES[name]}`" if name in TRACKED_TABLES else \
                f"the '{table_stage(name)}' stage first (dvc repro {table_stage(name)})"
            raise LookupError(f"table {name!r} does not exist yet: run {how}") from None
        raise QueryError(f"{str(err).splitlines()[0]} (tables: {', '.join(have) or 'none yet'})") from None
    except (duckdb.PermissionException, duckdb.InvalidInputException) as err:
        # an unrecorded file that fails only when scanned also raises InvalidInput ("reading the stream")
        if isinstance(err, duckdb.InvalidInputException) and (bad := _unreadable(artifacts, have)):
            raise DamagedResultError(bad) from None
        raise QueryError(f"refused: queries are read-only and see only the study's tables "
                         f"({str(err).splitlines()[0]})") from None
    except (duckdb.OutOfMemoryException, MemoryError) as err:
        raise QueryError(f"the query needs more memory than a query may take ({str(err).splitlines()[0][:120]}): "
                         "select fewer or shorter values, or raise query.memory_gb in params.yaml") from None
    except duckdb.Error as err:
        raise QueryError(str(err).splitlines()[0]) from None
    except (QueryError, KeyboardInterrupt, OutputWriteError):
        raise
    except Exception as err:  # an unrecorded file that fails only when scanned (Arrow raises its own errors)
        raise DamagedResultError(_unreadable(artifacts, have) or
                                 f"reading the tables failed ({type(err).__name__}: {str(err)[:120]}): a table "
                                 "file may be damaged (`rollscale status` checks them)") from None
    finally:
        con.close()


def read_table(artifacts: str | Path, name: str) -> pd.DataFrame:
    """Every row of study table ``name``, read as ``rollscale sql`` reads it (checked against its stage's record:
    :func:`checked_table_files`); a missing table or a damaged one raises the one line that says so."""
    return query(f"SELECT * FROM {name}", artifacts)


def _unreadable(artifacts: str | Path, names: list[str]) -> str | None:
    """The first table file that cannot be read whole, named, or None."""
    import pyarrow.parquet as pq

    for name in names:
        for f in table_files(artifacts, name):
            try:
                pq.read_table(f).to_pandas()
            except Exception as err:  # noqa: BLE001 - any failure to read names the file
                return f"{f} is damaged ({type(err).__name__}: {str(err).splitlines()[0][:120]}); {_rerun(name)}"
    return None


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
            def view(name: str, files: list[Path]) -> None:
                if files:
                    listed = ", ".join("'{}'".format(str(f).replace("'", "''")) for f in files)
                    con.execute(f"CREATE OR REPLACE VIEW {name} AS "
                                f"SELECT * FROM read_parquet([{listed}], union_by_name = true)")

            for name in available_tables(artifacts):
                try:
                    with_table_files(artifacts, name, lambda files: view(name, files))  # noqa: B023 - called now
                except DamagedResultError:
                    continue  # left out, as in queries: `rollscale sql` and `status` name the file
            con.execute("CHECKPOINT")
        finally:
            con.close()
            Path(f"{tmp}.wal").unlink(missing_ok=True)

    return write_atomic(db_path, build)
