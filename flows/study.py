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
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from prefect import flow, task
from prefect.exceptions import TerminationSignal

from rollscale.config import load_params
from rollscale.pipeline import interrupts
from rollscale.pipeline.errors import debug_enabled
from rollscale.pipeline.interrupts import Interrupted
from rollscale.pipeline.stages.outputs import OUTPUTS_MANIFEST, stage_problem
from rollscale.pipeline.stages.record import COMMAND_ENV
from rollscale.pipeline.stages.specs import (
    RUN_INFO,
    STAGE_EXIT,
    StageFailedError,
    busy_error,
    dvc_changes,
    load_stage_specs,
    project_root,
    read_json,
    select_stages,
    stage_running,
)

# stage -> "ran" | "skipped" as the study goes (what an interrupted study says it kept)
STUDY_OUTCOME: dict[str, str] = {}


def _api_url() -> str | None:
    """This process's Prefect API (the temporary server it started, or PREFECT_API_URL)."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return str(client.api_url)


def _first(reasons: list[str], stage: str, shown: int = 3) -> str:
    """A few of DVC's reasons (a fresh clone lists every dep of every stage as modified)."""
    more = len(reasons) - shown
    return "; ".join(reasons[:shown]) + (f"; and {more} more: `dvc status {stage}`" if more > 0 else "")


class StageInterrupted(Interrupted):
    """The study stopped by a signal while ``stage`` ran; ``reported``: the stage said what it kept."""

    def __init__(self, signum: int, stage: str, reported: bool) -> None:
        super().__init__(signum)
        self.stage, self.reported = stage, reported


def stop_stage(dvc: subprocess.Popen, stage: str, artifacts: Path, signum: int) -> bool:
    """After a signal: pass it to the running stage (it may have come to this process alone), end
    ``dvc repro`` quietly while the stage still runs (it would only add "failed to reproduce";
    it never writes dvc.lock for an interrupted stage), and wait until the stage has released its
    lock. Whether the stage recorded the interrupt, i.e. printed what it kept."""
    deadline = time.monotonic() + interrupts.GRACE_S + 1
    info = read_json(artifacts / stage / RUN_INFO) or {}
    if stage_running(artifacts, stage) and info.get("host") == socket.gethostname() and info.get("pid"):
        with contextlib.suppress(OSError):
            os.kill(int(info["pid"]), signum)
    while time.monotonic() < deadline:
        if stage_running(artifacts, stage):
            if dvc.poll() is None:
                dvc.terminate()
        elif dvc.poll() is not None:
            break
        time.sleep(0.1)
    return bool((read_json(artifacts / stage / RUN_INFO) or {}).get("signal"))


@task(name="reproduce-stage")
def reproduce(stage: str, root: str, force: bool) -> None:
    """``dvc repro --single-item <stage>`` in the project folder; raises if the stage failed.
    Refuses at once, in one line, when the stage is already running."""
    artifacts = Path(root) / "artifacts"
    if stage_running(artifacts, stage):  # else the stage's own refusal would come wrapped in DVC's error
        raise busy_error(stage, artifacts)
    env = stage_env()
    url = _api_url()
    if url and url.startswith("http"):
        env["PREFECT_API_URL"] = url
    (artifacts / stage / STAGE_EXIT).unlink(missing_ok=True)
    # the record of the stage's last finished run, before DVC runs it: what there is to put back if DVC removes it
    recorded = (artifacts / stage / OUTPUTS_MANIFEST).exists()
    # DVC's command line, less its "failed to reproduce" line for a stage stopped by a signal (the stage says it)
    cmd = [sys.executable, "-m", "rollscale.pipeline.stages.dvc_quiet", "repro", "--single-item",
           *(["--force"] if force else []), stage]
    dvc = subprocess.Popen(cmd, cwd=root, env=env)
    try:
        code = dvc.wait()
    except (KeyboardInterrupt, TerminationSignal) as err:  # TerminationSignal: Prefect's, in a served run
        signum = getattr(err, "signal", None) or interrupts.signal_of(err)
        reported = stop_stage(dvc, stage, artifacts, signum)
        restore_outputs(stage, root, env, recorded)
        raise StageInterrupted(signum, stage, reported) from None
    if code != 0:
        restore_outputs(stage, root, env, recorded)
        said = read_json(artifacts / stage / STAGE_EXIT) or {}
        if said.get("message"):  # the stage's own reason and exit status (DVC says 255 for any failure)
            raise StageFailedError(f"stage {stage!r} stopped: {said['message']}", int(said.get("code") or 1))
        raise StageFailedError(f"stage {stage!r} failed (dvc repro exit {code}); its error is printed above", 1)


