"""What a user's problem table looks like, from a sample of its rows (science §2).

:func:`inspect_rows` finds the prompt column (a string, or TRL's list of
``{role, content}`` messages) and the gold answer (a column, or verl's nested
``reward_model.ground_truth``), and reads the answers' format: GSM8K's ``#### N``
solutions (numeric verifier), LaTeX ``\\boxed{}`` solutions (math verifier), bare
numbers (numeric verifier) or short expressions (math verifier). It measures
prompt and reference-solution lengths for ``rollscale init``
(:mod:`rollscale.pipeline.init.values`). :func:`count_rows` counts a local file's rows
without parsing them (the check's pool size).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from rollscale.config.data import TABLE_SUFFIXES
from rollscale.core.problems.problem import DataRowError
from rollscale.core.problems.rows import BadRow, hub_rows
from rollscale.core.problems.sources import file_rows, lookup

__all__ = ["ANSWER_KEYS", "PROMPT_KEYS", "DataSample", "count_rows", "inspect_rows", "read_sample",
           "sample_rows"]

# where TRL, verl and the common hub sets keep the prompt and the gold answer, most specific first
PROMPT_KEYS = ("prompt", "messages", "question", "problem", "query", "input", "instruction")
ANSWER_KEYS = ("reward_model.ground_truth", "answer", "ground_truth", "final_answer", "solution", "target",
               "label", "output", "response")
_NUMBER = re.compile(r"^\s*[-+]?(\d{1,3}(,\d{3})+|\d+)?(\.\d+)?\s*$")
_SOLUTION_CHARS = 80  # an answer longer than this is a worked solution, not a final answer


@dataclass(frozen=True)
class DataSample:
    """A table's layout and lengths, read from ``rows`` sampled rows."""

    prompt: str  # column (dotted) of the prompt
    prompt_kind: Literal["messages", "string"]
    answer: str  # column (dotted) of the gold answer
    answer_format: Literal["raw", "gsm8k", "boxed"]
    reward: Literal["numeric", "math"]
    rows: int  # rows sampled
    prompt_tokens: list[int]  # per sampled row
    solution_tokens: list[int]  # reference solutions' lengths; empty when the answers are bare
    solution_column: str | None  # where the reference solutions are
    token_unit: str  # "tokens" (the model's tokenizer) or "~tokens (4 characters each)"


def count_rows(path: str | os.PathLike[str]) -> int | None:
    """Rows of a local table file, cheaply: Parquet from its footer, JSONL by non-blank lines,
    CSV by lines (less the header); None for JSON or an unreadable file (unknown, not zero)."""
    p = Path(path)
    suffix = p.suffix.lower()
    try:
        if suffix == ".parquet":
            import pyarrow.parquet as pq

            return int(pq.ParquetFile(p).metadata.num_rows)
        if suffix in (".jsonl", ".csv"):
            with p.open("rb") as fh:
                lines = sum(1 for line in fh if line.strip())
            return max(lines - (suffix == ".csv"), 0)
    except (OSError, ValueError):
        return None
    return None


def read_sample(where: str, rows: int = 200) -> list[Mapping[str, Any]]:
    """The first ``rows`` rows of a local file (JSONL, JSON, Parquet, CSV) or a hub dataset
    (``id``, ``id:config`` or ``id:config:split``; train split by default)."""
    return [row for _, row in sample_rows(where, rows)]


def sample_rows(where: str, rows: int = 200) -> list[tuple[str, Mapping[str, Any]]]:
    """:func:`read_sample`'s rows, each with its place (file and line or row) for a message that names it."""
    path = Path(where)
    if path.suffix.lower() in TABLE_SUFFIXES:
        if not path.is_file():
            raise FileNotFoundError(f"--data: file not found: {where}")
        source = file_rows(path)
    elif path.exists():
        raise ValueError(f"--data: expected a {', '.join(TABLE_SUFFIXES)} file or a hub dataset id, got {where}")
    else:
        hub_id, config, split = ([*where.split(":"), None, None][:3])
        source = hub_rows(hub_id, config or None, split or "train")
    out = []
    for place, row in source:
        if isinstance(row, Exception):
            raise ValueError(f"{place}: {row}")
        out.append((place, row))
        if len(out) >= rows:
            break
    if not out:
        raise ValueError(f"--data: {where} has no rows")
    return out


def _get(row: Mapping[str, Any], dotted: str) -> Any:
    try:
        return lookup(row, dotted)
    except BadRow:  # not in this row: the column is not the one
        return None


def _text(value: Any) -> str | None:
    if isinstance(value, list) and len(value) == 1:  # verl keeps some ground truths as one-item lists
        value = value[0]
    if isinstance(value, float) and math.isnan(value):  # a missing value (JSON NaN, pandas' empty cell)
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return value if isinstance(value, str) else None


def _prompt_kind(values: list[Any]) -> Literal["messages", "string"] | None:
    if all(isinstance(v, str) and v.strip() for v in values):
        return "string"
    if all(isinstance(v, list) and v and all(isinstance(m, Mapping) and "content" in m for m in v) for v in values):
        return "messages"
    return None


def _prompt_text(value: Any) -> str:
    return value if isinstance(value, str) else "\n\n".join(str(m.get("content", "")) for m in value)


