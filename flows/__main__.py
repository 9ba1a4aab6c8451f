"""Start a stage's flow from the project folder:

    python -m flows <stage> [--params params.yaml] [--artifacts artifacts] [--debug]

``dvc.yaml``'s commands and ``rollscale run`` start stages this way (a clone's own
flows/ and tasks/ come first on the path, else the installed ones); the study and the served
deployment start from ``python -m flows.study``. Errors are printed as one or
two lines (:mod:`rollscale.pipeline.errors`).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from pathlib import Path

from rollscale.files import write_json_atomic
from rollscale.pipeline.errors import DEBUG_ENV, debug_enabled, run_guarded

EPHEMERAL_TIMEOUT_S = "180"  # Prefect's 20 s default fails on a busy machine
# an interrupted stage without a kept_work of its own: its files are written atomically
GENERIC_KEPT = "every file it wrote is whole, nothing partial was kept"


def prefect_env(debug: bool) -> None:
    """Set before Prefect is imported: no telemetry, quiet, a generous server start-up time."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "INFO" if debug else "WARNING")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", EPHEMERAL_TIMEOUT_S)


def keep_our_signal_handlers(flow):
    """``flow`` with a hook that puts the interrupt handlers back once it runs: Prefect's flow
    engine installs its own SIGTERM handler, which a second SIGTERM would re-raise mid clean-up."""
    from rollscale.pipeline import interrupts

    return flow.with_options(on_running=[*flow.on_running_hooks, lambda *_: interrupts.reassert()])


def run_stage(stage: str, params: str, artifacts: str, debug: bool) -> None:
    import importlib

    from rollscale.config import load_params

    study = load_params(params)  # bad config fails before any work, and before Prefect is even imported
    from rollscale.pipeline.stages.outputs import input_damage, unrebuilt_damage, write_outputs_manifest
    from rollscale.pipeline.query.storage import DamagedResultError
    from rollscale.pipeline.stages.record import fingerprint, started_by, write_record
    from rollscale.pipeline.stages.specs import load_stage_specs, now, project_root, stage_lock, upstream
    from rollscale.pipeline.runtime.workers import quiet_prefect

    specs = load_stage_specs()
    read = upstream(specs[stage], specs)
    # what this run runs on, taken before its code is imported (rollscale.pipeline.stages.record)
    ran_on = fingerprint(project_root(), artifacts, params, specs[stage].deps, specs[stage].params, read)
    # the record of the last good outputs stays until this run finishes; what was damaged since it must be
    # rebuilt by this run, never recorded as it is
    left_damaged = unrebuilt_damage(artifacts, stage)
    with stage_lock(stage, artifacts) as info:
        # no answer from incomplete evidence: a run or table this stage reads must pass the checks `status`
        # makes (under the lock: a refusal is recorded, and said to a study; and again before the outputs are
        # recorded: nothing damaged meanwhile either)
        if damage := input_damage(artifacts, read):
            raise DamagedResultError(f"{stage}: {damage}")
        flow = getattr(importlib.import_module(f"flows.{stage}"), f"{stage}_flow")
        if "torch" in sys.modules:  # only the stages that use torch pay for importing it
            sys.modules["torch"].set_num_threads(study.torch_threads)
        quiet_prefect(debug)
        keep_our_signal_handlers(flow)(params_path=params, artifacts=artifacts)
        if damage := left_damaged():
            raise DamagedResultError(damage)
        if damage := input_damage(artifacts, read):
            raise DamagedResultError(f"{stage}: {damage}")
        write_outputs_manifest(artifacts, stage)
        write_record(Path(artifacts) / stage, stage, info, ran_on, now(), started_by(stage))


def setup(debug: bool) -> None:
    prefect_env(debug)
    if debug:  # worker processes inherit it (rollscale.pipeline.runtime.workers forwards it)
        os.environ[DEBUG_ENV] = "1"
    # vLLM logs 60-90 INFO/WARNING lines per engine start (and a harmless traceback: its chat-template
    # warm-up fails without a tokenizer, which the engine does not need); read before vLLM is imported
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "INFO" if debug else "ERROR")
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    for noisy in ("httpx", "httpcore", "prefect", "uvicorn", "alembic", "docket", "fakeredis"):
        logging.getLogger(noisy).setLevel(logging.DEBUG if debug else logging.WARNING)


def main(argv: list[str] | None = None) -> int:
    from rollscale.pipeline import interrupts

    parser = argparse.ArgumentParser(prog="python -m flows", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("stage", help="a stage of dvc.yaml")
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--artifacts", default="artifacts")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    args = parser.parse_args(argv)
    debug = debug_enabled(args.debug)

    def interrupted_line(signum: int) -> str:
        """What the stage kept (its flow module's ``kept_work``, when it has one) and how to go on."""
        from rollscale.pipeline.stages.record import resume_command

        kept_work = getattr(sys.modules.get(f"flows.{args.stage}"), "kept_work", None)
        try:
            kept = kept_work(Path(args.artifacts)) if kept_work else GENERIC_KEPT
        except (OSError, ValueError) as err:
            kept = f"what it kept could not be read ({err})"
        return interrupts.interrupted_line(args.stage, signum, kept, resume_command(args.stage))

    interrupts.install(interrupted_line)  # first: Ctrl-C during start-up ends it cleanly too
    setup(debug)

    def go() -> None:
        from rollscale.pipeline.stages.specs import load_stage_specs
        from rollscale.pipeline.runtime.server import prefect_api

        if args.stage not in load_stage_specs():
            raise ValueError(f"unknown stage {args.stage!r} (dvc.yaml has: {', '.join(load_stage_specs())})")
        with prefect_api():
            try:
                run_stage(args.stage, args.params, args.artifacts, debug)
            except KeyboardInterrupt as err:
                interrupts.say(interrupted_line(interrupts.signal_of(err)))
                raise

    def record_exit(message: str, code: int) -> None:
        """What the study that started this stage through DVC says (DVC reports any failure as exit 255)."""
        from rollscale.pipeline.stages.specs import STAGE_EXIT, now

        folder = Path(args.artifacts) / args.stage
        if folder.is_dir():
            with contextlib.suppress(OSError):
                write_json_atomic({"stage": args.stage, "message": message, "code": code, "at": now()},
                                  folder / STAGE_EXIT)

    code = run_guarded(go, debug, prog="rollscale", on_error=record_exit)
    if interrupts.received():  # do not wait for work still ending in a thread: nothing of it is committed
        interrupts.exit_now(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