def stage_env() -> dict[str, str]:
    """The environment of ``dvc repro``: the folder of this interpreter first on PATH, so the stage command
    ``python -m flows <stage>`` runs with rollscale's own Python (its venv need not be activated)."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), *filter(None, [env.get("PATH")])])
    return env


def persistent(root: str | Path, stage: str) -> bool:
    """Whether ``dvc.yaml`` keeps the stage's outputs while it runs (``persist: true``: DVC never removes them)."""
    import yaml

    body = ((yaml.safe_load((Path(root) / "dvc.yaml").read_text()) or {}).get("stages") or {}).get(stage) or {}
    return any(isinstance(out, dict) and any(isinstance(o, dict) and o.get("persist") for o in out.values())
               for out in body.get("outs") or [])


def restore_outputs(stage: str, root: str, env: dict[str, str], recorded: bool) -> None:
    """After a stage that failed or was stopped: where DVC had removed its earlier outputs before running it,
    put them back from DVC's cache (``dvc checkout``), or say in one line how. Told apart from the stage's
    own work in progress by the stage's record, not by a missing file: only a stage without ``persist``
    (DVC empties its folder before running it) whose record of a finished run (``recorded``: its
    MANIFEST.json when the study started it) is gone now. A persistent stage's folder (the sweep's runs,
    the profile's chunks) or one started from nothing holds its own work: it stays as it is."""
    folder = Path(root) / "artifacts" / stage
    lock = Path(root) / "dvc.lock"
    import yaml

    if not recorded or (folder / OUTPUTS_MANIFEST).exists() or not lock.exists() or persistent(root, stage):
        return
    if stage_running(folder.parent, stage):  # another process owns the stage now: its folder is its work
        print(f"study: {stage}: not put back from DVC's cache: another process runs the stage now", file=sys.stderr,
              flush=True)
        return
    if stage not in ((yaml.safe_load(lock.read_text()) or {}).get("stages") or {}):
        return  # never recorded: nothing to put back
    r = subprocess.run([sys.executable, "-m", "dvc", "checkout", "--force", stage], cwd=root, env=env,
                       capture_output=True, text=True)
    if r.returncode == 0 and (folder / OUTPUTS_MANIFEST).exists():
        print(f"study: {stage}: its earlier outputs (as dvc.lock records them) were put back from DVC's cache",
              flush=True)
    else:
        print(f"study: {stage}: DVC removed its earlier outputs before it ran and could not put them back "
              f"(`dvc checkout {stage}` restores them from DVC's cache)", file=sys.stderr, flush=True)


@flow(name="study")
def study_flow(params_path: str = "params.yaml", stages: list[str] | None = None, force: bool = False,
               project: str | None = None) -> dict[str, str]:
    """Run the chosen stages (default all) in order; returns stage -> "ran" | "skipped"."""
    from rollscale.pipeline.runtime.workers import quiet_prefect

    quiet_prefect(debug_enabled())  # in a served run's own process too: the stages print their errors
    root = project_root(project)
    load_params(Path(root) / params_path if not Path(params_path).is_absolute() else params_path)
    chosen = select_stages(load_stage_specs(root), stages)
    outcome = STUDY_OUTCOME
    outcome.clear()
    for name in chosen:
        changed = dvc_changes(root, name).get(name)  # asked again each time: an upstream stage may just have run
        # a file changed under an unchanged size and mtime: DVC trusts its cached hash, the stage's record does not
        damaged = stage_problem(Path(root) / "artifacts", name)
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


def study_runner(name: str):
    """Prefect's runner (what ``Flow.serve`` uses), ending on SIGTERM as the other commands do:
    with exit status 143 and one line, not Prefect's exit 0."""
    from prefect.runner import Runner

    class StudyRunner(Runner):
        def handle_sigterm(self, *args, **kwargs) -> None:  # as on Ctrl-C (serve_study)
            interrupts.handle(signal.SIGTERM)

    return StudyRunner(name=name, pause_on_shutdown=True)


