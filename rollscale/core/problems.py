"""Problem sources with stable ids (science §2: the problems that are profiled,
bucketed and trained on).

Each source returns ``Problem`` records whose ``problem_id`` depends only on the
source name and the prompt text, so the same problem gets the same id in every
run, table and split file. Sources: procedurally generated reasoning-gym tasks,
GSM8K and MATH (local JSONL or the Hugging Face hub).
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollscale.core.rewards import REWARD_NAMES, canonical_number, is_reward_name, last_boxed, normalize_number

logger = logging.getLogger("rollscale.core.problems")

__all__ = [
    "DataRowError",
    "Problem",
    "compute_problem_id",
    "disjoint",
    "gsm8k_problems",
    "math_problems",
    "reasoning_gym_problems",
]

_ID_HEX_CHARS = 16
# How many line numbers of skipped rows the log names.
_LOGGED_LINES = 5


def compute_problem_id(source: str, prompt: str) -> str:
    """Stable problem id: first 16 hex chars of sha256(f"{source}\\n{prompt}")."""
    return hashlib.sha256(f"{source}\n{prompt}".encode()).hexdigest()[:_ID_HEX_CHARS]


@dataclass(frozen=True)
class Problem:
    """One problem: the prompt given to the model (before any chat template),
    its gold answer and the verifier that scores it (science §2).

    ``problem_id`` must equal ``compute_problem_id(source, prompt)``; build
    problems with ``Problem.create`` to have it computed. ``meta`` holds
    JSON-serializable extras and takes no part in equality or hashing.
    """

    problem_id: str
    source: str
    prompt: str
    answer: str
    reward: str
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        for name in ("source", "prompt", "answer"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"Problem: {name} must be a non-empty str, got {value!r}")
        if not is_reward_name(self.reward):
            raise ValueError(f"Problem: reward must be one of {', '.join(REWARD_NAMES)} "
                             f"or 'module:function'; got {self.reward!r}")
        expected_id = compute_problem_id(self.source, self.prompt)
        if self.problem_id != expected_id:
            raise ValueError(
                f"Problem: problem_id {self.problem_id!r} does not match source and prompt "
                f"(expected {expected_id!r}); use Problem.create"
            )
        if not isinstance(self.meta, dict):
            raise ValueError(f"Problem: meta must be a dict, got {type(self.meta).__name__}")
        try:
            json.dumps(self.meta)
        except (TypeError, ValueError) as e:
            raise ValueError(f"Problem: meta must be JSON-serializable ({e})") from None

    @classmethod
    def create(
        cls, source: str, prompt: str, answer: str, reward: str, meta: dict[str, Any] | None = None
    ) -> Problem:
        """A Problem with its id computed from ``source`` and ``prompt``."""
        return cls(
            problem_id=compute_problem_id(source, prompt),
            source=source,
            prompt=prompt,
            answer=answer,
            reward=reward,
            meta={} if meta is None else meta,
        )


class DataRowError(ValueError):
    """A data row that cannot become a Problem; the message names the file
    (or hub dataset), the 1-based line (or row) and what was expected."""

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"{where}: {reason}")
        self.where = where
        self.reason = reason


class _BadRow(Exception):
    """Internal: why one row is malformed; the reader adds where it is."""


def disjoint(problems: Iterable[Problem], exclude: set[str]) -> list[Problem]:
    """The problems whose ids are not in ``exclude`` (e.g. keep training
    problems disjoint from validation ones, science §2), order kept."""
    if not isinstance(exclude, (set, frozenset)):
        raise ValueError(f"disjoint: exclude must be a set of problem ids, got {type(exclude).__name__}")
    return [p for p in problems if p.problem_id not in exclude]


def _dedupe(problems: list[Problem], label: str) -> list[Problem]:
    """Drop repeated problem ids, keeping the first, and log how many."""
    seen: set[str] = set()
    kept = []
    for p in problems:
        if p.problem_id not in seen:
            seen.add(p.problem_id)
            kept.append(p)
    if len(kept) < len(problems):
        logger.info("%s: dropped %d duplicate problems (same prompt)", label, len(problems) - len(kept))
    return kept


# ---------------------------------------------------------------------------
# reasoning-gym


def _reasoning_gym_registry() -> dict[str, tuple[type, type]]:
    import reasoning_gym  # noqa: F401  (importing it registers every dataset)
    from reasoning_gym.factory import DATASETS

    return DATASETS


def _numeric_answer(text: str) -> str | None:
    value = normalize_number(text)
    return None if value is None else canonical_number(value)


def reasoning_gym_problems(
    name: str,
    size: int,
    seed: int,
    config: dict[str, Any] | None = None,
    prompt_style: str = "question",
) -> list[Problem]:
    """``size`` procedurally generated problems of reasoning-gym dataset ``name``
    (science §2), scored by the numeric verifier.

    ``prompt_style="question"`` uses the dataset's natural-language question;
    ``"expression"`` the compact form for a character-level model: the
    ``expression`` metadata with all whitespace removed plus ``"="`` (e.g.
    ``"12+7-45="``). ``config`` holds the dataset's own parameters (e.g.
    ``min_digits`` for chain_sum); ``size`` and ``seed`` are given as arguments.
    Duplicate prompts are dropped (keeping the first), so small problem spaces
    can return fewer than ``size`` problems. Datasets with non-numeric answers
    are refused.
    """
    if not isinstance(name, str):
        raise ValueError(f"reasoning_gym_problems: name must be a str, got {type(name).__name__}")
    if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
        raise ValueError(f"reasoning_gym_problems: size must be a positive int, got {size!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"reasoning_gym_problems: seed must be an int, got {seed!r}")
    if prompt_style not in ("question", "expression"):
        raise ValueError(f"reasoning_gym_problems: prompt_style must be 'question' or 'expression', got {prompt_style!r}")
    config = dict(config or {})

    registry = _reasoning_gym_registry()
    if name not in registry:
        close = difflib.get_close_matches(name, registry, n=3)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise ValueError(
            f"reasoning_gym_problems: unknown dataset {name!r}; {hint}"
            f"valid names include {', '.join(sorted(registry)[:8])}, ... ({len(registry)} in all)"
        )
    dataset_cls, config_cls = registry[name]
    valid_keys = {f.name for f in dataclasses.fields(config_cls)} - {"size", "seed"}
    for key in config:
        if key in ("size", "seed"):
            raise ValueError(f"reasoning_gym_problems: config key {key!r} must be given as the {key} argument")
        if key not in valid_keys:
            raise ValueError(
                f"reasoning_gym_problems: config key {key!r} is not a parameter of dataset {name!r}; "
                f"valid keys: {', '.join(sorted(valid_keys))}"
            )
    import reasoning_gym

    try:
        dataset = reasoning_gym.create_dataset(name, size=size, seed=seed, **config)
    except AssertionError as e:  # reasoning-gym validates configs with assert
        raise ValueError(f"reasoning_gym_problems: invalid config for {name!r}: {e}") from None

    source = f"reasoning_gym:{name}"
    problems = []
    for index in range(size):
        item = dataset[index]
        metadata = item.get("metadata", {})
        if prompt_style == "question":
            prompt = item["question"]
        else:
            expression = metadata.get("expression")
            if not isinstance(expression, str):
                raise ValueError(
                    f"reasoning_gym_problems: dataset {name!r} has no 'expression' metadata, "
                    "so prompt_style='expression' is not available; use prompt_style='question'"
                )
            prompt = "".join(expression.split()) + "="
        answer = _numeric_answer(str(item["answer"]))
        if answer is None:
            raise ValueError(
                f"reasoning_gym_problems: dataset {name!r} item {index} has non-numeric answer "
                f"{item['answer']!r}; only numeric-answer datasets are supported"
            )
        # Round-trip through JSON (tuples become lists; anything else, its str).
        meta = json.loads(
            json.dumps({"seed": seed, "index": index, "config": config, "metadata": metadata}, default=str)
        )
        problems.append(Problem.create(source, prompt, answer, "numeric", meta))
    return _dedupe(problems, source)


# ---------------------------------------------------------------------------
# Files and hub datasets


def _jsonl_rows(path: str | os.PathLike[str]) -> Iterator[tuple[str, Any]]:
    """(where, row) for every non-blank line; row is an exception instance
    (``_BadRow``) for a line that is not a JSON object."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"data file not found: {os.fspath(path)}")
    with p.open("rb") as f:
        for line_no, raw in enumerate(f, start=1):
            where = f"{os.fspath(path)} line {line_no}"
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                yield where, _BadRow("not valid UTF-8")
                continue
            if not text.strip():
                continue
            try:
                row = json.loads(text)
            except json.JSONDecodeError as e:
                # some of json's messages end in "at" themselves ("Invalid control character at")
                yield where, _BadRow(f"bad JSON ({e.msg.removesuffix(' at')} at column {e.colno})")
                continue
            yield where, row


