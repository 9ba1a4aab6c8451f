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
``module:function`` (:func:`rollscale.core.problems.rewards.reward_fn`). Several
sources are mixed with weights by :func:`mix_problems`; the selection depends
on problem ids and a seed only, so it is the same whatever the row order.
A table's settings are a ``data.tables`` entry of params.yaml
(:class:`rollscale.config.data.TableParams`).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from rollscale.config.data import TableParams
from rollscale.core.problems.rows import BadRow, check_limit, collect, hub_rows, jsonl_rows, numeric_answer
from rollscale.core.problems.problem import Problem, dedupe
from rollscale.core.problems.rewards import last_boxed, reward_fn

__all__ = ["file_rows", "lookup", "mix_problems", "table_problems"]


def file_rows(path: str | os.PathLike[str]) -> Iterator[tuple[str, Any]]:
    """(where, row) of a local file. JSONL line by line (a bad line is named,
    not fatal for the others); JSON / Parquet / CSV through ``datasets``."""
    suffix = Path(path).suffix.lower()
    if suffix == ".jsonl":
        yield from jsonl_rows(path)
        return
    builder = suffix.removeprefix(".")  # datasets' json, parquet and csv builders
    if not Path(path).is_file():
        raise FileNotFoundError(f"data file not found: {os.fspath(path)}")
    import datasets

    try:
        rows = datasets.load_dataset(builder, data_files=os.fspath(path), split="train")
    except Exception as e:  # pyarrow / datasets raise many types for unreadable files
        raise ValueError(f"{os.fspath(path)}: cannot read as {builder} ({type(e).__name__}: {e})") from None
    for row_no, row in enumerate(rows, start=1):
        yield f"{os.fspath(path)} row {row_no}", row


def lookup(row: Mapping[str, Any], dotted: str) -> Any:
    """The value at ``a.b.c`` in nested mappings; BadRow naming the path if absent."""
    value: Any = row
    for part in dotted.split("."):
        if not isinstance(value, Mapping) or part not in value:
            raise BadRow(f"missing field {dotted!r}")
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
            raise BadRow(f"field {key!r}: expected system messages then one user message, got roles {roles}")
        if not all(isinstance(m.get("content"), str) for m in value):
            raise BadRow(f"field {key!r}: every message needs a string 'content'")
        user = value[-1]["content"]
        system = system or [m["content"] for m in value[:-1]]
    else:
        raise BadRow(f"field {key!r} must be a string or a list of {{role, content}} messages, "
                      f"got {type(value).__name__}")
    if not user.strip():
        raise BadRow(f"field {key!r} is empty")
    return "\n\n".join([*system, user])


def _answer_text(value: Any, key: str, answer_format: str, reward: str) -> str:
    if isinstance(value, list) and len(value) == 1:  # verl stores some ground truths as one-item lists
        value = value[0]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        raise BadRow(f"field {key!r} must be a string or a number, got {type(value).__name__}")
    if answer_format == "gsm8k":
        if "####" not in value:
            raise BadRow(f"field {key!r} has no '#### N' final answer")
        value = value.rsplit("####", 1)[1]
    elif answer_format == "boxed":
        boxed = last_boxed(value)
        if boxed is None:
            raise BadRow(f"field {key!r} has no \\boxed{{}} answer")
        value = boxed
    value = value.strip()
    if not value:
        raise BadRow(f"field {key!r} is empty")
    if reward == "numeric":
        number = numeric_answer(value)
        if number is None:
            raise BadRow(f"field {key!r} is {value[:40]!r}, expected a number (reward numeric)")
        return number
    return value


def table_problems(source: TableParams, skip_malformed: bool = False, limit: int | None = None) -> list[Problem]:
    """The problems of one table (science §2), in row order: malformed rows
    raise DataRowError naming the file (or hub dataset) and row, or are
    skipped and counted with ``skip_malformed``; duplicate prompts are
    dropped; at most ``limit`` problems."""
    check_limit(limit, "table_problems")
    label = source.label
    try:  # a built-in verifier's name is known here (a user's module:function was imported with the params)
        reward_fn(source.reward)
    except ValueError as err:
        raise ValueError(f"table {label}: {err}") from None

    def to_problem(row: Mapping[str, Any], row_no: int) -> Problem:
        prompt = _prompt_text(lookup(row, source.prompt), source.prompt, source.system_prompt)
        answer = _answer_text(lookup(row, source.answer), source.answer, source.answer_format, source.reward)
        return Problem.create(label, prompt, answer, source.reward, {"row": row_no})

    if source.path is not None:
        rows, where = file_rows(source.path), os.fspath(source.path)
    else:
        rows, where = hub_rows(source.hub_id, source.hub_config, source.split), f"{source.hub_id} split {source.split}"
    return collect(rows, to_problem, where, skip_malformed, limit)


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
    return dedupe(mixed, "mixed sources")
