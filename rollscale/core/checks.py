"""Small argument checks shared by the science modules."""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def is_int(value: Any) -> bool:
    """An integer (Python or NumPy), but not a bool (``True`` is an int to Python, never a count here)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def is_finite_number(value: Any) -> bool:
    """A finite int or float (Python or NumPy), but not a bool."""
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool) \
        and math.isfinite(value)
