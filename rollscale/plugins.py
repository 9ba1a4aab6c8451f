"""A user's own code named in params: ``"package.module:function"`` (a verifier, science §2).

A leaf module (it imports nothing from rollscale), so validating a params file
(:mod:`rollscale.config.data`) imports the user's function the same way the
library later calls it (:func:`rollscale.core.problems.rewards.reward_fn`): a typo fails
when the params are read, not mid-study.
"""

from __future__ import annotations

import importlib
import re
from typing import Any

__all__ = ["import_reference", "is_reference"]

_REFERENCE = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")


def is_reference(name: object) -> bool:
    """True for a ``module:function`` reference (not imported here)."""
    return isinstance(name, str) and _REFERENCE.fullmatch(name) is not None


def import_reference(name: str, what: str = "function") -> Any:
    """The callable that ``module:function`` names; a ValueError saying why it cannot be had."""
    if not is_reference(name):
        raise ValueError(f"expected a {what} as 'module:function', got {name!r}")
    module_name, attr = name.split(":")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"cannot import {what} {name!r} ({e})") from None
    if not callable(fn):
        raise ValueError(f"{what} {name!r} is not callable")
    return fn
