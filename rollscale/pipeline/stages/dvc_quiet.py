"""``python -m rollscale.pipeline.stages.dvc_quiet ARGS``: DVC's command line (``dvc ARGS``) without the error it
adds when a stage it runs was stopped by a signal ("ERROR: failed to reproduce 'sweep': failed to run: python -m
flows sweep, exited with 130"): the stage has said in its own line what it kept, and Ctrl-C to ``rollscale study``
is that one line (tests/test_dvc.py). Whether DVC printed it raced with ``rollscale study`` ending DVC after the
signal (CI); a filter on DVC's command-line logger drops it whatever the timing. Any other error is
DVC's own, unchanged."""

from __future__ import annotations

import logging
import re
import sys

__all__ = ["SIGNALLED", "drops", "main"]

# a stage's exit status after SIGINT or SIGTERM, as DVC's StageCmdFailedError words it: 128 + 2 / 128 + 15 where the
# stage's shell reports it, -2 / -15 where DVC sees the stage's process killed by the signal itself (CI)
SIGNALLED = re.compile(r"exited with (130|143|-2|-15)$")


def drops(record: logging.LogRecord) -> bool:
    """Whether ``record`` is DVC's report of a stage a signal stopped (a ReproductionError caused by it)."""
    err = record.exc_info[1] if record.exc_info else None
    if err is None or type(err).__name__ != "ReproductionError":
        return False
    cause = err.__cause__
    return cause is not None and type(cause).__name__ == "StageCmdFailedError" and bool(SIGNALLED.search(str(cause)))


class _Signalled(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not drops(record)


def main(argv: list[str] | None = None) -> int:
    from dvc.cli import logger, main as dvc_main

    logger.addFilter(_Signalled())
    return dvc_main(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
