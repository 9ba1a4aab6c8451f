"""Where the study stands: which stages are done, stale, running, interrupted or
failed, and how far each sweep run has come.

Staleness is DVC's (``dvc status`` against ``dvc.lock``, see
:mod:`rollscale.pipeline.stages.specs`); a stage whose upstream stage will run again
is reported stale after it. Running / interrupted / failed come from the stage
lock files. Sweep runs are read from ``artifacts/sweep/runs/<run_id>/``:
``run.parquet`` (status), the newest checkpoint that passes its manifest check
(step and C, science §1; :func:`rollscale.train.checkpoint.verify_checkpoint`),
``done.json`` and ``attempts.jsonl`` (one row per start of the run in a worker, with the rung it pauses at).
A finished or stopped run whose checkpoint, committed rows, ``run.parquet`` or
``done.json`` fail their checks (:func:`rollscale.pipeline.stages.outputs.run_damage`,
the checks ``fit`` reads them with) is reported "damaged": the next sweep
retrains it from its newest good checkpoint.

Plain functions over files: no Prefect. Times are UTC ISO strings.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from rollscale.pipeline.stages.record import fingerprint, read_record, record_differences
from rollscale.pipeline.stages.specs import (
    FAILED,
    RUN_INFO,
    StageSpec,
    dvc_changes,
    load_stage_specs,
    now,
    project_root,
    read_json,
    stage_running,
    upstream,
)

ATTEMPTS = "attempts.jsonl"
STATES: tuple[str, ...] = ("done", "stale", "running", "interrupted", "failed", "damaged", "not run", "unknown")


@dataclass(frozen=True)
class StageStatus:
    """One stage: ``state`` is one of :data:`STATES`; ``detail`` says why or since when."""

    stage: str
    state: str
    detail: str


def _locked_stages(root: Path) -> set[str]:
    """The stages dvc.lock records. Read once a status: it lists a hash per output file (a study's: ~45,000
    YAML nodes), and reading it once a stage was two thirds of `rollscale status`'s time."""
    lock = root / "dvc.lock"
    if not lock.exists():
        return set()
    import yaml

    return set((yaml.load(lock.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {}).get("stages")
               or {})


def _interrupted(name: str, info: dict, artifacts: Path) -> StageStatus:
    """A run record without a lock holder: stopped by a signal (it says which), or killed."""
    where = f"pid {info.get('pid')} on {info.get('host')}, started {info.get('started_at')}"
    runs = sweep_progress(artifacts, sweep_running=False) if name == "sweep" else []
    kept = f"; {runs_kept(runs)}" if runs else ""
    if info.get("signal"):
        return StageStatus(name, "interrupted", f"by {info['signal']} at {info.get('interrupted_at')} ({where}){kept}")
    return StageStatus(name, "interrupted", f"stopped without finishing ({where}){kept}")


def _recorded(root: Path, artifacts: Path, name: str, spec: StageSpec, specs: dict[str, StageSpec],
              in_lock: bool) -> StageStatus | None:
    """A stage that DVC does not find up to date, judged by its own record (whichever command ran
    it): done when the record matches params.yaml and the code now, with what dvc.lock lacks."""
    record = read_record(artifacts / name)
    if not record:
        return None
    now = fingerprint(root, artifacts, root / "params.yaml", spec.deps, spec.params, upstream(spec, specs))
    ran = f"ran by `{record.get('command')}`, ended {record.get('ended_at')}"
    if differences := record_differences(record, now):
        return StageStatus(name, "stale", f"{ran}; since then: {', '.join(differences)}")
    behind = "dvc.lock records an older run" if in_lock else "not recorded in dvc.lock"
    # not `dvc commit`: it would record the outputs as they are, unchecked; the study checks them as it records them
    return StageStatus(name, "done", f"{ran}; {behind}: `rollscale study` reruns and records it")


def stage_statuses(root: str | os.PathLike[str] | None = None,
                   artifacts: str | os.PathLike[str] | None = None) -> list[StageStatus]:
    """Every stage's status, in study order (see the module docstring)."""
    from dvc.lock import LockError

    root = project_root(root)
    artifacts = Path(artifacts) if artifacts else root / "artifacts"
    specs = load_stage_specs(root)
    try:
        changes: dict[str, list[str]] | None = dvc_changes(root)
    except LockError:
        changes = None  # a `dvc repro` holds DVC's lock: what is stale is known when it ends
    out: list[StageStatus] = []
    state: dict[str, str] = {}
    locked = _locked_stages(root)
    for name, spec in specs.items():
        folder = artifacts / name
        info = read_json(folder / RUN_INFO)
        failed = read_json(folder / FAILED)
        in_lock = name in locked
        if stage_running(artifacts, name):
            status = StageStatus(name, "running", f"pid {(info or {}).get('pid')} on {(info or {}).get('host')}, "
                                                  f"since {(info or {}).get('started_at')}")
        elif info is not None:
            status = _interrupted(name, info, artifacts)
        elif failed:
            status = StageStatus(name, "failed", f"{failed.get('failed_at')}: {failed.get('error')}")
        elif changes is None:
            status = StageStatus(name, "unknown", "dvc is busy (a `dvc repro` runs): ask again when it ends")
        elif not in_lock or name in changes:
            recorded = _recorded(root, artifacts, name, spec, specs, in_lock)
            if in_lock and not (recorded and recorded.state == "done"):  # DVC says best what changed
                status = StageStatus(name, "stale", "changed: " + "; ".join(changes[name]))
            else:
                status = recorded or StageStatus(name, "not run", "")
        else:
            status = StageStatus(name, "done", "up to date with dvc.lock")
        if status.state == "done":
            ups = [u for u in upstream(spec, specs) if state.get(u) not in ("done", None)]
            if ups:
                status = StageStatus(name, "stale", "after " + ", ".join(f"{u} ({state[u]})" for u in ups))
        status = with_damage(status, artifacts)
        state[name] = status.state
        out.append(status)
    return out


def with_damage(status: StageStatus, artifacts: Path) -> StageStatus:
    """A finished stage ("done" or "stale") whose files no longer match its record of checksums
    is "damaged", naming the file (:mod:`rollscale.pipeline.stages.outputs`); an interrupted or failed one keeps
    its state, the damage to what its last finished run wrote said beside it (every reader refuses that file)."""
    from rollscale.pipeline.stages.outputs import stage_problem

    if status.state not in ("done", "stale", "interrupted", "failed"):
        return status
    problem = stage_problem(artifacts, status.stage, quick=True)
    if problem is None:
        return status
    if status.state in ("interrupted", "failed"):
        return StageStatus(status.stage, status.state, f"{status.detail}; and its last finished run's files are "
                                                       f"damaged: {problem}; `rollscale study` runs it again")
    return StageStatus(status.stage, "damaged", f"{problem}; `rollscale study` runs it again")


# ---------------------------------------------------------------------------- sweep runs


def read_attempts(run_dir: str | os.PathLike[str]) -> list[dict]:
    """The rows of ``attempts.jsonl`` (one per start of a run on a worker); a torn last line is skipped."""
    rows = []
    try:
        lines = (Path(run_dir) / ATTEMPTS).read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        with contextlib.suppress(ValueError):
            row = json.loads(line)
            if isinstance(row, dict):
                rows.append(row)
    return rows


def restarts(attempts: list[dict]) -> int:
    """Starts that repeated a leg of the run: a start whose target (the search rung's ``budget`` it pauses at,
    or C_max) an earlier start already had, after a failure or an interrupt. A start for the next rung of a
    search is not one ("attempts 9" for runs that only paused at rungs); a row written before the
    target was recorded counts as a leg of its own."""
    seen: set = set()
    count = 0
    for row in attempts:
        if "budget" not in row:
            continue
        count += row["budget"] in seen
        seen.add(row["budget"])
    return count


def latest_checkpoint_state(run_dir: str | os.PathLike[str]) -> tuple[dict | None, str | None]:
    """``state.json`` of the newest checkpoint that passes its quick check, and what is wrong
    with the newer ones (None when the newest is intact)."""
    from rollscale.train.checkpoint import RunStore
    from rollscale.train.manifest import verify_checkpoint

    store = RunStore(run_dir)
    problem = None
    for step, path in reversed(store.checkpoint_dirs()):
        why = verify_checkpoint(store.root, step, path, quick=True)
        if why is None:
            return json.loads((path / "state.json").read_text()), problem
        problem = problem or f"ckpt-{step:06d}: {why}"
    return None, problem


def record_attempt(run_dir: str | os.PathLike[str], **info: Any) -> dict:
    """Append this process's start of a run to ``attempts.jsonl`` (pid, host, time, where it resumes)."""
    run_dir = Path(run_dir)
    state, _ = latest_checkpoint_state(run_dir)
    row = {"pid": os.getpid(), "host": socket.gethostname(), "started_at": now(), "started_unix": time.time(),
           "resume_step": state.get("step") if state else None, **info}
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / ATTEMPTS, "a") as fh:  # one short write: appends of a line do not interleave
        fh.write(json.dumps(row) + "\n")
    return row


