"""The base's pass@k on the validation problems: the ceiling no key's reward passes (science §11.2).

RL sharpens what the base samples, so a key's validation avg@k at any budget stays below the share of validation
problems the base solves in k samples for large k. Unbiased from the profile's samples (Chen et al. 2021): with
``n`` samples of a problem, ``c`` of them correct, ``pass@k = 1 - C(n - c, k) / C(n, k)``, averaged over the
problems. An upper bound and a prior for the ceiling, never its value.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

__all__ = ["pass_at_k", "validation_ceiling"]


def pass_at_k(n: np.ndarray, c: np.ndarray, k: int) -> float:
    """Mean over problems of the unbiased pass@k from ``n`` samples with ``c`` correct (each ``n >= k``)."""
    n, c = np.asarray(n, int), np.asarray(c, int)
    if n.size == 0:
        return math.nan
    if k < 1 or (n < k).any():
        raise ValueError(f"pass@k: expected 1 <= k <= every problem's samples ({int(n.min())}), got k = {k}")
    # 1 - prod_{i = n - c + 1}^{n} (1 - k / i), the numerically stable form of the binomial ratio
    out = np.empty(n.size)
    for j, (ni, ci) in enumerate(zip(n, c, strict=True)):
        out[j] = 1.0 if ni - ci < k else 1.0 - float(np.prod(1.0 - k / np.arange(ni - ci + 1, ni + 1)))
    return float(out.mean())


def validation_ceiling(profile: pd.DataFrame) -> float:
    """pass@k of the profile rows given (the validation problems), k the fewest samples any of them had: the
    largest k every problem's samples support. NaN without rows."""
    for col in ("k", "n_correct"):
        if col not in profile.columns:
            raise ValueError(f"profile: missing column {col!r} (has {list(profile.columns)})")
    if profile.empty:
        return math.nan
    k = int(profile["k"].min())
    return pass_at_k(profile["k"].to_numpy(int), profile["n_correct"].to_numpy(int), k)