def _hub_rows(hub_id: str, hub_config: str | None, split: str) -> Iterator[tuple[str, Any]]:
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


def _require_str(row: Mapping[str, Any], key: str, expected: str) -> str:
    if key not in row:
        raise _BadRow(f"missing field {key!r} (expected keys {expected})")
    value = row[key]
    if not isinstance(value, str):
        raise _BadRow(f"field {key!r} must be a string, got {type(value).__name__}")
    if not value.strip():
        raise _BadRow(f"field {key!r} is empty")
    return value


def _collect(
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
            if isinstance(row, _BadRow):
                raise row
            if not isinstance(row, Mapping):
                raise _BadRow(f"expected a JSON object, got {type(row).__name__}")
            problem = to_problem(row, row_no)
        except _BadRow as e:
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


def _check_limit(limit: int | None, caller: str) -> None:
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0):
        raise ValueError(f"{caller}: limit must be a positive int or None, got {limit!r}")


def gsm8k_problems(
    path: str | os.PathLike[str] | None = None,
    split: str = "test",
    skip_malformed: bool = False,
    limit: int | None = None,
    *,
    hub_id: str = "openai/gsm8k",
    hub_config: str | None = "main",
) -> list[Problem]:
    """GSM8K problems (science §2), scored by the numeric verifier.

    From the JSONL file at ``path`` (fields ``question`` and ``answer``; the
    gold is the number after the answer's last ``####``, in canonical form),
    or when ``path`` is None from the hub dataset ``hub_id`` / ``split``
    (``split`` is used only for the hub). Malformed rows raise DataRowError
    unless ``skip_malformed``; duplicates are dropped; at most ``limit``
    problems, the first in file order.
    """
    _check_limit(limit, "gsm8k_problems")
    expected = "question, answer"

    def to_problem(row: Mapping[str, Any], row_no: int) -> Problem:
        question = _require_str(row, "question", expected)
        solution = _require_str(row, "answer", expected)
        if "####" not in solution:
            raise _BadRow("field 'answer' has no '#### N' final answer")
        gold_text = solution.rsplit("####", 1)[1].strip()
        if not gold_text:
            raise _BadRow("field 'answer' is empty after '####'")
        gold = _numeric_answer(gold_text)
        if gold is None:
            raise _BadRow(f"field 'answer' ends in '#### {gold_text[:40]}', expected a number")
        return Problem.create("gsm8k", question, gold, "numeric", {"row": row_no})

    if path is None:
        rows, label = _hub_rows(hub_id, hub_config, split), f"{hub_id} split {split}"
    else:
        rows, label = _jsonl_rows(path), os.fspath(path)
    return _collect(rows, to_problem, label, skip_malformed, limit)