@dataclass(frozen=True)
class RunProgress:
    """One sweep run (science §1): status, committed step and compute C of C_max."""

    run_id: str
    status: str
    step: int | None
    c: int | None
    c_max: int | None
    restarts: int  # starts that repeated a leg after a failure or an interrupt (:func:`restarts`)
    worker: str | None
    error: str | None

    @property
    def fraction(self) -> float | None:
        return self.c / self.c_max if self.c is not None and self.c_max else None


def _run_row(run_dir: Path) -> dict:
    try:
        rows = pd.read_parquet(run_dir / "run.parquet").to_dict("records")
    except (OSError, ValueError):
        return {}
    return rows[0] if rows else {}


def sweep_progress(artifacts: str | os.PathLike[str], sweep_running: bool) -> list[RunProgress]:
    """Progress of every run folder under ``artifacts/sweep/runs``.

    Status: ``done.json``'s when the run ended, else ``run.parquet``'s; a run
    marked running while no sweep runs is "interrupted"; a folder with neither
    is "pending"; a damaged checkpoint makes it "damaged" (with why). Step and
    C are those of the newest checkpoint that passes its check (what a resumed
    run starts from)."""
    from rollscale.pipeline.stages.outputs import run_damage

    runs_dir = Path(artifacts) / "sweep" / "runs"
    if not runs_dir.is_dir():
        return []
    progress = []
    for run_dir in sorted(p for p in runs_dir.iterdir() if p.is_dir()):
        row = _run_row(run_dir)
        done = read_json(run_dir / "done.json")
        state, problem = latest_checkpoint_state(run_dir)
        state = state or {}
        status = (done or {}).get("status") or row.get("status") or "pending"
        if status == "running" and not sweep_running:
            status = "interrupted"
        error = (done or {}).get("error") or row.get("error")
        if not sweep_running and (problem := problem or run_damage(artifacts, run_dir, quick=True, unfinished_ok=True)):
            status, error = "damaged", f"{problem}; the next sweep retrains from the last good checkpoint"
        c_max = row.get("c_max") or (state.get("config") or {}).get("c_max")
        attempts = read_attempts(run_dir)
        worker = f"{attempts[-1].get('host')}:{attempts[-1].get('pid')}" if attempts else None
        progress.append(RunProgress(run_dir.name, status, state.get("step"), state.get("c"),
                                    int(c_max) if c_max else None, restarts(attempts), worker, error))
    return progress


