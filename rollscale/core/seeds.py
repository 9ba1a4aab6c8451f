"""Seeds derived from key parts, so a resumed run samples exactly what the straight run
would (science §1): every random draw of a study is keyed by what it is for
(run seed, purpose, step, call, prompt, sample), never by a generator's history.

numpy's SeedSequence hashes the parts, so neighbouring keys give unrelated
streams (``seed + 1`` would collide across steps and prompts).
"""

from __future__ import annotations

from typing import Literal

import numpy as np

__all__ = ["derive_seed", "seeded_rng"]

_U64 = 0xFFFFFFFFFFFFFFFF


def _sequence(parts: tuple[int, ...]) -> np.random.SeedSequence:
    return np.random.SeedSequence([int(p) & _U64 for p in parts])


def derive_seed(*parts: int, bits: Literal[32, 63] = 63) -> int:
    """An integer seed from integer key parts.

    ``bits=63``: a non-negative int64, what every engine's per-request seed
    accepts. ``bits=32``: the first 32-bit word of the same hash, the trainer's
    step and call seeds since the first study (kept so a study repeats its numbers).
    """
    words = _sequence(parts).generate_state(2)  # two uint32 words, low word first
    if bits == 32:
        return int(words[0])
    if bits == 63:
        return (int(words[1]) << 32 | int(words[0])) >> 1
    raise ValueError(f"bits: expected 32 or 63, got {bits!r}")


def seeded_rng(*parts: int) -> np.random.Generator:
    """A numpy Generator seeded by the key parts themselves (no integer seed in between)."""
    return np.random.default_rng(_sequence(parts))