def serve_study(params_path: str = "params.yaml") -> None:
    """Serve :func:`study_flow` as the deployment of ``params.schedule`` (blocks until stopped).

    Runs use ``schedule.stages`` and ``schedule.force`` and the absolute path of
    the project folder, so they do not depend on where the server's runner
    starts them. Needs a Prefect API (``PREFECT_API_URL``) for runs to be
    started from elsewhere. Ctrl-C or SIGTERM stops serving (the schedule is
    paused meanwhile) and stops a run in progress, whose stage says what it kept.
    """
    import asyncio

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
    runner = study_runner(sched.deployment)
    runner.add_flow(
        study_flow,
        name=sched.deployment,
        schedules=[Cron(sched.cron, timezone=sched.timezone)] if sched.cron else None,
        parameters=parameters,
        description="The rollscale study: the stages DVC finds stale",
        tags=["rollscale"],
        # loaded by module path in each run's process: the runner's working directory is the project
        entrypoint_type=EntrypointType.MODULE_PATH,
    )
    print(f"serve: deployment study/{sched.deployment}, {when}, stages {stages or 'all'}; a run now: "
          f"`prefect deployment run 'study/{sched.deployment}'`", flush=True)

    async def serve() -> None:
        # Ctrl-C or SIGTERM: the runner stops as Prefect stops it (a run in progress is cancelled,
        # its process sent SIGTERM), from inside its loop
        loop = asyncio.get_running_loop()
        interrupts.stop_with(lambda signum: loop.call_soon_threadsafe(lambda: loop.create_task(runner.astop())))
        await runner.start()

    asyncio.run(serve())
    if interrupts.received():
        raise ServeStopped(interrupts.received(), wait_for_stages(root / "artifacts", interrupts.GRACE_S))


class ServeStopped(Interrupted):
    """``rollscale serve`` stopped by a signal; ``run_stopped``: a run of the study was in progress."""

    def __init__(self, signum: int, run_stopped: bool) -> None:
        super().__init__(signum)
        self.run_stopped = run_stopped


def wait_for_stages(artifacts: Path, seconds: float) -> bool:
    """Wait until no stage holds its lock (a cancelled run's stage ends its work), at most
    ``seconds``; whether one held it."""
    deadline, held = time.monotonic() + seconds, False
    while time.monotonic() < deadline and any(stage_running(artifacts, s) for s in load_stage_specs()):
        held = True
        time.sleep(0.1)
    return held


def up_to_date(stages: list[str] | None) -> bool:
    """Whether DVC finds none of the chosen stages stale (nor damaged): then a second study starts no
    Prefect server (measured: 3.9 s instead of ~15)."""
    root = project_root()
    stale = dvc_changes(root)
    return not any(name in stale or stage_problem(root / "artifacts", name)
                   for name in select_stages(load_stage_specs(root), stages))


def between_stages_line(signum: int, ran: dict[str, str], command: str) -> str:
    """The study's one line after a signal that came between stages."""
    done = ", ".join(name for name, how in ran.items() if how == "ran") or "none"
    return (f"study: interrupted ({signal.Signals(signum).name}) between stages; stages it ran: {done} "
            f"(recorded in dvc.lock): rerun `{command}` to go on")


def main(argv: list[str] | None = None) -> int:
    from flows.__main__ import keep_our_signal_handlers, setup
    from rollscale.pipeline.errors import run_guarded
    from rollscale.pipeline.runtime.workers import quiet_prefect
    from rollscale.pipeline.runtime.server import prefect_api

    parser = argparse.ArgumentParser(prog="python -m flows.study")
    parser.add_argument("what", choices=("study", "serve"))
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--stages", type=lambda v: [s for s in v.split(",") if s], default=None)
    parser.add_argument("--force", action="store_true")
    parser.add_argument("--debug", action="store_true")
    args = parser.parse_args(argv)
    command = os.environ.get(COMMAND_ENV) or f"rollscale {args.what}"
    os.environ[COMMAND_ENV] = command  # the stages DVC starts for it record it, and say it to resume

    def final_line(signum: int, run_stopped: bool = False) -> str:
        if args.what == "serve":
            run = "; the run in progress was stopped (its stage says above what it kept)" if run_stopped else ""
            return f"serve: stopped ({signal.Signals(signum).name}){run}; `{command}` serves the deployment again"
        return between_stages_line(signum, STUDY_OUTCOME, command)

    interrupts.install(final_line, interrupts.STUDY_GRACE_S)
    debug = debug_enabled(args.debug)
    setup(debug)
    quiet_prefect(debug)

    def serve() -> None:
        with prefect_api():
            try:
                serve_study(args.params)
            except KeyboardInterrupt as err:
                interrupts.say(final_line(interrupts.signal_of(err), getattr(err, "run_stopped", False)))
                raise

    def study() -> None:
        if not args.force and up_to_date(args.stages):
            print("study: every stage is up to date with dvc.lock; nothing to run")
            return
        with prefect_api():
            try:
                keep_our_signal_handlers(study_flow)(params_path=args.params, stages=args.stages, force=args.force)
            except KeyboardInterrupt as err:
                if getattr(err, "reported", False):
                    interrupts.said_by_child()
                interrupts.say(between_stages_line(interrupts.signal_of(err), STUDY_OUTCOME, command))
                raise

    code = run_guarded(serve if args.what == "serve" else study, debug)
    if interrupts.received():
        interrupts.exit_now(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