def math_problems(
    path: str | os.PathLike[str] | None = None,
    split: str = "test",
    skip_malformed: bool = False,
    limit: int | None = None,
    *,
    hub_id: str = "HuggingFaceH4/MATH-500",
    hub_config: str | None = None,
) -> list[Problem]:
    """MATH problems (science §2), scored by the math verifier (math-verify).

    From the JSONL file at ``path`` (fields ``problem`` and ``answer``, or
    ``solution`` whose last ``\\boxed{}`` is the gold when ``answer`` is absent;
    ``subject``, ``level`` and ``unique_id`` go to meta when present), or when
    ``path`` is None from the hub dataset ``hub_id`` / ``split`` (``split`` is
    used only for the hub). Malformed rows raise DataRowError unless
    ``skip_malformed``; duplicates are dropped; at most ``limit`` problems.
    """
    _check_limit(limit, "math_problems")
    expected = "problem, answer (or solution with \\boxed{})"

    def to_problem(row: Mapping[str, Any], row_no: int) -> Problem:
        problem = _require_str(row, "problem", expected)
        if "answer" in row:
            answer = _require_str(row, "answer", expected).strip()
        elif "solution" in row:
            boxed = last_boxed(_require_str(row, "solution", expected))
            if boxed is None or not boxed.strip():
                raise _BadRow("no field 'answer' and field 'solution' has no non-empty \\boxed{}")
            answer = boxed.strip()
        else:
            raise _BadRow(f"missing field 'answer' (expected keys {expected})")
        meta: dict[str, Any] = {"row": row_no}
        for key in ("subject", "level", "unique_id"):
            if isinstance(row.get(key), (str, int, float)) and not isinstance(row.get(key), bool):
                meta[key] = row[key]
        return Problem.create("math", problem, answer, "math", meta)

    if path is None:
        rows, label = _hub_rows(hub_id, hub_config, split), f"{hub_id} split {split}"
    else:
        rows, label = _jsonl_rows(path), os.fspath(path)
    return _collect(rows, to_problem, label, skip_malformed, limit)