def runs_kept(runs: list[RunProgress]) -> str:
    """What an interrupted sweep kept, in words: its runs by state (science §1)."""
    finished = sum(r.status in ("finished", "stopped") for r in runs)  # stopped: ended by the search (§9.4)
    stopped = sum(r.status == "stopped" for r in runs)
    failed = sum(r.status == "failed" for r in runs)
    resume = sum(r.status not in ("finished", "stopped", "failed") and r.step is not None for r in runs)
    fresh = len(runs) - finished - failed - resume
    parts = [f"{finished} of {len(runs)} {'run' if len(runs) == 1 else 'runs'} finished"
             + (f" ({stopped} stopped by the search)" if stopped else "")]
    if resume:
        parts.append(f"{resume} {'resumes from its' if resume == 1 else 'resume from their'} last checkpoint")
    if fresh:
        parts.append(f"{fresh} {'starts' if fresh == 1 else 'start'} from the beginning")
    if failed:
        parts.append(f"{failed} failed")
    return ", ".join(parts)


def search_progress(artifacts: str | os.PathLike[str]) -> list[str]:
    """The sweep's search (science §9.4) in words, a line per group: the last rung decided, the keys it
    stopped (rung and rule), added and seeded; none for a grid sweep. A table that fails the sweep's record
    of checksums is not read: one line says it is damaged and what rebuilds it."""
    from rollscale.pipeline.stages.outputs import outputs_problem

    path = Path(artifacts) / "sweep" / "search.parquet"
    rebuild = "`rollscale study` rebuilds it from the runs' evaluations (or `rollscale run sweep`)"
    if path.exists() and (problem := outputs_problem(artifacts, "sweep", [path], quick=True, unfinished_ok=True)):
        return [f"search: damaged, not shown: {problem}; {rebuild}"]
    try:
        rows = pd.read_parquet(path)
    except FileNotFoundError:
        return []
    except Exception as err:  # noqa: BLE001 - Arrow raises many types for a damaged file
        return [f"search: damaged, not shown: {path} is not readable Parquet ({type(err).__name__}); {rebuild}"]
    lines = []
    for group, g in rows.groupby("group", sort=True):
        last = g[g["decision"] == g["decision"].max()]
        # done: the last rung decided (runs finished) with nothing added to train on
        done = (last["action"] == "finish").any() and not last["action"].isin(["add", "seed"]).any()
        said = [f"rung {int(last['rung'].iloc[0])} (C = {float(last['c'].iloc[0]):,.0f}) decided"
                + (", done" if done else "")]
        stops = g[g["action"] == "stop"].drop_duplicates("key")
        if not stops.empty:
            said.append("stopped " + ", ".join(f"{r.key} at rung {r.rung} (rule {r.rule})" for r in stops.itertuples()))
        for action, word in (("add", "added"), ("seed", "seeds added to")):
            keys = g.loc[g["action"] == action, "key"].drop_duplicates()
            if not keys.empty:
                said.append(f"{word} {', '.join(keys)}")
        lines.append(f"search {group}: " + "; ".join(said))
    return lines


