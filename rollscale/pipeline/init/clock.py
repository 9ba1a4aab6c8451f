"""init's own time: the budget of its measurements on this machine, and a progress line while they run.

`rollscale init` measures before it writes (a pilot profile, the throughput calibration, the learning-rate
probe). On a CPU one batch of a chat model's answers can take longer than a whole study's share of time, so the
budget is a stop time each measurement is given (:func:`rollscale.lm.engines.hf.generation_deadline` stops a
generation inside its batch), and a line names the step and its time left at least every
:data:`PROGRESS_EVERY_S` seconds, from a thread of its own (a batch prints nothing while it decodes).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

__all__ = ["CALIBRATION_SHARE", "DEFAULT_BUDGET_S", "PROGRESS_EVERY_S", "InitClock", "calibration_budget_s"]

CALIBRATION_SHARE = 0.05  # the share of --hours init's own measurements may take
DEFAULT_BUDGET_S = 180.0  # without --hours: 3 minutes
PROGRESS_EVERY_S = 15.0
TICK_SHARE = 0.8  # a line after 12 s without one: on a machine at load 14 the thread woke up to 1-2 s late


def calibration_budget_s(hours: float | None) -> float:
    """Seconds init may spend measuring: CALIBRATION_SHARE of ``hours``, or DEFAULT_BUDGET_S without them."""
    return CALIBRATION_SHARE * hours * 3600 if hours is not None else DEFAULT_BUDGET_S


class InitClock:
    """A stop time ``budget_s`` from now, shared by init's steps, and a progress line every ``every`` seconds
    naming the running step and its time left (to ``out``, stderr: stdout carries what init decided)."""

    def __init__(self, budget_s: float, every: float = PROGRESS_EVERY_S, out: TextIO | None = None):
        self.start = time.perf_counter()
        self.deadline = self.start + budget_s
        self.budget_s, self.every, self.out = budget_s, every, out
        self._step, self._step_end = "", self.deadline
        self._last = self.start
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def left(self) -> float:
        """Seconds to the stop time (0 past it)."""
        return max(0.0, self.deadline - time.perf_counter())

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def say(self, line: str) -> None:
        with self._lock:
            print(line, file=self.out or sys.stderr, flush=True)
            self._last = time.perf_counter()

    def _tick(self) -> None:
        while not self._stop.wait(min(1.0, self.every)):
            now = time.perf_counter()
            if self._step and now - self._last >= TICK_SHARE * self.every:  # slack for a busy machine's late wake
                left = max(0.0, self._step_end - now)
                self.say(f"init: {self._step}: {now - self.start:.0f} s into init's {self.budget_s:.0f} s of "
                         f"measuring, this step stops within {left:.0f} s")

    @contextmanager
    def step(self, name: str, seconds: float | None = None) -> Iterator[float]:
        """Run a step named ``name`` with progress lines; it yields its stop time (perf_counter), ``seconds`` from
        now or the clock's, whichever is sooner."""
        end = self.deadline if seconds is None else min(self.deadline, time.perf_counter() + seconds)
        self._step, self._step_end = name, end
        self.say(f"init: {name} (stops within {max(0.0, end - time.perf_counter()):.0f} s)")
        if self._thread is None:
            self._thread = threading.Thread(target=self._tick, name="init-progress", daemon=True)
            self._thread.start()
        try:
            yield end
        finally:
            self._step = ""

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
