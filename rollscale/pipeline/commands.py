"""The ``rollscale`` commands that read a study's tables and logs, called by :mod:`rollscale.pipeline.cli`:
``sql`` and ``tables`` (the tables as every reader reads them), ``export`` (the decision as a production run's
settings) and ``track`` (a production run's logs against the study's forecast)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

__all__ = ["CELL_CHARS", "SQL_LIMIT", "print_export", "print_query", "print_tables", "query_settings", "query_timeout",
           "refuse_study_output", "study_output_folders", "track"]


def query_settings(params: str):
    """params.yaml's ``query`` section when the file exists, else its defaults."""
    from rollscale.config import QueryParams, load_params

    return load_params(params).query if Path(params).exists() else QueryParams()


def query_timeout(timeout: float | None, params: str) -> float:
    """``--timeout``, else params.yaml's ``query.timeout_s`` when the file exists, else its default."""
    if timeout is not None:
        if not timeout > 0:
            raise ValueError(f"--timeout: expected seconds > 0, got {timeout:g}")
        return timeout
    return query_settings(params).timeout_s


SQL_LIMIT = 1000  # rows `rollscale sql` prints unless --limit says otherwise (--output writes them all)
CELL_CHARS = 200  # a printed cell longer than this is cut (a table of prompts would print megabytes)


def print_query(sql: str, artifacts: str, timeout: float | None = None, params: str = "params.yaml",
                limit: int = SQL_LIMIT, output: str | None = None) -> None:
    """The first ``limit`` rows on stdout and, past them, a note on stderr of how many were cut; with
    ``output`` every row goes to that Parquet file instead. The time limit covers reading the rows."""
    from rollscale.pipeline.query.sql import first_rows, memory_bounded, rows_to_parquet
    from rollscale.pipeline.query.storage import query

    seconds = query_timeout(timeout, params)
    memory = memory_bounded(query_settings(params).memory_gb)  # the result's size is bounded too
    if output is not None:
        refuse_study_output(output, artifacts)
        with memory:
            written = query(sql, artifacts, seconds, rows_to_parquet(output))
        print(f"rollscale sql: wrote {written:,} rows to {output}", file=sys.stderr)
        return
    with memory:
        rows = query(sql, artifacts, seconds, first_rows(limit))
    df = rows.head
    print(df.to_string(index=False, max_colwidth=CELL_CHARS) if len(df)
          else f"(no rows; columns: {', '.join(df.columns)})")
    if rows.total is None or rows.total > len(df):
        of = (f"{rows.total:,}" if rows.total is not None
              else f"more than {rows.counted:,} (counting stopped at the {seconds:g} s time limit)")
        print(f"rollscale sql: the first {len(df):,} rows of {of}; --limit N prints more, --output FILE.parquet "
              "writes them all", file=sys.stderr)


def study_output_folders(artifacts: str) -> list[Path]:
    """The folders a study writes, resolved: ``artifacts`` and, in a study folder, its artifacts/ and every
    ``outs`` path of its dvc.yaml."""
    import yaml

    from rollscale.pipeline.stages.specs import project_root

    folders = [Path(artifacts).resolve()]
    try:
        root = project_root()
    except FileNotFoundError:
        return folders
    folders.append((root / "artifacts").resolve())
    try:
        stages = (yaml.safe_load((root / "dvc.yaml").read_text(encoding="utf-8")) or {}).get("stages") or {}
    except (OSError, ValueError, yaml.YAMLError):  # the stages that read it say what is wrong with it
        stages = {}
    for spec in stages.values() if isinstance(stages, dict) else ():
        for out in (spec or {}).get("outs") or [] if isinstance(spec, dict) else []:
            name = next(iter(out), None) if isinstance(out, dict) else out
            if isinstance(name, str):
                folders.append((root / name).resolve())
    return folders


def refuse_study_output(output: str, artifacts: str) -> None:
    """``sql --output`` writes only outside the study's outputs: a query is read-only, and a file of its rows in
    artifacts/ would replace (or sit among) the tables the stages recorded."""
    from rollscale.pipeline.query.sql import QueryError

    target = Path(output).resolve()
    for folder in study_output_folders(artifacts):
        if target == folder or target.is_relative_to(folder):
            raise QueryError(f"--output {output}: inside the study's outputs ({folder}), which only its stages "
                             "write; give a file outside them, e.g. --output result.parquet")


def print_tables(artifacts: str) -> None:
    from rollscale.pipeline.query.storage import available_tables
    from rollscale.tables import TABLES

    have = available_tables(artifacts)
    for name, pattern in TABLES.items():
        print(f"{name:18s} {'ready  ' if name in have else 'missing'}  {Path(artifacts) / pattern}")


def track(rest: list[str], artifacts: str, debug: bool) -> int:
    """``python -m flows.track`` with the command's flags, in this folder (a clone's flows/ first on the path);
    its exit status. Ctrl-C and SIGTERM are passed on to it."""
    from rollscale.pipeline.interrupts import run_forwarding
    from rollscale.pipeline.stages.specs import project_root

    try:
        root = str(project_root())
    except FileNotFoundError:  # no study folder above: the installed flows/ run
        root = ""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    return run_forwarding([sys.executable, "-m", "flows.track", "--artifacts", artifacts, *rest,
                           *(["--debug"] if debug else [])], env=env)


def print_export(to: str, params: str, artifacts: str, key: int | None, rule: str | None, output: str | None,
                 budget: int | None, force: bool) -> None:
    """``rollscale export``: :func:`rollscale.integrations.export.command.export_run`, the decision table read only
    through the verified reader (:func:`rollscale.pipeline.query.storage.read_table`), and what it wrote printed."""
    from rollscale.integrations.export.command import export_run, print_exported
    from rollscale.pipeline.query.storage import read_table

    print_exported(export_run(to, params, artifacts, key, rule, output, budget, force, read_table=read_table))
