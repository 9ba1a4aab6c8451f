"""One user query, bounded: its text is checked before DuckDB sees it, and it runs for at most a
time limit, or until Ctrl-C.

DuckDB checks for Ctrl-C itself only between the chunks it computes in the
main thread, and not at all while it scans the Arrow datasets the study's
tables are (measured: a 4-way self-join ran on after SIGINT). So the query
runs in a helper thread and the main thread waits: the time limit or a
KeyboardInterrupt there calls ``connection.interrupt()``, DuckDB's own way
to stop a running query, at once.
"""

from __future__ import annotations

import threading

import duckdb
import pandas as pd

__all__ = ["QueryError", "QueryTimeout", "checked_sql", "run_bounded"]


class QueryError(ValueError):
    """A query that the read-only query engine refuses or cannot run."""


class QueryTimeout(QueryError):
    """A query stopped at its time limit."""


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


def run_bounded(con: duckdb.DuckDBPyConnection, sql: str, timeout_s: float | None) -> pd.DataFrame:
    """The result of ``sql`` on ``con`` as a DataFrame (empty for a statement without rows).

    Stopped after ``timeout_s`` seconds (:class:`QueryTimeout`; None = no limit) or at a
    KeyboardInterrupt in the calling (main) thread, which is raised again once DuckDB has stopped."""
    if timeout_s is not None and not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
    out: dict = {}
    done = threading.Event()

    def work() -> None:
        try:
            result = con.execute(sql)
            out["df"] = result.df() if result is not None and result.description is not None else pd.DataFrame()
        except BaseException as err:  # noqa: BLE001 - handed to the waiting thread
            out["error"] = err
        finally:
            done.set()

    threading.Thread(target=work, name="rollscale-query", daemon=True).start()
    try:
        finished = done.wait(timeout_s)
    except BaseException:
        _stop(con, done)
        raise
    if not finished:
        _stop(con, done)
        raise QueryTimeout(f"the query was stopped at its time limit of {timeout_s:g} s "
                           "(`rollscale sql --timeout SECONDS`, or query.timeout_s in params.yaml)")
    if "error" in out:
        raise out["error"]
    return out["df"]


def _stop(con: duckdb.DuckDBPyConnection, done: threading.Event) -> None:
    """Interrupt until the query thread has ended (a script of several statements may start the
    next one after the first interrupt); the connection is then free to close."""
    while not done.is_set():
        con.interrupt()
        try:
            done.wait(0.05)
        except KeyboardInterrupt:  # a second Ctrl-C: DuckDB is already being stopped
            pass