@dataclass(frozen=True)
class StudyStatus:
    stages: list[StageStatus]
    runs: list[RunProgress]
    search: list[str] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps({"stages": [asdict(s) for s in self.stages],
                           "runs": [dict(asdict(r), fraction=r.fraction) for r in self.runs],
                           "search": self.search}, indent=1)


def study_status(root: str | os.PathLike[str] | None = None,
                 artifacts: str | os.PathLike[str] | None = None) -> StudyStatus:
    """Every stage's status and every sweep run's progress."""
    root = project_root(root)
    artifacts = Path(artifacts) if artifacts else root / "artifacts"
    stages = stage_statuses(root, artifacts)
    running = any(s.stage == "sweep" and s.state == "running" for s in stages)
    return StudyStatus(stages, sweep_progress(artifacts, running), search_progress(artifacts))


def format_status(status: StudyStatus) -> str:
    """The human-readable tables ``rollscale status`` prints."""
    out = [pd.DataFrame([asdict(s) for s in status.stages]).to_string(index=False, justify="left")]
    if status.runs:
        rows = [{"run_id": r.run_id, "status": r.status, "step": "-" if r.step is None else r.step,
                 "C / C_max": f"{r.c:,}" if r.c is not None else "-", "of": f"{r.c_max:,}" if r.c_max else "-",
                 "done": f"{r.fraction:.0%}" if r.fraction is not None else "-",
                 "restarts": r.restarts or "-", "worker": r.worker or "-", "error": (r.error or "")[:100]}
                for r in status.runs]
        out += ["", f"sweep runs ({len(status.runs)}; step and C of the last good checkpoint):",
                pd.DataFrame(rows).to_string(index=False, justify="left")]
    if status.search:
        out += ["", "search (the search table):", *status.search]
    return "\n".join(out)

