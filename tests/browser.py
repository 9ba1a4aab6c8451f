"""Headless Chromium for the pages' offline-rendering checks (tests/test_report.py, tests/test_track.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")


def chromium(args: list[str], user_dir: Path) -> subprocess.CompletedProcess[str]:
    """Chromium, headless and offline (no proxy reachable), on ``args`` (e.g. ``--dump-dom URL``)."""
    cmd = [
        str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        f"--user-data-dir={user_dir}", "--proxy-server=127.0.0.1:9", "--proxy-bypass-list=<-loopback>",
        "--enable-logging=stderr", "--v=0", "--virtual-time-budget=10000", *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=90, check=False)


def console_messages(stderr: str) -> list[str]:
    """Console output of the page (Chromium logs every console message as INFO:CONSOLE).

    The report page logs nothing when all is well: vega's warnings ("WARN ...") and a failed
    chart's console.error both count, as do uncaught exceptions.
    """
    return [line for line in stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
