"""Rows of a problem file or hub dataset turned into problems (science §2), for every
source that reads rows (:mod:`rollscale.core.problems.sets`, :mod:`rollscale.core.problems.sources`).

A malformed row raises :class:`~rollscale.core.problems.problem.DataRowError` naming the
file (or hub dataset) and the 1-based line (or row), or is skipped and counted;
duplicate prompts are dropped.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from rollscale.core.problems.problem import DataRowError, Problem
from rollscale.core.problems.rewards import canonical_number, normalize_number

logger = logging.getLogger("rollscale.core.problems.problem")

__all__ = ["BadRow", "check_limit", "collect", "hub_rows", "jsonl_rows", "numeric_answer", "require_str"]

# How many line numbers of skipped rows the log names.
_LOGGED_LINES = 5


class BadRow(Exception):
    """Why one row is malformed; the reader adds where it is (:func:`collect`)."""


def numeric_answer(text: str) -> str | None:
    value = normalize_number(text)
    return None if value is None else canonical_number(value)


def jsonl_rows(path: str | os.PathLike[str]) -> Iterator[tuple[str, Any]]:
    """(where, row) for every non-blank line; row is an exception instance
    (``BadRow``) for a line that is not a JSON object."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"data file not found: {os.fspath(path)}")
    with p.open("rb") as f:
        for line_no, raw in enumerate(f, start=1):
            where = f"{os.fspath(path)} line {line_no}"
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                yield where, BadRow("not valid UTF-8")
                continue
            if not text.strip():
                continue
            try:
                row = json.loads(text)
            except json.JSONDecodeError as e:
                # some of json's messages end in "at" themselves ("Invalid control character at")
                yield where, BadRow(f"bad JSON ({e.msg.removesuffix(' at')} at column {e.colno})")
                continue
            yield where, row


def hub_rows(hub_id: str, hub_config: str | None, split: str) -> Iterator[tuple[str, Any]]:
    """(where, row) for the rows of a Hugging Face hub dataset (needs network
    or the local hub cache)."""
    import datasets

    if hub_config is None:
        rows = datasets.load_dataset(hub_id, split=split)
    else:
        rows = datasets.load_dataset(hub_id, hub_config, split=split)
    label = hub_id if hub_config is None else f"{hub_id} ({hub_config})"
    for row_no, row in enumerate(rows, start=1):
        yield f"{label} split {split} row {row_no}", row


def require_str(row: Mapping[str, Any], key: str, expected: str) -> str:
    if key not in row:
        raise BadRow(f"missing field {key!r} (expected keys {expected})")
    value = row[key]
    if not isinstance(value, str):
        raise BadRow(f"field {key!r} must be a string, got {type(value).__name__}")
    if not value.strip():
        raise BadRow(f"field {key!r} is empty")
    return value


def collect(
    rows: Iterable[tuple[str, Any]],
    to_problem: Callable[[Mapping[str, Any], int], Problem],
    label: str,
    skip_malformed: bool,
    limit: int | None,
) -> list[Problem]:
    """Turn rows into problems: malformed rows raise DataRowError (or are
    skipped and counted), duplicate ids are dropped, at most ``limit`` kept."""
    problems: list[Problem] = []
    seen: set[str] = set()
    duplicates = 0
    skipped: list[str] = []
    for row_no, (where, row) in enumerate(rows, start=1):
        try:
            if isinstance(row, BadRow):
                raise row
            if not isinstance(row, Mapping):
                raise BadRow(f"expected a JSON object, got {type(row).__name__}")
            problem = to_problem(row, row_no)
        except BadRow as e:
            if not skip_malformed:
                raise DataRowError(where, str(e)) from None
            skipped.append(where)
            continue
        if problem.problem_id in seen:
            duplicates += 1
            continue
        seen.add(problem.problem_id)
        problems.append(problem)
        if limit is not None and len(problems) >= limit:
            break
    if skipped:
        logger.warning(
            "%s: skipped %d malformed rows (first: %s)", label, len(skipped), "; ".join(skipped[:_LOGGED_LINES])
        )
    if not problems:  # an empty pool would fail stages later, naming nothing
        raise ValueError(f"{label}: no problems ({f'all {len(skipped)} rows are malformed' if skipped else 'no rows'})")
    if duplicates:
        logger.info("%s: dropped %d duplicate problems (same prompt)", label, duplicates)
    return problems


def check_limit(limit: int | None, caller: str) -> None:
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0):
        raise ValueError(f"{caller}: limit must be a positive int or None, got {limit!r}")
