"""Start a stage's flow from the project folder:

    python -m flows <stage> [--params params.yaml] [--artifacts artifacts] [--debug]

``dvc.yaml``'s commands and ``rollscale run`` start stages this way (flows/ and
tasks/ are run by path, never installed as packages); the study and the served
deployment start from ``python -m flows.study``. Errors are printed as one or
two lines (:mod:`rollscale.pipeline.errors`).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

from rollscale.pipeline.errors import DEBUG_ENV, debug_enabled, run_guarded

EPHEMERAL_TIMEOUT_S = "180"  # Prefect's 20 s default fails on a busy machine
STARTUP_RETRIES = 1


def prefect_env(debug: bool) -> None:
    """Set before Prefect is imported: no telemetry, quiet, a generous server start-up time."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "INFO" if debug else "WARNING")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", EPHEMERAL_TIMEOUT_S)


def with_startup_retry(call):
    """Call again when Prefect's temporary server did not come up (nothing ran yet)."""
    for attempt in range(STARTUP_RETRIES + 1):
        try:
            return call()
        except RuntimeError as err:
            if "ephemeral Prefect API server" not in str(err) or attempt == STARTUP_RETRIES:
                raise
            print("flows: the Prefect server did not start in time; trying once more", file=sys.stderr)
            time.sleep(5)


def run_stage(stage: str, params: str, artifacts: str, debug: bool) -> None:
    import importlib

    from rollscale.config import load_params

    study = load_params(params)  # bad config fails before any work, and before Prefect is even imported
    from rollscale.pipeline.outputs import clear_outputs_manifest, write_outputs_manifest
    from rollscale.pipeline.stages import stage_lock
    from tasks.common import quiet_prefect

    with stage_lock(stage, artifacts):
        clear_outputs_manifest(artifacts, stage)  # the record describes a finished run's files only
        flow = getattr(importlib.import_module(f"flows.{stage}"), f"{stage}_flow")
        if "torch" in sys.modules:  # only the stages that use torch pay for importing it
            sys.modules["torch"].set_num_threads(study.torch_threads)
        quiet_prefect(debug)
        with_startup_retry(lambda: flow(params_path=params, artifacts=artifacts))
        write_outputs_manifest(artifacts, stage)


def setup(debug: bool) -> None:
    prefect_env(debug)
    if debug:  # worker processes inherit it (tasks.parallel forwards it)
        os.environ[DEBUG_ENV] = "1"
    # vLLM logs 60-90 INFO/WARNING lines per engine start (and a harmless traceback: its chat-template
    # warm-up fails without a tokenizer, which the engine does not need); read before vLLM is imported
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "INFO" if debug else "ERROR")
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    for noisy in ("httpx", "httpcore", "prefect", "uvicorn", "alembic", "docket", "fakeredis"):
        logging.getLogger(noisy).setLevel(logging.DEBUG if debug else logging.WARNING)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("stage", help="a stage of dvc.yaml")
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--artifacts", default="artifacts")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    args = parser.parse_args(argv)
    debug = debug_enabled(args.debug)
    setup(debug)

    def go() -> None:
        from rollscale.pipeline.stages import load_stage_specs

        if args.stage not in load_stage_specs():
            raise ValueError(f"unknown stage {args.stage!r} (dvc.yaml has: {', '.join(load_stage_specs())})")
        run_stage(args.stage, args.params, args.artifacts, debug)

    return run_guarded(go, debug, prog="rollscale")


if __name__ == "__main__":
    sys.exit(main())
