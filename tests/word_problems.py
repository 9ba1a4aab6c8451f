"""One-digit arithmetic word problems of the project's own, in TRL's conversational JSONL layout (``prompt``:
chat messages, ``solution``: the number), as a new user's table (issue 43)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

NAMES = ("Ana", "Ben", "Cleo", "Dev", "Eli", "Fay", "Gus", "Hal")
THINGS = ("apples", "pens", "coins", "shells", "books", "cards")


def write_word_problems(path: Path, rows: int, seed: int = 0) -> Path:
    """``rows`` distinct problems "A has x things and gets (loses) y. How many now?" with x, y and the answer
    single digits, written as TRL conversational JSONL."""
    rng = np.random.default_rng(seed)
    seen, lines = set(), []
    while len(lines) < rows:
        name, thing = NAMES[rng.integers(len(NAMES))], THINGS[rng.integers(len(THINGS))]
        x, y, gets = int(rng.integers(1, 10)), int(rng.integers(1, 10)), bool(rng.integers(2))
        answer = x + y if gets else x - y
        if not 0 <= answer <= 9 or (name, thing, x, y, gets) in seen:
            continue
        seen.add((name, thing, x, y, gets))
        verb = f"gets {y} more" if gets else f"gives away {y}"
        text = f"{name} has {x} {thing} and {verb}. How many {thing} does {name} have now? Answer with the number."
        lines.append(json.dumps({"prompt": [{"role": "user", "content": text}], "solution": str(answer)}))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path
