"""The whole study as one flow: every stage of ``dvc.yaml`` in its order (base,
profile, bucket, measure, sweep, fit, report, and any stage added there).

DVC alone decides what reruns: each chosen stage is asked of ``dvc status``
and, when stale (or forced), reproduced by ``dvc repro --single-item``, which
runs the stage's own flow (``python -m flows <stage>``) and records it in
``dvc.lock``. So ``dvc repro``, ``rollscale study`` and the scheduled
deployment can never disagree about what is done. The stages started here
reuse this flow's Prefect API (no second server start-up). ``rollscale
serve`` serves this flow as a Prefect deployment on the cron schedule of
``params.schedule``. Started by ``rollscale study`` / ``rollscale serve`` as
``python -m flows.study [study|serve] [--params] [--stages a,b] [--force]``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from prefect import flow, task

from rollscale.config import load_params
from rollscale.pipeline.outputs import outputs_problem
from rollscale.pipeline.stages import dvc_changes, load_stage_specs, project_root, select_stages


def _api_url() -> str | None:
    """This process's Prefect API (the temporary server it started, or PREFECT_API_URL)."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return str(client.api_url)


def _first(reasons: list[str], stage: str, shown: int = 3) -> str:
    """A few of DVC's reasons (a fresh clone lists every dep of every stage as modified)."""
    more = len(reasons) - shown
    return "; ".join(reasons[:shown]) + (f"; and {more} more: `dvc status {stage}`" if more > 0 else "")


@task(name="reproduce-stage")
def reproduce(stage: str, root: str, force: bool) -> None:
    """``dvc repro --single-item <stage>`` in the project folder; raises if the stage failed."""
    env = dict(os.environ)
    url = _api_url()
    if url and url.startswith("http"):
        env["PREFECT_API_URL"] = url
    cmd = [sys.executable, "-m", "dvc", "repro", "--single-item", *(["--force"] if force else []), stage]
    done = subprocess.run(cmd, cwd=root, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"stage {stage!r} failed (dvc repro exit {done.returncode}); its error is printed above")


@flow(name="study")
def study_flow(params_path: str = "params.yaml", stages: list[str] | None = None, force: bool = False,
               project: str | None = None) -> dict[str, str]:
    """Run the chosen stages (default all) in order; returns stage -> "ran" | "skipped"."""
    root = project_root(project)
    load_params(Path(root) / params_path if not Path(params_path).is_absolute() else params_path)
    chosen = select_stages(load_stage_specs(root), stages)
    outcome: dict[str, str] = {}
    for name in chosen:
        changed = dvc_changes(root, name).get(name)  # asked again each time: an upstream stage may just have run
        # a file changed under an unchanged size and mtime: DVC trusts its cached hash, the stage's record does not
        damaged = outputs_problem(Path(root) / "artifacts", name)
        if not changed and not damaged and not force:
            print(f"study: {name}: up to date with dvc.lock, skipped")
            outcome[name] = "skipped"
            continue
        why = "forced" if force else f"damaged: {damaged}" if damaged else "changed: " + _first(changed, name)
        print(f"study: {name}: running ({why})")
        reproduce(name, str(root), force or bool(damaged))
        outcome[name] = "ran"
    print("study: " + ", ".join(f"{k} {v}" for k, v in outcome.items()))
    return outcome


def serve_study(params_path: str = "params.yaml") -> None:
    """Serve :func:`study_flow` as the deployment of ``params.schedule`` (blocks until stopped).

    Runs use ``schedule.stages`` and ``schedule.force`` and the absolute path of
    the project folder, so they do not depend on where the server's runner
    starts them. Needs a Prefect API (``PREFECT_API_URL``) for runs to be
    started from elsewhere.
    """
    from prefect.schedules import Cron
    from prefect.types.entrypoint import EntrypointType

    root = project_root()
    study = load_params(params_path)
    sched = study.schedule
    stages = select_stages(load_stage_specs(root), sched.stages) if sched.stages else None
    if not os.environ.get("PREFECT_API_URL"):
        print("serve: PREFECT_API_URL is not set: serving against a temporary Prefect server that lives as long "
              "as this command (start one with `prefect server start` to trigger runs from elsewhere)")
    parameters = {"params_path": str(Path(params_path).resolve()), "project": str(root),
                  "stages": stages, "force": sched.force}
    when = f"cron {sched.cron!r} ({sched.timezone})" if sched.cron else "no schedule (runs started by hand)"
    print(f"serve: deployment study/{sched.deployment}, {when}, stages {stages or 'all'}")
    study_flow.serve(
        name=sched.deployment,
        schedules=[Cron(sched.cron, timezone=sched.timezone)] if sched.cron else None,
        parameters=parameters,
        description="The rollscale study: the stages DVC finds stale",
        tags=["rollscale"],
        # loaded by module path in each run's process: the runner's working directory is the project
        entrypoint_type=EntrypointType.MODULE_PATH,
    )


def up_to_date(stages: list[str] | None) -> bool:
    """Whether DVC finds none of the chosen stages stale (nor damaged): then a second study starts no
    Prefect server (measured: 3.9 s instead of ~15)."""
    root = project_root()
    stale = dvc_changes(root)
    return not any(name in stale or outputs_problem(root / "artifacts", name)
                   for name in select_stages(load_stage_specs(root), stages))


def main(argv: list[str] | None = None) -> int:
    from flows.__main__ import setup, with_startup_retry
    from tasks.common import quiet_prefect
    from rollscale.pipeline.errors import debug_enabled, run_guarded

    parser = argparse.ArgumentParser(prog="python -m flows.study")
    parser.add_argument("what", choices=("study", "serve"))
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--stages", type=lambda v: [s for s in v.split(",") if s], default=None)
    parser.add_argument("--force", action="store_true")
    parser.add_argument("--debug", action="store_true")
    args = parser.parse_args(argv)
    debug = debug_enabled(args.debug)
    setup(debug)
    quiet_prefect(debug)
    if args.what == "serve":
        return run_guarded(lambda: serve_study(args.params), debug)

    def study() -> None:
        if not args.force and up_to_date(args.stages):
            print("study: every stage is up to date with dvc.lock; nothing to run")
            return
        with_startup_retry(lambda: study_flow(params_path=args.params, stages=args.stages, force=args.force))

    return run_guarded(study, debug)


if __name__ == "__main__":
    sys.exit(main())
