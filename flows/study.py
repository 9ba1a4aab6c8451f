"""The whole study as one flow: every stage of ``dvc.yaml`` in its order (base,
profile, bucket, sweep, fit, report, and any stage added there), each run as
its own stage flow.

A stage is recomputed only when something it depends on changed: its params
sections, its code, or the outputs of the stages before it (the stage
fingerprint of :mod:`rollscale.pipeline.status`). Otherwise it is skipped, so a study
that stopped (or whose params changed late in the chain) goes on where it
matters. Each stage still runs alone (``rollscale run <stage>``, ``dvc
repro``) and records the same fingerprint, so the three ways agree on what is
done. ``rollscale serve`` serves this flow as a Prefect deployment on the cron
schedule of ``params.schedule``.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from prefect import flow

from rollscale.config import load_params
from rollscale.pipeline.status import (
    StageSpec,
    changed_inputs,
    load_stage_specs,
    read_marker,
    stage_fingerprint,
    stage_run,
    stage_status,
)

ARTIFACTS = "artifacts"


def select_stages(specs: Mapping[str, StageSpec], stages: Sequence[str] | None) -> list[str]:
    """The chosen stages in study order; None or empty = all of them."""
    if not stages:
        return list(specs)
    unknown = [s for s in stages if s not in specs]
    if unknown:
        raise ValueError(f"stages: unknown stage(s) {unknown} (dvc.yaml has: {', '.join(specs)})")
    return [s for s in specs if s in stages]


def stage_flow(stage: str) -> Callable[..., object]:
    """The flow ``<stage>_flow`` of ``flows/<stage>.py``, imported only when the stage runs."""
    return getattr(importlib.import_module(f"flows.{stage}"), f"{stage}_flow")


@flow(name="study")
def study_flow(
    params_path: str = "params.yaml",
    artifacts: str = ARTIFACTS,
    stages: list[str] | None = None,
    force: bool = False,
) -> dict[str, str]:
    """Run the chosen stages (default all) in order; returns stage -> "ran" | "skipped"."""
    study = load_params(params_path)
    specs = load_stage_specs()
    chosen = select_stages(specs, stages)
    import torch

    torch.set_num_threads(study.torch_threads)
    outcome: dict[str, str] = {}
    for name in chosen:
        status = stage_status(specs[name], study, artifacts)
        if status.state == "done" and not force:
            print(f"study: {name}: unchanged since {status.finished_at}, skipped")
            outcome[name] = "skipped"
            continue
        marker = read_marker(artifacts, name)
        if force:
            why = "forced"
        elif status.state == "stale" and marker:
            why = "changed: " + ", ".join(changed_inputs(marker, stage_fingerprint(specs[name], study, artifacts)))
        else:
            why = status.state
        print(f"study: {name}: running ({why})")
        with stage_run(name, study, artifacts, specs):
            stage_flow(name)(params_path=params_path, artifacts=artifacts)
        outcome[name] = "ran"
    print("study: " + ", ".join(f"{k} {v}" for k, v in outcome.items()))
    return outcome


def serve_study(params_path: str = "params.yaml", artifacts: str = ARTIFACTS) -> None:
    """Serve :func:`study_flow` as the deployment of ``params.schedule`` (blocks until stopped).

    Runs use ``schedule.stages`` and ``schedule.force`` with absolute paths to
    the params file and artifacts folder, so they do not depend on where the
    server's runner starts them. Needs a Prefect API (``PREFECT_API_URL``) for
    runs to be started from elsewhere.
    """
    from prefect.schedules import Cron
    from prefect.types.entrypoint import EntrypointType

    study = load_params(params_path)
    sched = study.schedule
    stages = select_stages(load_stage_specs(), sched.stages) if sched.stages else None
    if not os.environ.get("PREFECT_API_URL"):
        print("serve: PREFECT_API_URL is not set: serving against a temporary Prefect server that lives as long "
              "as this command (start one with `prefect server start` to trigger runs from elsewhere)")
    parameters = {"params_path": str(Path(params_path).resolve()), "artifacts": str(Path(artifacts).resolve()),
                  "stages": stages, "force": sched.force}
    when = f"cron {sched.cron!r} ({sched.timezone})" if sched.cron else "no schedule (runs started by hand)"
    print(f"serve: deployment study/{sched.deployment}, {when}, stages {stages or 'all'}")
    study_flow.serve(
        name=sched.deployment,
        schedules=[Cron(sched.cron, timezone=sched.timezone)] if sched.cron else None,
        parameters=parameters,
        description="The rollscale study: stages that changed since their last run",
        tags=["rollscale"],
        # loaded by module path in each run's process: independent of the working directory
        entrypoint_type=EntrypointType.MODULE_PATH,
    )


if __name__ == "__main__":
    study_flow()
