"""Progress lines of a long stage (issue 32): at least every LOG_EVERY_S seconds, not only every 10 %,
and the rate of this session's work (a resumed stage's kept work is not counted as done this fast)."""

from __future__ import annotations

import logging

from rollscale.pipeline import progress


def test_progress_logs_every_minute_with_the_rate_of_this_sessions_work(monkeypatch, caplog):
    clock = {"t": 0.0}
    monkeypatch.setattr(progress.time, "perf_counter", lambda: clock["t"])
    monkeypatch.setattr(progress.sys.stderr, "isatty", lambda: False, raising=False)
    caplog.set_level(logging.INFO, logger="rollscale.pipeline.progress")
    with progress.Progress(1000, "profile", unit="problems", initial=500) as bar:
        caplog.clear()
        clock["t"] = 30.0
        bar.update(3)  # 0.3 % in 30 s: below 10 % and within the minute, no line
        assert caplog.records == []
        clock["t"] = 61.0
        bar.update(3)  # a minute since the last line: a line, whatever the share
        (line,) = [r.getMessage() for r in caplog.records]
    # 6 problems in 61 s this session (the 500 kept are not counted): 0.1/s, 494 to go
    assert line.startswith("profile: 506/1000 problems (0.1 problems/s, ETA 5022 s)")
