"""The ``rollscale`` command: run a stage, query the study's tables."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

STAGES = ("base", "profile", "bucket", "measure", "sweep", "fit", "report")


def _prefect_env() -> None:
    # set before Prefect is imported: no telemetry, quiet, no server needed
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")


def run_stage(stage: str, params: str, artifacts: str) -> None:
    _prefect_env()
    from rollscale.config import load_params
    from rollscale.pipeline.status import stage_run

    study = load_params(params)  # fail on bad config before any work or Prefect start-up
    # the stage's lock is its first write: a stage already running or an unwritable
    # artifacts folder fails here, before any work; success records its fingerprint
    with stage_run(stage, study, artifacts):
        import torch

        torch.set_num_threads(study.torch_threads)
        import importlib

        module = importlib.import_module(f"flows.{stage}")
        getattr(module, f"{stage}_flow")(params_path=params, artifacts=artifacts)


def run_study(params: str, artifacts: str, stages: list[str] | None, force: bool) -> None:
    _prefect_env()
    from rollscale.config import load_params

    load_params(params)  # fail on bad config before Prefect start-up
    from flows.study import study_flow

    study_flow(params_path=params, artifacts=artifacts, stages=stages, force=force)


def print_status(params: str, artifacts: str, as_json: bool) -> None:
    from rollscale.config import load_params
    from rollscale.pipeline.status import format_status, study_status

    status = study_status(load_params(params), artifacts)
    print(status.to_json() if as_json else format_status(status))


def serve(params: str, artifacts: str) -> None:
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "INFO")  # show the runs the server starts
    _prefect_env()
    from flows.study import serve_study

    serve_study(params, artifacts)


def print_query(sql: str, artifacts: str) -> None:
    import pandas as pd

    from rollscale.pipeline.storage import query

    df = query(sql, artifacts)
    with pd.option_context("display.max_rows", 200, "display.max_columns", 50, "display.width", 200):
        print(df.to_string(index=False) if len(df) else f"(no rows; columns: {', '.join(df.columns)})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rollscale", description=__doc__)
    parser.add_argument("--artifacts", default="artifacts", help="artifacts folder (default: artifacts)")
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run", help="run one stage of the study as a Prefect flow")
    p_run.add_argument("stage", choices=STAGES)
    p_run.add_argument("--params", default="params.yaml")
    p_sql = sub.add_parser("sql", help="run a DuckDB SQL query over the study's tables and print the result")
    p_sql.add_argument("query")
    sub.add_parser("tables", help="list the tables that exist now")
    p_check = sub.add_parser("check", help="validate params.yaml and print the resolved parameters")
    p_check.add_argument("--params", default="params.yaml")
    p_study = sub.add_parser("study", help="run the whole study (or --stages), skipping stages that did not change")
    p_study.add_argument("--params", default="params.yaml")
    p_study.add_argument("--stages", type=lambda v: [s for s in v.split(",") if s], default=None,
                         help="comma-separated stages to run, in study order (default: all)")
    p_study.add_argument("--force", action="store_true", help="recompute the stages even when unchanged")
    p_status = sub.add_parser("status", help="which stages are done, stale or running, and each sweep run's progress")
    p_status.add_argument("--params", default="params.yaml")
    p_status.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p_serve = sub.add_parser("serve", help="serve the study as a Prefect deployment on params.schedule's cron")
    p_serve.add_argument("--params", default="params.yaml")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    for noisy in ("httpx", "httpcore", "prefect", "uvicorn", "alembic", "docket", "fakeredis"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    import duckdb

    from rollscale.config import ParamsError
    from rollscale.pipeline.status import StageBusyError

    try:
        if args.command == "run":
            run_stage(args.stage, args.params, args.artifacts)
        elif args.command == "sql":
            print_query(args.query, args.artifacts)
        elif args.command == "tables":
            from rollscale.pipeline.storage import TABLES, available_tables

            have = available_tables(args.artifacts)
            for name, pattern in TABLES.items():
                print(f"{name:18s} {'ready  ' if name in have else 'missing'}  {Path(args.artifacts) / pattern}")
        elif args.command == "check":
            from rollscale.config import load_params

            print(load_params(args.params).model_dump_json(indent=2))
        elif args.command == "study":
            run_study(args.params, args.artifacts, args.stages, args.force)
        elif args.command == "status":
            print_status(args.params, args.artifacts, args.json)
        elif args.command == "serve":
            serve(args.params, args.artifacts)
    except (ParamsError, LookupError, FileNotFoundError, duckdb.Error) as err:
        print(f"rollscale: {err}", file=sys.stderr)
        return 2
    except (StageBusyError, OSError) as err:
        # a stage already running, an unwritable or full artifacts folder: the message says which
        print(f"rollscale: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
