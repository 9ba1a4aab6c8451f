"""Test fixtures built once per session and shared by the pytest-xdist workers."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def built_once(tmp_path_factory, name: str, build) -> Path:
    """``build(folder)`` once per test session, by whichever pytest-xdist worker asks first (the others
    wait on a file lock and reuse it): a study built by every worker cost 46 s more per worker. Treat it
    as read-only: copy it before changing anything."""
    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # the session's folder
    root, done = shared / name, shared / f"{name}.built"
    with FileLock(str(shared / f"{name}.lock")):
        if not done.exists():
            shutil.rmtree(root, ignore_errors=True)
            root.mkdir()
            build(root)
            done.touch()
    return root
