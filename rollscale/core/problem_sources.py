"""A user's own problem set as problems with stable ids (science §2).

Any table a user trains on with TRL or verl: a local JSONL, JSON, Parquet or
CSV file, or a Hugging Face hub dataset (read with ``datasets``). A column
mapping says where the prompt and the gold answer are:

* prompt: a string column, or TRL's conversational layout, a list of
  ``{"role", "content"}`` messages (system messages, then one user message);
* answer: a column or a dotted path into nested records, e.g. verl's
  ``reward_model.ground_truth``; optionally read from a GSM8K-style
  ``#### N`` solution or from a solution's last ``\\boxed{}``.

rollscale renders every problem as one user turn, so a system prompt (from
the configuration or the conversation's system messages) is put before the
user text, separated by a blank line; it is part of the prompt and so of the
id. The verifier is a built-in name ("numeric", "math", "exact") or a user's
``module:function`` (:func:`rollscale.core.rewards.reward_fn`). Several
sources are mixed with weights by :func:`mix_problems`; the selection depends
on problem ids and a seed only, so it is the same whatever the row order.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from rollscale.core.problems import (
    Problem,
    _BadRow,
    _check_limit,
    _collect,
    _dedupe,
    _hub_rows,
    _jsonl_rows,
    _numeric_answer,
)
from rollscale.core.rewards import last_boxed, reward_fn

__all__ = ["FILE_SUFFIXES", "TableSource", "mix_problems", "table_problems"]

# local file suffix -> datasets builder (JSONL is read line by line, see _file_rows)
FILE_SUFFIXES = {".jsonl": None, ".json": "json", ".parquet": "parquet", ".csv": "csv"}
AnswerFormat = Literal["raw", "gsm8k", "boxed"]


@dataclass(frozen=True)
class TableSource:
    """Where a problem table is and how its columns map to problems.

    Exactly one of ``path`` (local file, which must exist) and ``hub_id``
    (hub dataset, with ``hub_config`` and ``split``). This is also the
    schema of ``data.tables`` entries in params.yaml. ``name`` is the source part of every
    problem id (default: the file's stem or the hub id); give the same name
    to the same set wherever it is stored. ``answer_format``: ``raw`` (the
    value as is), ``gsm8k`` (the number after the last ``####``), ``boxed``
    (the last ``\\boxed{}``). Numeric answers are stored in canonical form.
    """

    # a local .jsonl / .json / .parquet / .csv file, or a Hugging Face hub dataset id
    path: str | Path | None = None
    hub_id: str | None = None
    hub_config: str | None = None
    split: str = "train"
    # the source part of every problem id; default: the file's stem or the hub id
    name: str | None = None
    # prompt column: a string or TRL's list of {role, content} messages
    prompt: str = "prompt"
    # answer column, dotted for nested records (verl: reward_model.ground_truth)
    answer: str = "answer"
    answer_format: AnswerFormat = "raw"
    system_prompt: str | None = None
    # numeric | math (math-verify, boxed) | exact | a user's "module:function"
    reward: str = "math"
    # share in a mix of several tables (mix_problems)
    weight: float = 1.0

    def __post_init__(self) -> None:
        if (self.path is None) == (self.hub_id is None):
            raise ValueError("give exactly one of path (a local file) and hub_id (a hub dataset)")
        if self.path is not None:
            if Path(self.path).suffix.lower() not in FILE_SUFFIXES:
                raise ValueError(f"path: expected a {', '.join(FILE_SUFFIXES)} file, got {os.fspath(self.path)}")
            if not Path(self.path).is_file():
                raise ValueError(f"path: file not found: {os.fspath(self.path)}")
            if Path(self.path).stat().st_size == 0:
                raise ValueError(f"path: data file {os.fspath(self.path)} is empty")
        if self.answer_format not in ("raw", "gsm8k", "boxed"):
            raise ValueError(f"answer_format: expected raw, gsm8k or boxed, got {self.answer_format!r}")
        if not self.weight > 0:
            raise ValueError(f"weight: expected a number > 0, got {self.weight!r}")
        reward_fn(self.reward)  # a user's module:function must import now, not mid-study

    @property
    def label(self) -> str:
        """The source name in problem ids."""
        if self.name:
            return self.name
        return Path(self.path).stem if self.path is not None else str(self.hub_id)


def _file_rows(path: str | os.PathLike[str]) -> Iterator[tuple[str, Any]]:
    """(where, row) of a local file. JSONL line by line (a bad line is named,
    not fatal for the others); JSON / Parquet / CSV through ``datasets``."""
    builder = FILE_SUFFIXES[Path(path).suffix.lower()]
    if builder is None:
        yield from _jsonl_rows(path)
        return
    if not Path(path).is_file():
        raise FileNotFoundError(f"data file not found: {os.fspath(path)}")
    import datasets

    try:
        rows = datasets.load_dataset(builder, data_files=os.fspath(path), split="train")
    except Exception as e:  # pyarrow / datasets raise many types for unreadable files
        raise ValueError(f"{os.fspath(path)}: cannot read as {builder} ({type(e).__name__}: {e})") from None
    for row_no, row in enumerate(rows, start=1):
        yield f"{os.fspath(path)} row {row_no}", row


def _lookup(row: Mapping[str, Any], dotted: str) -> Any:
    """The value at ``a.b.c`` in nested mappings; _BadRow naming the path if absent."""
    value: Any = row
    for part in dotted.split("."):
        if not isinstance(value, Mapping) or part not in value:
            raise _BadRow(f"missing field {dotted!r}")
        value = value[part]
    return value


def _prompt_text(value: Any, key: str, system_prompt: str | None) -> str:
    """A prompt string from a string or TRL's conversational messages."""
    system = [system_prompt] if system_prompt else []
    if isinstance(value, str):
        user = value
    elif isinstance(value, list) and value and all(isinstance(m, Mapping) for m in value):
        roles = [m.get("role") for m in value]
        if roles[-1] != "user" or any(r != "system" for r in roles[:-1]):
            raise _BadRow(f"field {key!r}: expected system messages then one user message, got roles {roles}")
        if not all(isinstance(m.get("content"), str) for m in value):
            raise _BadRow(f"field {key!r}: every message needs a string 'content'")
        user = value[-1]["content"]
        system = system or [m["content"] for m in value[:-1]]
    else:
        raise _BadRow(f"field {key!r} must be a string or a list of {{role, content}} messages, "
                      f"got {type(value).__name__}")
    if not user.strip():
        raise _BadRow(f"field {key!r} is empty")
    return "\n\n".join([*system, user])


def _answer_text(value: Any, key: str, answer_format: str, reward: str) -> str:
    if isinstance(value, list) and len(value) == 1:  # verl stores some ground truths as one-item lists
        value = value[0]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        raise _BadRow(f"field {key!r} must be a string or a number, got {type(value).__name__}")
    if answer_format == "gsm8k":
        if "####" not in value:
            raise _BadRow(f"field {key!r} has no '#### N' final answer")
        value = value.rsplit("####", 1)[1]
    elif answer_format == "boxed":
        boxed = last_boxed(value)
        if boxed is None:
            raise _BadRow(f"field {key!r} has no \\boxed{{}} answer")
        value = boxed
    value = value.strip()
    if not value:
        raise _BadRow(f"field {key!r} is empty")
    if reward == "numeric":
        number = _numeric_answer(value)
        if number is None:
            raise _BadRow(f"field {key!r} is {value[:40]!r}, expected a number (reward numeric)")
        return number
    return value


def table_problems(source: TableSource, skip_malformed: bool = False, limit: int | None = None) -> list[Problem]:
    """The problems of one table (science §2), in row order: malformed rows
    raise DataRowError naming the file (or hub dataset) and row, or are
    skipped and counted with ``skip_malformed``; duplicate prompts are
    dropped; at most ``limit`` problems."""
    _check_limit(limit, "table_problems")
    label = source.label

    def to_problem(row: Mapping[str, Any], row_no: int) -> Problem:
        prompt = _prompt_text(_lookup(row, source.prompt), source.prompt, source.system_prompt)
        answer = _answer_text(_lookup(row, source.answer), source.answer, source.answer_format, source.reward)
        return Problem.create(label, prompt, answer, source.reward, {"row": row_no})

    if source.path is not None:
        rows, where = _file_rows(source.path), os.fspath(source.path)
    else:
        rows, where = _hub_rows(source.hub_id, source.hub_config, source.split), f"{source.hub_id} split {source.split}"
    return _collect(rows, to_problem, where, skip_malformed, limit)


def _rank(seed: int, problem_id: str) -> str:
    return hashlib.sha256(f"{seed}\n{problem_id}".encode()).hexdigest()


def mix_problems(parts: Sequence[tuple[str, list[Problem], float]], size: int | None, seed: int) -> list[Problem]:
    """Mix problem lists ``(label, problems, weight)`` in proportion to their weights.

    Each part contributes ``size * weight / sum(weights)`` problems (largest
    remainders rounding); with ``size`` None, the largest mix the parts can
    fill. A part's problems are picked by a seeded hash of their ids, so the
    pick is the same in any row order; they keep their order. A part too
    small for its share raises, naming it.
    """
    if not parts:
        raise ValueError("mix_problems: expected at least one part")
    for label, problems, weight in parts:
        if not weight > 0:
            raise ValueError(f"mix_problems: {label}: weight must be > 0, got {weight!r}")
        if not problems:
            raise ValueError(f"mix_problems: {label}: no problems")
    total_w = sum(w for _, _, w in parts)
    shares = [w / total_w for _, _, w in parts]
    if size is None:
        size = int(min(len(p) / s for (_, p, _), s in zip(parts, shares, strict=True)) + 1e-9)
    exact = [size * s for s in shares]
    counts = [int(x) for x in exact]
    by_remainder = sorted(range(len(parts)), key=lambda i: exact[i] - counts[i], reverse=True)
    for i in by_remainder[: size - sum(counts)]:
        counts[i] += 1
    mixed: list[Problem] = []
    for (label, problems, weight), count in zip(parts, counts, strict=True):
        if count > len(problems):
            raise ValueError(f"mix_problems: {label} has {len(problems)} problems; its weight {weight} "
                             f"asks for {count} of {size}")
        keep = set(sorted((p.problem_id for p in problems), key=lambda pid: _rank(seed, pid))[:count])
        mixed.extend(p for p in problems if p.problem_id in keep)
    return _dedupe(mixed, "mixed sources")
