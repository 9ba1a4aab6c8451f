"""The ``rollscale`` command: run a stage or the study, see where it stands, query its tables.

Stages run as their own process, ``python -m flows <stage>`` in the project
folder (the library never imports flows/ or tasks/). Errors print one or two
lines; ``--debug`` (or ``ROLLSCALE_DEBUG=1``) shows the traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from pathlib import Path

from rollscale.pipeline.commands import SQL_LIMIT, print_export, print_query, print_tables, track
from rollscale.pipeline.errors import DEBUG_ENV, debug_enabled, run_guarded

ARCHIVE_HELP = ("sweep: move ended runs that the grid no longer has (or whose config changed) to "
                "artifacts/sweep/archive/; without it the sweep refuses and names them")


def spawn_flows(args: list[str], debug: bool, module: str = "flows", archive_stale: bool = False,
                command: str = "") -> int:
    """``python -m MODULE ARGS`` in the project folder; its exit status (it prints its own errors).
    Ctrl-C and SIGTERM are passed on to it, and it says what it kept (``command`` is how a person
    started it: the stage record keeps it, and an interrupted stage tells to run it again)."""
    from rollscale.pipeline.interrupts import run_forwarding
    from rollscale.pipeline.init.project import refresh_code_stamps
    from rollscale.pipeline.stages.record import COMMAND_ENV
    from rollscale.pipeline.stages.specs import ARCHIVE_STALE_ENV, project_root

    root = project_root()
    refresh_code_stamps(root)  # a user's study folder: DVC compares the installed code's stamps
    env = {**os.environ, **({DEBUG_ENV: "1"} if debug else {}), **({ARCHIVE_STALE_ENV: "1"} if archive_stale else {}),
           **({COMMAND_ENV: command} if command else {})}
    # the project folder first on the path: a clone's flows/ and tasks/ run from there (a study
    # folder of the user's own has none: the installed ones run)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH")) if p)
    return run_forwarding([sys.executable, "-m", module, *args], cwd=root, env=env)


def typed(args: argparse.Namespace, *words: str) -> str:
    """The command line a person typed, without the options left at their defaults."""
    out = ["rollscale", *(["--artifacts", args.artifacts] if args.artifacts != "artifacts" else []), *words]
    if getattr(args, "params", "params.yaml") != "params.yaml":
        out += ["--params", args.params]
    return " ".join(out)


def print_status(artifacts: str, as_json: bool) -> None:
    from rollscale.pipeline.init.project import refresh_code_stamps
    from rollscale.pipeline.stages.specs import project_root
    from rollscale.pipeline.stages.status import format_status, study_status

    root = project_root()
    refuse_params_bomb(root / "params.yaml")  # DVC's status would expand its aliases for minutes
    refresh_code_stamps(root)  # "stale" after an upgrade of rollscale, as `study` will find it
    status = study_status(artifacts=artifacts)
    print(status.to_json() if as_json else format_status(status))


def refuse_params_bomb(path: Path) -> None:
    """ValueError naming ``path`` when its aliases expand past what a params file may hold
    (:func:`rollscale.config.checks.alias_problem`); nothing when it is fine, or cannot be read (its readers say)."""
    from rollscale.config.checks import alias_problem

    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, ValueError):
        return
    if problem := alias_problem(text):
        raise ValueError(f"{path.name}: {problem}")


def study_artifacts(params: str, artifacts: str) -> str:
    """The artifacts folder of the study ``params`` belong to: ``--artifacts`` when given; else that of the
    study folder holding them (dvc.yaml there or above; else their own folder), so that `rollscale check
    --params other/params.yaml` reads and stores other's calibration and profile, not the current folder's."""
    if artifacts != "artifacts" or not Path(params).is_file():
        return artifacts
    from rollscale.pipeline.stages.specs import project_root

    here = Path(params).resolve().parent
    try:
        root = project_root(here)
    except FileNotFoundError:
        root = here
    return artifacts if root == Path.cwd().resolve() else str(root / "artifacts")


def print_check(params_path: str, artifacts: str, resolved: bool, to_stderr: bool = False,
                calibrate: bool = True) -> bool:
    """Validate params and print whether the study can answer (rollscale.pipeline.check.findings); True when
    it found no error. With no error, each stage's time on this machine: from the stored calibration,
    or (``calibrate``) one measured now (:mod:`rollscale.pipeline.check.timing`)."""
    from rollscale.config import load_params
    from rollscale.pipeline.check.findings import Finding, format_findings, known_data, study_findings
    from rollscale.pipeline.check.greedy import greedy_findings
    from rollscale.pipeline.check.profile import noise_findings
    from rollscale.pipeline.check.calibration import estimate_findings

    params = load_params(params_path)
    if resolved:
        print(params.model_dump_json(indent=2))
    known = known_data(params, artifacts)
    findings = study_findings(params, known) + [Finding(*f) for f in noise_findings(artifacts, params)
                                                + greedy_findings(params, artifacts)]
    if not any(f.level == "error" for f in findings):  # a study that cannot run has no time to tell
        findings += [Finding(*f) for f in estimate_findings(params, artifacts, known.pool_size, known.profile,
                                                            calibrate, done_stages(artifacts))]
    findings = sorted(findings, key=lambda f: ("error", "warning", "note").index(f.level))
    print(format_findings(findings, params_path), file=sys.stderr if to_stderr else sys.stdout)
    return not any(f.level == "error" for f in findings)


def done_stages(artifacts: str) -> frozenset[str]:
    """The stages up to date with dvc.lock (`rollscale status`'s "done"): the check's time leaves them out;
    none outside a study folder, or while DVC is busy."""
    from rollscale.pipeline.stages.status import stage_statuses

    try:
        return frozenset(s.stage for s in stage_statuses(None, artifacts) if s.state == "done")
    except (FileNotFoundError, ValueError):
        return frozenset()


def check_stage(stage: str) -> None:
    """``stage`` must be a stage of the project's dvc.yaml (the one list of stages)."""
    from rollscale.pipeline.stages.specs import load_stage_specs, select_stages

    select_stages(load_stage_specs(), [stage])


def no_study_no_params(params: str) -> bool:
    """Whether a study folder is here (or above); with neither one nor ``params``, raise the one line
    that says to run `rollscale init` (with params, their own errors come first)."""
    from rollscale.pipeline.stages.specs import project_root

    try:
        project_root()
    except FileNotFoundError:
        if not Path(params).exists():
            raise
        return False
    return True


def refuse_running_stages(artifacts: str, stages: str | None, params: str = "params.yaml") -> None:
    """Raise the one-line refusal when a stage the study would run is running now. Outside a study
    folder: with no params either, the one line that says to run `rollscale init`; with params, the
    check still reports and the study stops after it, naming the missing dvc.yaml."""
    from rollscale.pipeline.stages.specs import busy_error, load_stage_specs, select_stages, stage_running

    if not no_study_no_params(params):
        return
    chosen = [s.strip() for s in stages.split(",") if s.strip()] if stages else None
    for stage in select_stages(load_stage_specs(), chosen):
        if stage_running(artifacts, stage):
            raise busy_error(stage, artifacts)


def project_root_or_init() -> None:
    """Raise the one line that says to run `rollscale init` outside a study folder."""
    from rollscale.pipeline.stages.specs import project_root

    project_root()


def deps(write: bool) -> int:
    """Compare dvc.yaml's code deps with the computed ones: 0 up to date (or written), 1 stale.
    In a study folder of the user's own (no flows/ of its own) the deps are stamps of the
    installed code: they are refreshed."""
    from rollscale.files import write_text_atomic
    from rollscale.pipeline.init.project import is_user_project, write_code_stamps
    from rollscale.pipeline.stages.deps import PROJECT_TEMPLATE, deps_diff, render_dvc_yaml, render_project_template
    from rollscale.pipeline.stages.specs import project_root

    root = project_root()
    if is_user_project(root):
        changed = write_code_stamps(root)
        print(f"dvc.yaml: every stage watches a stamp of the installed code it runs ({len(changed)} changed)")
        return 0
    diff = deps_diff(root)
    if not diff:
        print("dvc.yaml: every stage's deps list the code it runs")
        return 0
    if write:
        write_text_atomic(render_dvc_yaml(root), root / "dvc.yaml")
        if PROJECT_TEMPLATE.is_relative_to(root):
            write_text_atomic(render_project_template(root), PROJECT_TEMPLATE)
        print(diff + "dvc.yaml: deps rewritten")
        return 0
    print(diff + "dvc.yaml: deps are stale; `rollscale deps --write` rewrites them")
    return 1


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rollscale", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--artifacts", default="artifacts", help="artifacts folder (default: artifacts)")
    p.add_argument("--debug", action="store_true", help=f"show tracebacks (or set {DEBUG_ENV}=1)")
    sub = p.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run", help="run one stage's flow (dvc repro <stage> also records it in dvc.lock)")
    p_run.add_argument("stage", help="a stage of dvc.yaml")
    p_run.add_argument("--params", default="params.yaml")
    p_run.add_argument("--archive-stale", action="store_true", help=ARCHIVE_HELP)
    p_sql = sub.add_parser("sql", help="run a read-only DuckDB SQL query over the study's tables")
    p_sql.add_argument("query")
    p_sql.add_argument("--timeout", type=float, default=None,
                       help="stop the query after this many seconds (default: query.timeout_s in params.yaml, 60)")
    p_sql.add_argument("--params", default="params.yaml")
    p_sql.add_argument("--limit", type=int, default=SQL_LIMIT,
                       help=f"print at most this many rows (default {SQL_LIMIT:,}; a note says how many were cut)")
    p_sql.add_argument("--output", default=None, help="write every row to this .parquet file instead of printing")
    sub.add_parser("tables", help="list the tables that exist now")
    p_check = sub.add_parser("check", help="validate params.yaml and say whether the study can answer")
    p_check.add_argument("--params", default="params.yaml")
    p_check.add_argument("--resolved", action="store_true", help="also print every resolved value")
    p_init = sub.add_parser("init", help="write a params.yaml for your model and data (then `rollscale check`)")
    p_init.add_argument("--model", required=True, help="a model folder, a .gguf file, a hub id, or smollm2")
    p_init.add_argument("--data", required=True, help="a .jsonl/.json/.parquet/.csv file or a hub dataset id")
    p_init.add_argument("--gpu", default="none", help="H100, A100, ..., a memory such as 40GB, or none (CPU)")
    p_init.add_argument("--gpus", type=int, default=1,
                        help="GPUs of one node: a run is sharded over them (FSDP2) when only so full fine-tuning fits")
    p_init.add_argument("--engine", choices=["hf", "vllm"], default=None,
                        help="the sampler: hf (transformers generate) or vllm (default: vllm on a GPU, hf on CPU)")
    p_init.add_argument("--budget", type=int, default=None,
                        help="rollouts of your production run: the study decides at this C* (study.target_budget) "
                             "and trains to at least C* / eta")
    p_init.add_argument("--hours", type=float, default=None,
                        help="the hours the study may take on this machine: init measures its throughput (seconds; "
                             "a real model's load) and shrinks pool, lengths, k, c_max, seeds and keys to fit, "
                             "saying what it gave up")
    p_init.add_argument("--pilot", type=int, default=None, metavar="N",
                        help="problems of init's pilot profile, which sizes the used bucket on CPU (default 32, "
                             "stopped after about a minute; 0: no pilot, the default study's share of Easy assumed)")
    p_init.add_argument("--out", default="params.yaml")
    p_init.add_argument("--force", action="store_true", help="overwrite an existing --out file, and write a study "
                        "estimated past 10x the time asked (--hours, or 12 h with --budget alone)")
    p_study = sub.add_parser("study", help="run the stages DVC finds stale (all, or --stages), as one Prefect flow")
    p_study.add_argument("--params", default="params.yaml")
    p_study.add_argument("--stages", default="", help="comma-separated stages to run, in study order (default: all)")
    p_study.add_argument("--force", action="store_true", help="recompute the stages even when unchanged")
    p_study.add_argument("--no-check", action="store_true",
                         help="run even where `rollscale check` finds errors (a pilot not meant to answer)")
    p_study.add_argument("--archive-stale", action="store_true", help=ARCHIVE_HELP)
    p_status = sub.add_parser("status", help="which stages are done, stale or running, and each sweep run's progress")
    p_status.add_argument("--json", action="store_true", help="print JSON instead of tables")
    sub.add_parser("serve", help="serve the study as a Prefect deployment on params.schedule's cron") \
        .add_argument("--params", default="params.yaml")
    p_export = sub.add_parser("export", help="write the decision at C* (or --key) as a TRL GRPOConfig or verl overrides")
    p_export.add_argument("--to", required=True, help="trl or verl")
    p_export.add_argument("--key", type=int, default=None, help="another key of the decision than its leader")
    p_export.add_argument("--rule", default=None, help="the rule whose decision to export (default: the best leader's)")
    p_export.add_argument("--output", default=None, help="file to write (default: export/trl_grpo.yaml, export/verl_overrides.sh)")
    p_export.add_argument("--params", default="params.yaml")
    p_export.add_argument("--budget", type=int, default=None,
                          help="the production run's rollouts (default: study.target_budget where params.yaml sets it)")
    p_export.add_argument("--force", action="store_true",
                          help="write the files although the study's verdict is not an answer (the reason at their top)")
    # its flags are flows/track.py's (`rollscale track --help`), passed on as they are
    sub.add_parser("track", add_help=False, help="track a production run's logs against the study's forecast band "
                   "(--logs DIR [--format tensorboard|mlflow|verl-jsonl] [--metric NAME] [--every S | --cron C] [--serve])")
    p_deps = sub.add_parser("deps", help="check dvc.yaml's code deps against the code each stage imports (exit 1: stale)")
    p_deps.add_argument("--write", action="store_true", help="rewrite the deps in dvc.yaml")
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        return command(argv)
    except KeyboardInterrupt:  # Ctrl-C before a stage started (a running one is stopped by its own process)
        print("rollscale: interrupted before anything ran", file=sys.stderr)
        return 130


