"""One ast.parse at a time in the process (rollscale/parsing.py): CPython 3.11's parse is not safe from two
threads at once, and a study's Prefect threads parse (CI's Ctrl-C study ended in "SystemError: AST constructor
recursion depth mismatch" on 2026-11-29)."""

from __future__ import annotations

import ast
import threading

import rollscale  # noqa: F401  (importing the project installs the lock)
from rollscale.parsing import PARSE_LOCK, serialize


def test_importing_the_project_makes_every_parse_take_one_lock():
    assert getattr(ast.parse, "__rollscale_serialized__", False)
    wrapped = ast.parse
    serialize()
    assert ast.parse is wrapped  # installed once, never wrapped twice
    done = threading.Event()

    def parse() -> None:
        ast.parse("x = [1, (2, {3: 4})]")
        done.set()

    with PARSE_LOCK:  # a parse in another thread waits for the lock ...
        worker = threading.Thread(target=parse, daemon=True)
        worker.start()
        assert not done.wait(0.3)
        assert isinstance(ast.parse("y = 1"), ast.Module)  # ... and this thread's own parse re-enters it
    assert done.wait(10)  # ... and runs once it is free
    worker.join(10)
