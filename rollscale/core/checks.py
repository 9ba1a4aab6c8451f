"""Small argument checks shared by the science modules."""

from __future__ import annotations

from typing import Any

import numpy as np


def is_int(value: Any) -> bool:
    """An integer (Python or NumPy), but not a bool (``True`` is an int to Python, never a count here)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)