def hold_study(held: contextlib.ExitStack, artifacts: str, command: str, debug: bool) -> int:
    """Take the study folder's lock into ``held`` (:func:`rollscale.pipeline.stages.specs.study_lock`); the exit
    status of its one-line refusal when another `rollscale study` or `run` holds it, else 0. Outside a study
    folder with no artifacts folder yet nothing is made (the command's own error comes first)."""
    from rollscale.pipeline.stages.specs import study_lock

    if not Path(artifacts).is_dir() and not Path("dvc.yaml").is_file():
        return 0
    return run_guarded(lambda: held.enter_context(study_lock(artifacts, command)), debug)


def study(args: argparse.Namespace, debug: bool, flags: list[str]) -> int:
    """`rollscale study` under the folder's lock: the running stages and the check first, then the stages."""
    # a running stage refuses in one line before the check's report (flows/study.py refuses again per stage)
    if code := run_guarded(lambda: refuse_running_stages(args.artifacts, args.stages, args.params), debug):
        return code
    # the check first: a study that cannot work stops before its first stage spends anything
    ok: list[bool] = []
    # the time estimate from a stored calibration only (`rollscale check` measures one)
    if code := run_guarded(lambda: ok.append(print_check(args.params, args.artifacts, False, True, False)), debug):
        return code
    if not ok[0] and not args.no_check:
        print("rollscale study: stopped before any stage (run it anyway with --no-check)", file=sys.stderr)
        return 2
    if code := run_guarded(project_root_or_init, debug):
        return code
    stages = ["--stages", args.stages] if args.stages else []
    return spawn_flows(["study", "--params", args.params, *stages, *(["--force"] if args.force else []), *flags],
                       debug, "flows.study", archive_stale=args.archive_stale, command=typed(args, "study"))


