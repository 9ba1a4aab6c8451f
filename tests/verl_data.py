"""A small problem table in verl's parquet layout, as a user's RL data comes: the prompt as chat
messages, the gold answer in ``reward_model.ground_truth``, ``data_source`` and ``ability``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd


def write_verl_table(path: Path, rows: int = 300, seed: int = 0, max_terms: int = 3, max_term: int = 29,
                     ask: str = "Give the final number.", signs: tuple[str, ...] = ("+", "-")) -> Path:
    """``rows`` sums of 2 to ``max_terms`` terms of 1 to ``max_term`` ("What is 12 + 7 - 5?"),
    gold as a string (verl stores ground truths as strings)."""
    rng = np.random.default_rng(seed)
    records = []
    for i in range(rows):
        terms = rng.integers(1, max_term + 1, size=int(rng.integers(2, max_terms + 1))).tolist()
        ops = rng.choice(list(signs), size=len(terms) - 1).tolist()
        text = str(terms[0]) + "".join(f" {s} {t}" for s, t in zip(ops, terms[1:]))
        value = terms[0] + sum(t if s == "+" else -t for s, t in zip(ops, terms[1:]))
        records.append({
            "data_source": "arith",
            "prompt": [{"role": "user", "content": f"What is {text}? {ask}"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(value)},
            "extra_info": {"split": "train", "index": i},
        })
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(records).to_parquet(path)
    return path
