"""Problems with stable ids (science §2: the problems that are profiled, bucketed and
trained on).

A ``Problem``'s ``problem_id`` depends only on the source name and the prompt
text, so the same problem gets the same id in every run, table and split file.
The sources: :mod:`rollscale.core.problems.sets` (reasoning-gym, GSM8K, MATH) and
:mod:`rollscale.core.problems.sources` (a user's own tables), both reading rows
through :mod:`rollscale.core.problems.rows`.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from rollscale.core.problems.rewards import VERIFIERS, is_reward_name

logger = logging.getLogger("rollscale.core.problems.problem")

__all__ = ["DataRowError", "Problem", "compute_problem_id", "dedupe", "disjoint"]

_ID_HEX_CHARS = 16


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
            raise ValueError(f"Problem: reward must be one of {', '.join(VERIFIERS.names())} "
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


def disjoint(problems: Iterable[Problem], exclude: set[str]) -> list[Problem]:
    """The problems whose ids are not in ``exclude`` (e.g. keep training
    problems disjoint from validation ones, science §2), order kept."""
    if not isinstance(exclude, (set, frozenset)):
        raise ValueError(f"disjoint: exclude must be a set of problem ids, got {type(exclude).__name__}")
    return [p for p in problems if p.problem_id not in exclude]


def dedupe(problems: list[Problem], label: str) -> list[Problem]:
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