def command(argv: list[str] | None = None) -> int:
    args, rest = parser().parse_known_args(argv)
    if rest and args.command != "track":
        args = parser().parse_args(argv)  # argparse's own error for an unknown flag
    debug = debug_enabled(args.debug)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    flags = ["--debug"] if debug else []
    if args.command == "run":
        from rollscale.config import load_params

        # bad params or a stage dvc.yaml lacks fail here, before a process and Prefect start
        if code := run_guarded(lambda: (no_study_no_params(args.params), load_params(args.params),
                                        check_stage(args.stage)), debug):
            return code
        with contextlib.ExitStack() as held:
            if code := hold_study(held, args.artifacts, typed(args, "run", args.stage), debug):
                return code
            return spawn_flows([args.stage, "--params", args.params, "--artifacts", args.artifacts, *flags], debug,
                               archive_stale=args.archive_stale, command=typed(args, "run", args.stage))
    if args.command == "study":
        if Path(args.artifacts).resolve() != Path("artifacts").resolve():
            print("rollscale study: runs the stages through DVC, whose outputs are the project's artifacts/ "
                  "(use `rollscale run <stage> --artifacts ...` for another folder)", file=sys.stderr)
            return 2
        with contextlib.ExitStack() as held:
            if code := hold_study(held, args.artifacts, typed(args, "study"), debug):
                return code
            return study(args, debug, flags)
    if args.command == "serve":
        return spawn_flows(["serve", "--params", args.params, *flags], debug, "flows.study", command=typed(args, "serve"))
    if args.command == "track":
        return track(rest, args.artifacts, debug)
    if args.command == "deps":
        result = {}
        return run_guarded(lambda: result.setdefault("code", deps(args.write)), debug) or result["code"]
    if args.command == "export":
        return run_guarded(lambda: print_export(args.to, args.params, args.artifacts, args.key, args.rule, args.output,
                                                args.budget, args.force), debug)
    if args.command == "sql":
        return run_guarded(lambda: print_query(args.query, args.artifacts, args.timeout, args.params, args.limit,
                                               args.output), debug)
    if args.command == "tables":
        return run_guarded(lambda: print_tables(args.artifacts), debug)
    if args.command == "check":
        ok = []
        code = run_guarded(lambda: ok.append(print_check(args.params, study_artifacts(args.params, args.artifacts),
                                                         args.resolved)), debug)
        return code or (0 if ok[0] else 2)
    if args.command == "init":
        from rollscale.pipeline.init.command import init_params

        return run_guarded(lambda: print(init_params(args.model, args.data, args.gpu, args.out, args.force,
                                                     args.engine, args.budget, args.gpus, args.hours,
                                                     args.pilot)), debug)
    return run_guarded(lambda: print_status(args.artifacts, args.json), debug)


if __name__ == "__main__":
    sys.exit(main())
