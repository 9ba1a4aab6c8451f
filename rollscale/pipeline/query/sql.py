"""One user query, bounded: its text is checked before DuckDB sees it, it runs for at most a
time limit, or until Ctrl-C, and its rows are read within that limit too: all of them
(:func:`all_rows`), the first ``limit`` and a count of the rest (:func:`first_rows`: what
``rollscale sql`` prints), or every row into a Parquet file in chunks (:func:`rows_to_parquet`).

DuckDB checks for Ctrl-C itself only between the chunks it computes in the
main thread, and not at all while it scans the Arrow datasets the study's
tables are (measured: a 4-way self-join ran on after SIGINT). So the query
runs in a helper thread and the main thread waits: the time limit or a
KeyboardInterrupt there calls ``connection.interrupt()``, DuckDB's own way
to stop a running query, at once.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import pandas as pd

__all__ = ["OutputWriteError", "QueryError", "QueryTimeout", "Rows", "all_rows", "checked_sql", "first_rows",
           "memory_bounded", "rows_to_parquet", "run_bounded"]

VECTOR = 2048  # rows in one DuckDB vector: fetch_df_chunk(k) returns k of them
CHUNK_VECTORS = 64  # vectors read at once past the first rows (131,072 rows: bounded memory, few calls)
# reads a query's result on its connection; the event is set when the time limit or Ctrl-C stops it
Consumer = Callable[[duckdb.DuckDBPyConnection, threading.Event], Any]


class QueryError(ValueError):
    """A query that the read-only query engine refuses or cannot run."""


class QueryTimeout(QueryError):
    """A query stopped at its time limit."""


class OutputWriteError(OSError):
    """The file a query's rows go to cannot be written (a full disk, a folder not writable): the machine's."""


def checked_sql(sql: str) -> str:
    """``sql`` when it is UTF-8 text with at least one statement; else :class:`QueryError` saying why
    (DuckDB answers bad bytes with ``std::bad_cast`` and an empty query with no result at all)."""
    if not isinstance(sql, str):
        raise QueryError(f"expected the query as text, got {type(sql).__name__}")
    try:
        sql.encode("utf-8")
    except UnicodeEncodeError as err:  # the shell's bytes that are not UTF-8 arrive as surrogates
        bad = sql[err.start].encode("utf-8", "surrogateescape")
        raise QueryError(f"the query is not UTF-8 text (byte 0x{bad.hex()} at character {err.start + 1})") from None
    try:
        statements = duckdb.extract_statements(sql)  # parses only: no table is read
    except duckdb.Error as err:
        raise QueryError(str(err).splitlines()[0]) from None
    if not statements:
        raise QueryError("the query is empty: give a SQL statement, e.g. \"select * from runs\"")
    return sql


@dataclass(frozen=True)
class Rows:
    """The first rows of a result and how many it has: ``total`` None when counting them was stopped at
    the time limit (``counted`` rows, at least, then)."""

    head: pd.DataFrame
    total: int | None
    counted: int


def _chunks(con: duckdb.DuckDBPyConnection, stop: threading.Event, vectors: int) -> Iterator[pd.DataFrame]:
    """The rest of the result, ``vectors`` DuckDB vectors at a time, until it ends or ``stop`` is set."""
    while not stop.is_set():
        chunk = con.fetch_df_chunk(vectors)
        if not len(chunk):
            return
        yield chunk


def _has_rows(con: duckdb.DuckDBPyConnection) -> bool:
    return con.description is not None


def all_rows(con: duckdb.DuckDBPyConnection, stop: threading.Event) -> pd.DataFrame:
    """Every row of the result (empty for a statement without rows)."""
    return con.df() if _has_rows(con) else pd.DataFrame()


def first_rows(limit: int) -> Consumer:
    """A consumer of the first ``limit`` rows and a count of the rest (read in chunks, never kept): a
    result of millions of rows costs the memory of ``limit`` and one chunk."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise QueryError(f"--limit: expected a number of rows >= 1, got {limit!r}")

    def consume(con: duckdb.DuckDBPyConnection, stop: threading.Event) -> Rows:
        if not _has_rows(con):
            return Rows(pd.DataFrame(), 0, 0)
        head = con.fetch_df_chunk(math.ceil((limit + 1) / VECTOR))
        counted = len(head)
        try:
            if counted > limit:
                for chunk in _chunks(con, stop, CHUNK_VECTORS):
                    counted += len(chunk)
        except duckdb.Error:
            if not stop.is_set():
                raise  # not the time limit's interrupt: the query's own error
        return Rows(head.iloc[:limit].reset_index(drop=True), None if stop.is_set() else counted, counted)

    return consume


