"""Progress that suits where output goes: a tqdm bar on a terminal, log lines elsewhere (CI, logs).

Each update is also where work running in a thread stops once the process got Ctrl-C or SIGTERM
(:mod:`rollscale.pipeline.interrupts`)."""

from __future__ import annotations

import logging
import sys
import time

from tqdm.auto import tqdm

from rollscale.pipeline.interrupts import check as stop_if_interrupted

log = logging.getLogger("rollscale.pipeline.progress")
LOG_EVERY_S = 60.0  # a long stage says where it is at least this often (at its next update), not only every 10 %


class Progress:
    """``update(n)`` advances; on a non-terminal it logs every 10% or :data:`LOG_EVERY_S` seconds,
    whichever comes first, with the rate of this session's work (not counting ``initial``, the
    work a resumed stage kept) and the ETA it gives."""

    def __init__(self, total: int, desc: str, unit: str = "it", initial: int = 0):
        self.total, self.desc, self.unit, self.done = total, desc, unit, initial
        self.start = self._last_log = time.perf_counter()
        self.initial = initial
        self.bar = tqdm(total=total, desc=desc, unit=unit, initial=initial) if sys.stderr.isatty() else None
        self._next_log = initial + max(total // 10, 1)
        if self.bar is None:
            log.info("%s: %d/%d %s", desc, initial, total, unit)

    def update(self, n: int = 1, **postfix) -> None:
        # where work in a thread (an in-process worker) stops after Ctrl-C or SIGTERM: between steps
        stop_if_interrupted()
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
            if postfix:
                self.bar.set_postfix(postfix)
        elif (self.done >= self._next_log or self.done >= self.total
              or time.perf_counter() - self._last_log >= LOG_EVERY_S):
            self._next_log = self.done + max(self.total // 10, 1)
            self._last_log = time.perf_counter()
            elapsed = self._last_log - self.start
            rate = (self.done - self.initial) / elapsed if elapsed > 0 else float("nan")
            eta = (self.total - self.done) / rate if rate and rate > 0 else float("nan")
            extra = " ".join(f"{k}={v}" for k, v in postfix.items())
            log.info("%s: %d/%d %s (%.1f %s/s, ETA %.0f s) %s", self.desc, self.done, self.total, self.unit, rate, self.unit, eta, extra)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
