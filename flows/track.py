"""``rollscale track``: a production run read as it trains, against the study's forecast (not a DVC stage).

A tick reads the run's logs as they are now (TensorBoard event files, an MLflow run, verl's JSONL file),
takes its reward at each step to rollouts C = step x B_problem x n of the exported run, and sets it
against the study's band at that C (science §9.3: the decision key's curve with its t-interval), up to
C*. It appends what is new to the ``production`` table, draws the page, and flags the run when it has
been below the band at K evaluations in a row, with the study's settings against the run's. A tick that
finds nothing new writes nothing; a run resumed from a checkpoint replaces its points, never doubles them.
Without ``--serve``: one tick. With it: a Prefect deployment ticking every ``track.every`` seconds or on
``track.cron``. Started by ``rollscale track`` as ``python -m flows.track [flags]``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from prefect import flow

from rollscale.config import TrackParams
from rollscale.integrations.track.tick import track_settings
from tasks.common import read_params
from tasks.track import read_run_log, study_tables, tick, write_tick


@flow(name="track")
def track_flow(params_path: str = "params.yaml", artifacts: str = "artifacts", settings: dict | None = None) -> list[str]:
    """One tick: the run's logs now, the study's band, the new points and the page (module docstring)."""
    params = read_params(params_path)
    track = TrackParams.model_validate(settings or params.track.model_dump())
    log = read_run_log(track.logs, track.format)
    if isinstance(log, str):  # the run has not logged yet: nothing to write
        print(log, flush=True)
        return [log]
    root = Path(artifacts)
    decision, evals = study_tables(root, params)
    done = tick(params, track, decision, evals, log, root, log.source)
    for line in done.warnings:
        print(f"rollscale track: warning: {line}", file=sys.stderr, flush=True)
    written = write_tick(done, root)
    lines = done.lines + [f"track: wrote {p}" for p in written]
    print("\n".join(lines), flush=True)
    return lines


def serve_track(params_path: str, artifacts: str, track: TrackParams) -> None:
    """Serve :func:`track_flow` as a Prefect deployment ticking on ``track.cron`` or every ``track.every`` s."""
    import importlib

    from prefect.types.entrypoint import EntrypointType

    when = f"cron {track.cron!r}" if track.cron else f"every {track.every} s"
    print(f"track: deployment track/{track.deployment}, {when}, reading {track.logs} ({track.format}); a tick "
          f"now: `prefect deployment run 'track/{track.deployment}'`", flush=True)
    # the flow of the module flows.track (not __main__'s): each run's process loads it by module path
    served = importlib.import_module("flows.track").track_flow
    served.serve(name=track.deployment, cron=track.cron, interval=None if track.cron else track.every,
                 parameters={"params_path": str(Path(params_path).resolve()), "artifacts": str(Path(artifacts).resolve()),
                             "settings": track.model_dump()},
                 description="A production run against the rollscale study's forecast", tags=["rollscale"],
                 entrypoint_type=EntrypointType.MODULE_PATH, print_starting_message=False,
                 limit=1)  # one tick at a time: a late tick waits for the one before it, never overlaps it


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rollscale track", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--params", default="params.yaml")
    p.add_argument("--artifacts", default="artifacts")
    p.add_argument("--logs", help="the run's logs: TRL's output folder, an MLflow folder or URI[#RUN_ID], verl's JSONL")
    p.add_argument("--format", choices=["tensorboard", "mlflow", "verl-jsonl"], default=None)
    p.add_argument("--metric", action="append", default=None, help="the reward's name in the log (repeatable)")
    p.add_argument("--patience", type=int, default=None, help="K: evaluations in a row below the band to flag")
    p.add_argument("--every", type=int, default=None, help="seconds between the served deployment's ticks")
    p.add_argument("--cron", default=None, help="a cron schedule instead of --every")
    p.add_argument("--key", type=int, default=None, help="the decision's key the run was exported from")
    p.add_argument("--rule", default=None, help="the rule whose decision the run was exported from")
    p.add_argument("--serve", action="store_true", help="serve a Prefect deployment on the schedule (else one tick)")
    p.add_argument("--debug", action="store_true")
    return p


def settings_of(args: argparse.Namespace) -> TrackParams:
    """params.yaml's track section with the flags over it (the CLI checks it before it starts this process)."""
    params = read_params(args.params)
    return track_settings(params.track, {"logs": args.logs, "format": args.format, "metrics": args.metric,
                                         "patience": args.patience, "every": args.every, "cron": args.cron,
                                         "key": args.key, "rule": args.rule})


def main(argv: list[str] | None = None) -> int:
    from flows.__main__ import setup
    from rollscale.pipeline.errors import debug_enabled, run_guarded
    from rollscale.pipeline.runtime.server import prefect_api
    from rollscale.pipeline.runtime.workers import quiet_prefect

    args = parser().parse_args(argv)
    debug = debug_enabled(args.debug)
    setup(debug)
    quiet_prefect(debug)

    def go() -> None:
        track = settings_of(args)
        if args.serve and not os.environ.get("PREFECT_API_URL"):
            # the temporary server a command starts for itself runs none of Prefect's services: no tick would start
            raise EnvironmentError("--serve needs a Prefect server whose scheduler starts the ticks: run `prefect "
                                   "server start` and set PREFECT_API_URL=http://127.0.0.1:4200/api (or tick "
                                   "without --serve, e.g. from cron)")
        with prefect_api():
            if args.serve:
                serve_track(args.params, args.artifacts, track)
            else:
                track_flow(params_path=args.params, artifacts=args.artifacts, settings=track.model_dump())

    return run_guarded(go, debug, prog="rollscale track")


if __name__ == "__main__":
    sys.exit(main())