def rows_to_parquet(path: str | Path) -> Consumer:
    """A consumer writing every row into the Parquet file ``path``, chunk by chunk (atomically: an
    interrupted write leaves no file); returns the rows written."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rollscale.files import write_atomic

    path = Path(path)
    if path.suffix.lower() != ".parquet":
        raise QueryError(f"--output: expected a .parquet file, got {path}")

    def consume(con: duckdb.DuckDBPyConnection, stop: threading.Event) -> int:
        written = 0

        def write(tmp: Path) -> None:
            nonlocal written
            first = con.fetch_df_chunk(CHUNK_VECTORS) if _has_rows(con) else pd.DataFrame()
            with pq.ParquetWriter(tmp, pa.Table.from_pandas(first, preserve_index=False).schema) as out:
                for chunk in (first, *_chunks(con, stop, CHUNK_VECTORS)) if len(first) else (first,):
                    out.write_table(pa.Table.from_pandas(chunk, preserve_index=False))
                    written += len(chunk)
            if stop.is_set():
                raise QueryTimeout("stopped while writing")  # the time limit's own message is raised instead

        try:
            write_atomic(path, write)
        except OSError as err:  # the table files were read: the trouble is where the rows go
            raise OutputWriteError(err.errno, err.strerror or str(err), str(path)) from err
        return written

    return consume


@contextlib.contextmanager
def memory_bounded(gb: float | None) -> Iterator[None]:
    """Run the block with this process's address space limited to what it has now plus ``gb`` (None: no limit):
    past it DuckDB's allocations fail with its OutOfMemoryException and Python's with MemoryError, instead of the
    machine swapping. The limit is the kernel's (``RLIMIT_DATA``: the data it writes), put back afterwards; where it cannot be set, none."""
    import resource

    if gb is None:
        yield
        return
    try:
        status = Path("/proc/self/status").read_text()
        now = int(status.split("VmData:")[1].split()[0]) * 1024
        before = resource.getrlimit(resource.RLIMIT_DATA)
        cap = now + int(gb * 2**30)
        resource.setrlimit(resource.RLIMIT_DATA, (cap if before[1] == resource.RLIM_INFINITY else min(cap, before[1]),
                                                before[1]))
    except (OSError, ValueError, IndexError):
        yield
        return
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_DATA, before)


def run_bounded(con: duckdb.DuckDBPyConnection, sql: str, timeout_s: float | None,
                consume: Consumer = all_rows) -> Any:
    """What ``consume`` reads of the result of ``sql`` on ``con`` (default: every row as a DataFrame).

    The query and the reading of its rows are stopped together after ``timeout_s`` seconds
    (:class:`QueryTimeout`; None = no limit) or at a KeyboardInterrupt in the calling (main) thread,
    which is raised again once DuckDB has stopped. A :func:`first_rows` reader stopped while it counts
    the rows past its head returns the head (``total`` None) instead."""
    if timeout_s is not None and not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
    out: dict = {}
    done, stop = threading.Event(), threading.Event()

    def work() -> None:
        try:
            con.execute(sql)
            out["value"] = consume(con, stop)
        except BaseException as err:  # noqa: BLE001 - handed to the waiting thread
            out["error"] = err
        finally:
            done.set()

    threading.Thread(target=work, name="rollscale-query", daemon=True).start()
    try:
        finished = done.wait(timeout_s)
    except BaseException:
        _stop(con, done, stop)
        raise
    if not finished:
        _stop(con, done, stop)
        if isinstance(out.get("value"), Rows):  # the head was read; only the count was cut short
            return out["value"]
        raise QueryTimeout(f"the query was stopped at its time limit of {timeout_s:g} s "
                           "(`rollscale sql --timeout SECONDS`, or query.timeout_s in params.yaml)")
    if "error" in out:
        raise out["error"]
    return out["value"]


def _stop(con: duckdb.DuckDBPyConnection, done: threading.Event, stop: threading.Event) -> None:
    """Interrupt until the query thread has ended (a script of several statements may start the
    next one after the first interrupt; a reader stops at its next chunk); the connection is then free
    to close."""
    stop.set()
    while not done.is_set():
        con.interrupt()
        try:
            done.wait(0.05)
        except KeyboardInterrupt:  # a second Ctrl-C: DuckDB is already being stopped
            pass