def _answer_format(texts: list[str]) -> tuple[str, str] | None:
    """(answer_format, reward) that every sampled answer fits, or None."""
    if all("####" in t for t in texts):
        return "gsm8k", "numeric"
    if all(re.search(r"\\(boxed|fbox)\s*\{", t) for t in texts):
        return "boxed", "math"
    if all(_NUMBER.match(t) and any(c.isdigit() for c in t) for t in texts):
        return "raw", "numeric"
    if all(len(t) <= _SOLUTION_CHARS for t in texts):
        return "raw", "math"  # short expressions (\frac{1}{2}, x^2+1): math-verify compares them
    return None


def _worked(rows: Sequence[Mapping[str, Any]], key: str) -> bool:
    """Column ``key`` holds worked solutions: text in every row, most of it longer than a final answer."""
    texts = [_text(_get(r, key)) for r in rows]
    if any(t is None for t in texts):
        return False
    lengths = sorted(len(t) for t in texts if t is not None)
    return lengths[len(lengths) // 2] > _SOLUTION_CHARS


def _empty(value: Any) -> str | None:
    """How a row's cell is empty (``missing``, ``null``, ``NaN``, ``blank``), or None when it holds something."""
    if value is None:
        return "null"
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if isinstance(value, str) and not value.strip():
        return "blank"
    return None


def _absent(row: Mapping[str, Any], dotted: str) -> bool:
    try:
        lookup(row, dotted)
    except BadRow:
        return True
    return False


def _refuse_gap(rows: Sequence[Mapping[str, Any]], places: Sequence[str] | None, keys: Sequence[str],
                fits: Callable[[list[Any]], bool], what: str) -> None:
    """No column of ``keys`` fits in every row: where one fits in most of them but is empty in some, the
    first such row is named (a NaN answer is a bad row, not a table without answers)."""
    for k in keys:
        cells = [_get(r, k) for r in rows]
        given = [c for c in cells if _empty(c) is None]
        if 2 * len(given) > len(cells) and fits(given):
            i = next(i for i, c in enumerate(cells) if _empty(c) is not None)
            missing = "missing" if _absent(rows[i], k) else _empty(cells[i])
            where = places[i] if places else f"row {i + 1} of the sample"
            raise DataRowError(where, f"field {k!r} is {missing}: every problem needs its {what}")


def inspect_rows(rows: Sequence[Mapping[str, Any]], count_tokens: Callable[[str], int] | None = None,
                 places: Sequence[str] | None = None) -> DataSample:
    """The layout of a table from sampled rows; ValueError naming what could not be found, and a
    :class:`DataRowError` naming the row (``places``: each row's file and line) where the column is
    there but a row's cell is empty (NaN, null, blank).

    ``count_tokens`` measures lengths with the model's tokenizer; without it a token is
    counted as 4 characters (English text with a BPE tokenizer)."""
    if not rows:
        raise ValueError("no rows to inspect")
    keys = sorted({k for r in rows for k in r})
    prompt = next((k for k in PROMPT_KEYS if all(_get(r, k) is not None for r in rows)
                   and _prompt_kind([_get(r, k) for r in rows])), None)
    if prompt is None:
        _refuse_gap(rows, places, PROMPT_KEYS, lambda cells: _prompt_kind(cells) is not None, "prompt")
        raise ValueError(f"no prompt column: expected one of {', '.join(PROMPT_KEYS)} holding text or "
                         f"[{{role, content}}] messages in every row (the table has {', '.join(keys)})")
    kind = _prompt_kind([_get(r, prompt) for r in rows])
    answer, fmt = None, None
    for k in ANSWER_KEYS:
        texts = [_text(_get(r, k)) for r in rows]
        if k != prompt and all(t is not None and t.strip() for t in texts) and (fmt := _answer_format(texts)):
            answer = k
            break
    if answer is None or fmt is None:
        _refuse_gap(rows, places, [k for k in ANSWER_KEYS if k != prompt],
                    lambda cells: all(_text(c) for c in cells) and _answer_format([_text(c) for c in cells]) is not None,
                    "gold answer")
        raise ValueError(f"no answer column: expected one of {', '.join(ANSWER_KEYS)} holding a final answer "
                         f"(a number, a short expression, '#### N' or \\boxed{{}}) in every row (the table has "
                         f"{', '.join(keys)})")
    count = count_tokens or (lambda s: max(1, round(len(s) / 4)))
    unit = "tokens" if count_tokens else "~tokens (4 characters each)"
    # reference solutions: the answer column when it holds worked solutions, else another column that does
    solution = answer if fmt[0] in ("gsm8k", "boxed") else next(
        (k for k in ANSWER_KEYS if k not in (answer, prompt) and _worked(rows, k)), None)
    return DataSample(
        prompt=prompt, prompt_kind=kind or "string", answer=answer, answer_format=fmt[0],  # type: ignore[arg-type]
        reward=fmt[1], rows=len(rows),  # type: ignore[arg-type]
        prompt_tokens=[count(_prompt_text(_get(r, prompt))) for r in rows],
        solution_tokens=[count(_text(_get(r, solution)) or "") for r in rows] if solution else [],
        solution_column=solution, token_unit=unit,
    )
