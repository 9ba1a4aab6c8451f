"""Named problem sets as problems with stable ids (science §2): procedurally generated
reasoning-gym tasks, GSM8K and MATH (a local JSONL file or the Hugging Face hub)."""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
from collections.abc import Mapping
from typing import Any

from rollscale.core.problems.rows import BadRow, check_limit, collect, hub_rows, jsonl_rows, numeric_answer, require_str
from rollscale.core.problems.problem import Problem, dedupe
from rollscale.core.problems.rewards import last_boxed

__all__ = ["gsm8k_problems", "math_problems", "reasoning_gym_problems"]


# ---------------------------------------------------------------------------
# reasoning-gym


def _reasoning_gym_registry() -> dict[str, tuple[type, type]]:
    import reasoning_gym  # noqa: F401  (importing it registers every dataset)
    from reasoning_gym.factory import DATASETS

    return DATASETS


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
        answer = numeric_answer(str(item["answer"]))
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
    return dedupe(problems, source)


# ---------------------------------------------------------------------------
# GSM8K and MATH


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
    check_limit(limit, "gsm8k_problems")
    expected = "question, answer"

    def to_problem(row: Mapping[str, Any], row_no: int) -> Problem:
        question = require_str(row, "question", expected)
        solution = require_str(row, "answer", expected)
        if "####" not in solution:
            raise BadRow("field 'answer' has no '#### N' final answer")
        gold_text = solution.rsplit("####", 1)[1].strip()
        if not gold_text:
            raise BadRow("field 'answer' is empty after '####'")
        gold = numeric_answer(gold_text)
        if gold is None:
            raise BadRow(f"field 'answer' ends in '#### {gold_text[:40]}', expected a number")
        return Problem.create("gsm8k", question, gold, "numeric", {"row": row_no})

    if path is None:
        rows, label = hub_rows(hub_id, hub_config, split), f"{hub_id} split {split}"
    else:
        rows, label = jsonl_rows(path), os.fspath(path)
    return collect(rows, to_problem, label, skip_malformed, limit)


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
    check_limit(limit, "math_problems")
    expected = "problem, answer (or solution with \\boxed{})"

    def to_problem(row: Mapping[str, Any], row_no: int) -> Problem:
        problem = require_str(row, "problem", expected)
        if "answer" in row:
            answer = require_str(row, "answer", expected).strip()
        elif "solution" in row:
            boxed = last_boxed(require_str(row, "solution", expected))
            if boxed is None or not boxed.strip():
                raise BadRow("no field 'answer' and field 'solution' has no non-empty \\boxed{}")
            answer = boxed.strip()
        else:
            raise BadRow(f"missing field 'answer' (expected keys {expected})")
        meta: dict[str, Any] = {"row": row_no}
        for key in ("subject", "level", "unique_id"):
            if isinstance(row.get(key), (str, int, float)) and not isinstance(row.get(key), bool):
                meta[key] = row[key]
        return Problem.create("math", problem, answer, "math", meta)

    if path is None:
        rows, label = hub_rows(hub_id, hub_config, split), f"{hub_id} split {split}"
    else:
        rows, label = jsonl_rows(path), os.fspath(path)
    return collect(rows, to_problem, label, skip_malformed, limit)
