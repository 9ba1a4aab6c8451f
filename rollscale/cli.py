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

    study = load_params(params)  # fail on bad config before any work or Prefect start-up
    import torch

    torch.set_num_threads(study.torch_threads)
    import importlib

    module = importlib.import_module(f"flows.{stage}")
    getattr(module, f"{stage}_flow")(params_path=params, artifacts=artifacts)


def print_query(sql: str, artifacts: str) -> None:
    import pandas as pd

    from rollscale.storage import query

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
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    for noisy in ("httpx", "httpcore", "prefect", "uvicorn", "alembic", "docket", "fakeredis"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    from rollscale.config import ParamsError

    try:
        if args.command == "run":
            run_stage(args.stage, args.params, args.artifacts)
        elif args.command == "sql":
            print_query(args.query, args.artifacts)
        elif args.command == "tables":
            from rollscale.storage import TABLES, available_tables

            have = available_tables(args.artifacts)
            for name, pattern in TABLES.items():
                print(f"{name:18s} {'ready  ' if name in have else 'missing'}  {Path(args.artifacts) / pattern}")
        elif args.command == "check":
            from rollscale.config import load_params

            print(load_params(args.params).model_dump_json(indent=2))
    except (ParamsError, LookupError, FileNotFoundError) as err:
        print(f"rollscale: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
