"""One ``ast.parse`` at a time in the process.

CPython 3.11's ``ast.parse`` keeps its recursion depth in state shared by every thread; when a garbage
collection inside one parse runs a finalizer that lets another thread parse, the first ends in "SystemError: AST
constructor recursion depth mismatch" (python/cpython gh-106905). Measured here, 3.11.7: four threads parsing a
400-line module beside cyclic garbage with finalizers hit it within 15 s; with this lock, not in 3 x 15 s (the
script: docs/journal/2026-11-29-pooled.md). A study's Prefect threads parse too (Prefect reads flow and task signatures,
pydantic attribute docstrings, this project's registries their folders): CI's Ctrl-C study failed on it once
(2026-11-29). :func:`serialize` wraps ``ast.parse`` in one lock for the whole process; ``rollscale/__init__``
calls it, so importing anything of the project installs it before a flow starts its threads.
"""

from __future__ import annotations

import ast
import functools
import threading
from typing import Any

__all__ = ["PARSE_LOCK", "serialize"]

PARSE_LOCK = threading.RLock()  # re-entrant: a parse may import a module whose import parses
_unlocked_parse = ast.parse  # the interpreter's own (the wrapper calls it by this name: tests time it)


def serialize() -> None:
    """Make ``ast.parse`` take :data:`PARSE_LOCK` (once; a second call leaves the wrapper as it is)."""
    if getattr(ast.parse, "__rollscale_serialized__", False):
        return

    @functools.wraps(_unlocked_parse)
    def locked(*args: Any, **kwargs: Any) -> Any:
        with PARSE_LOCK:
            return _unlocked_parse(*args, **kwargs)

    locked.__rollscale_serialized__ = True  # type: ignore[attr-defined]
    ast.parse = locked
