"""Checksums of every stage's outputs: ``artifacts/<stage>/MANIFEST.json``.

A stage that finishes records the size and sha256 of each file it wrote
(:func:`write_outputs_manifest`). The record of the last good outputs stays
until a finished run replaces it: a failed, refused or interrupted run leaves
it as it was. A file changed, truncated, removed or added after that is then
named by ``rollscale status`` (the stage is "damaged"), by a query of its
table (:mod:`rollscale.pipeline.query.storage`), and makes ``rollscale study`` run
the stage again, even where DVC's own hashes cannot see it (DVC trusts a file
whose size and mtime did not change). While a stage runs, or after a run that
did not finish, a file written after the record is the new run's and is not
judged by queries and ``status`` (``unfinished_ok``); a stage about to record
its outputs refuses when a file that did not match the record when it started
is still the same (:func:`unrebuilt_damage`): damage is never recorded as valid.

A sweep run's files are checked as the ``fit`` stage reads them
(:func:`run_damage`): the row parts its newest checkpoint commits
(:func:`rollscale.train.manifest.committed_parts`), that checkpoint, and its
``run.parquet`` / ``done.json`` / ``identity.json`` against this record.

Not recorded here: dot-files (stage locks, temporary files) and what the sweep's
run store already checks itself (checkpoint folders and the row parts their
manifests commit, :mod:`rollscale.train.manifest`); ``archive/`` (runs moved
out of the tables). A stage without a record (interrupted, or run by an older
version) is not checked.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from rollscale.files import sha256_file, write_json_atomic
from rollscale.train.manifest import (
    CHECKPOINT_RE,
    PART_RE,
    QUICK_HASH_BYTES,
    check_file,
    committed_parts,
    verify_checkpoint,
)

OUTPUTS_MANIFEST = "MANIFEST.json"
VERSION = 1

# a sweep run's files that say what it is and how it ended (its attempts.jsonl is a log, not a result)
RUN_RESULT_FILES = ("run.parquet", "done.json", "identity.json")
ENDED = ("finished", "stopped")  # a run the sweep does not train again unless it is damaged

__all__ = ["OUTPUTS_MANIFEST", "input_damage", "outputs_problem", "run_damage", "search_table_damage", "stage_output_files",
           "stage_problem", "table_problem", "unrebuilt_damage", "write_outputs_manifest"]

# the stage whose files may be read while it is unfinished: it resumes run by run, each run's rows are committed
# by its own checkpoints (rollscale.train.manifest) and an ended run is checked whole (run_damage); every other
# stage publishes its tables at its end, so a file its unfinished run left is no result yet
RESUMED_STAGES = ("sweep",)


def _recorded(rel: Path) -> bool:
    """Whether the file at ``rel`` (relative to its stage folder) belongs in the stage's record."""
    parts = rel.parts
    if any(p.startswith(".") for p in parts) or rel == Path(OUTPUTS_MANIFEST) or parts[0] == "archive":
        return False
    if any(CHECKPOINT_RE.match(p) for p in parts[:-1]) or PART_RE.match(parts[-1]):
        return False  # the run store's own manifests check these
    return True


def stage_output_files(artifacts: str | os.PathLike[str], stage: str) -> list[Path]:
    """The files of ``artifacts/<stage>`` that its record covers, sorted, relative to that folder."""
    folder = Path(artifacts) / stage
    if not folder.is_dir():
        return []
    return sorted(rel for p in folder.rglob("*") if p.is_file() and _recorded(rel := p.relative_to(folder)))


def write_outputs_manifest(artifacts: str | os.PathLike[str], stage: str) -> Path:
    """Record the size and sha256 of the stage's files (no time stamp: equal outputs give an equal
    record, so DVC's hash of the folder does not change when the outputs did not)."""
    folder = Path(artifacts) / stage
    files = {str(rel): {"bytes": (folder / rel).stat().st_size, "sha256": sha256_file(folder / rel)}
             for rel in stage_output_files(artifacts, stage)}
    return write_json_atomic({"version": VERSION, "stage": stage, "files": files}, folder / OUTPUTS_MANIFEST)


def _read(folder: Path) -> dict | None:
    try:
        manifest = json.loads((folder / OUTPUTS_MANIFEST).read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {"files": None}
    return manifest if isinstance(manifest, dict) else {"files": None}


def _problems(artifacts: str | os.PathLike[str], stage: str, files: Iterable[Path] | None, quick: bool,
              unfinished_ok: bool) -> Iterator[tuple[Path, str]]:
    """(file relative to the stage folder, what is wrong) for each file that fails the record; a record
    that cannot be read is one problem at the record's path."""
    folder = Path(artifacts) / stage
    manifest = _read(folder)
    if manifest is None:
        return
    recorded = manifest.get("files")
    if not isinstance(recorded, dict):
        yield Path(OUTPUTS_MANIFEST), f"{folder / OUTPUTS_MANIFEST} is unreadable (damaged); run the stage again"
        return
    if files is None:
        wanted = sorted({*map(Path, recorded), *stage_output_files(artifacts, stage)})
    else:
        wanted = [_in_stage_folder(folder, Path(f)) for f in files]
    # a run in progress or one that did not finish: the files it wrote are newer than the record
    since = (folder / OUTPUTS_MANIFEST).stat().st_mtime if unfinished_ok and _unfinished(folder, stage) else None
    for rel in wanted:
        if since is not None and _written_after(folder / rel, since):
            continue
        meta = recorded.get(str(rel))
        if meta is None:
            yield rel, (f"{folder / rel} was not written by the stage's last finished run "
                        f"(not in its {OUTPUTS_MANIFEST})")
            continue
        size = meta.get("bytes") or 0
        problem = check_file(folder / rel, meta, hash_it=not quick or size <= QUICK_HASH_BYTES)
        if problem:
            yield rel, problem


def _in_stage_folder(folder: Path, file: Path) -> Path:
    """``file`` relative to the stage ``folder``: given absolute, relative to it, or (with a relative
    ``--artifacts``) relative to the working directory as ``folder`` is, e.g. ``artifacts/sweep/search.parquet``
    (read as under ``folder`` it named a file that is never there, so a whole table was called unrecorded)."""
    if file.is_absolute():
        return file.resolve().relative_to(folder.resolve())
    if not folder.is_absolute() and file.is_relative_to(folder):
        return file.relative_to(folder)
    return file


def _unfinished(folder: Path, stage: str) -> bool:
    """The stage runs now, or its last run did not finish (its run or failure record is there)."""
    from rollscale.pipeline.stages.specs import FAILED, RUN_INFO, stage_running

    return (folder / RUN_INFO).exists() or (folder / FAILED).exists() or stage_running(folder.parent, stage)


def _written_after(file: Path, since: float) -> bool:
    try:
        return file.stat().st_mtime > since
    except OSError:
        return False


def outputs_problem(artifacts: str | os.PathLike[str], stage: str, files: Iterable[Path] | None = None,
                    quick: bool = False, unfinished_ok: bool = False) -> str | None:
    """What is wrong with the stage's files against its record (the first problem), or None.

    ``files`` (absolute, or relative to the stage folder): check only these, e.g. one table's;
    default: every file of the record and every file the stage folder holds now. ``quick``
    hashes files up to :data:`QUICK_HASH_BYTES` (larger ones: size only). ``unfinished_ok``:
    while the stage runs or after a run that did not finish, files written after the record
    are not judged. None when the stage has no record (see the module docstring)."""
    return next((why for _, why in _problems(artifacts, stage, files, quick, unfinished_ok)), None)


def _table_files(artifacts: str | os.PathLike[str], stage: str) -> list[Path]:
    """The files of the study tables ``stage`` writes (rollscale.tables), there now."""
    from rollscale.tables import TABLES, table_stage

    return sorted(f for name, pattern in TABLES.items() if table_stage(name) == stage
                  for f in Path(artifacts).glob(pattern))


def table_problem(artifacts: str | os.PathLike[str], stage: str, files: Iterable[Path],
                  quick: bool = False) -> str | None:
    """The one rule for trusting a table (every reader: ``rollscale sql``, ``export``, ``track``, the report and the
    next stage): its ``files`` are read only as the stage's last finished run recorded them (size and sha256).
    While the stage runs, or after a run of it that did not finish, a file that run changed (or a file changed by
    hand since) is refused too; only the sweep's own files written by an unfinished run are its resumable work
    (:data:`RESUMED_STAGES`). A stage with no record and no unfinished run (built by hand, or by an older version)
    is not judged. Returns the first problem, in one line naming the file (the caller adds the repair), or None."""
    folder = Path(artifacts) / stage
    if stage in RESUMED_STAGES:
        return outputs_problem(artifacts, stage, files, quick, unfinished_ok=True)
    files = list(files)
    if not _unfinished(folder, stage):
        return outputs_problem(artifacts, stage, files, quick)
    why = "runs now" if _running(folder, stage) else "did not finish"
    if _read(folder) is None:
        return next((f"{f} is no result: the {stage} stage's run {why} and none finished before it"
                     for f in files), None)
    problem = outputs_problem(artifacts, stage, files, quick)
    return problem and f"{problem} (the {stage} stage's last run {why}: only a finished run's tables are read)"


def _running(folder: Path, stage: str) -> bool:
    from rollscale.pipeline.stages.specs import stage_running

    return stage_running(folder.parent, stage)


def unrebuilt_damage(artifacts: str | os.PathLike[str], stage: str) -> Callable[[], str | None]:
    """Taken when a stage starts after a finished run: the files that do not match the record then
    (damaged since); the returned check, called before the new record is written, names the first
    of them the run left as it found it (it would record the damage as valid), or None."""
    folder = Path(artifacts) / stage
    if _unfinished(folder, stage):  # its own unfinished run changed files: they are rebuilt or refused by the run
        return lambda: None
    # (an unreadable record checks nothing: the run's new record replaces it)
    found = {rel: (why, _digest(folder / rel)) for rel, why in _problems(artifacts, stage, None, False, False)
             if rel != Path(OUTPUTS_MANIFEST)}

    def left() -> str | None:
        for rel, (why, digest) in found.items():
            if digest is not None and _digest(folder / rel) == digest:
                return (f"{why}; the stage did not rebuild it, so its record of checksums is kept: restore or "
                        "delete that file and run the stage again")
        return None

    return left


def _digest(file: Path) -> str | None:
    try:
        return sha256_file(file)
    except OSError:
        return None


def run_damage(artifacts: str | os.PathLike[str], run_dir: str | os.PathLike[str], quick: bool = False,
               unfinished_ok: bool = False) -> str | None:
    """Why an ended sweep run (``done.json``: finished or stopped) cannot be trusted, or None: the row
    parts its newest checkpoint commits, as ``fit`` reads them (:func:`committed_parts`), that
    checkpoint (``quick``: weights over 64 MiB by size only), and its :data:`RUN_RESULT_FILES` against the
    sweep's record. A run that has not ended (or failed) is not judged (the sweep resumes it anyway), unless
    the record says it had: its recorded ``done.json`` removed is damage too."""
    run_dir = Path(run_dir)
    folder = Path(artifacts) / "sweep"
    recorded = (_read(folder) or {}).get("files")
    rel = run_dir.resolve().relative_to(folder.resolve())  # the record names files from the stage folder
    status = _read_status(run_dir / "done.json")
    if not run_dir.is_dir():
        return None  # a run folder removed whole: the sweep trains it from the start (input_damage names it)
    done_recorded = isinstance(recorded, dict) and str(rel / "done.json") in recorded
    if status not in ENDED and not (status is None and done_recorded):
        return None
    _, problem = committed_parts(run_dir)
    if problem is None:
        ckpts = sorted((int(m.group(1)), p) for p in run_dir.iterdir() if (m := CHECKPOINT_RE.match(p.name)))
        if ckpts and (why := verify_checkpoint(run_dir, *ckpts[-1], quick=quick)):
            problem = f"{ckpts[-1][1]}: {why}"
    if problem is None:
        files = [rel / name for name in RUN_RESULT_FILES
                 if (run_dir / name).exists() or (isinstance(recorded, dict) and str(rel / name) in recorded)]
        problem = outputs_problem(artifacts, "sweep", files, quick, unfinished_ok)
    return problem


def _read_status(done: Path) -> str | None:
    """The status ``done.json`` says (None: no file); an unreadable one is judged as an ended run's."""
    try:
        data = json.loads(done.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return "finished"  # unreadable: judged as an ended run (its record names the file)
    return data.get("status") if isinstance(data, dict) else "finished"


def runs_damage(artifacts: str | os.PathLike[str], quick: bool = False,
                unfinished_ok: bool = False) -> dict[str, str]:
    """:func:`run_damage` of every sweep run folder: run id -> why (damaged runs only)."""
    runs = Path(artifacts) / "sweep" / "runs"
    if not runs.is_dir():
        return {}
    return {d.name: why for d in sorted(runs.iterdir())
            if d.is_dir() and (why := run_damage(artifacts, d, quick, unfinished_ok))}


def stage_problem(artifacts: str | os.PathLike[str], stage: str, quick: bool = False,
                  unfinished_ok: bool = False) -> str | None:
    """:func:`outputs_problem` of the whole stage, and for the sweep the first damaged run
    (:func:`run_damage`: what its record does not cover, its checkpoints and row parts)."""
    problem = outputs_problem(artifacts, stage, quick=quick, unfinished_ok=unfinished_ok)
    if problem is None and stage == "sweep":
        problem = next(iter(runs_damage(artifacts, quick, unfinished_ok).values()), None)
    return problem


def input_damage(artifacts: str | os.PathLike[str], stages: Iterable[str]) -> str | None:
    """Why a stage reading the outputs of ``stages`` (its upstream stages) would answer from incomplete
    evidence, in one line naming the damaged run or file and the command that repairs it, or None.

    Checked as ``rollscale status`` checks them (``quick``), by the rule of :func:`table_problem` (only the
    sweep's unfinished run owns the files it wrote after the record): every sweep run (:func:`run_damage`: its committed parts, its newest
    checkpoint's manifest, its files of the sweep's record, done.json included), then every other file of
    each stage's record. ``rollscale study`` repairs each: it retrains a damaged run from its last good
    checkpoint and runs a stage with a damaged file again."""
    for stage in stages:
        if stage == "sweep":
            for run_id, why in runs_damage(artifacts, quick=True, unfinished_ok=True).items():
                return (f"sweep run {run_id} is damaged ({why}): `rollscale study` retrains it from its last "
                        "good checkpoint (or `rollscale run sweep`), then run this stage again")
        for rel, why in _problems(artifacts, stage, None, True, True):
            if stage == "sweep" and rel.parts[:1] == ("runs",) and len(rel.parts) > 2:
                return (f"sweep run {rel.parts[1]} is damaged ({why}): `rollscale study` retrains it from its "
                        "last good checkpoint (or `rollscale run sweep`), then run this stage again")
            return f"its input {stage} is damaged ({why}): `rollscale study` runs {stage} again, then this stage"
        # its tables by the readers' one rule (an unfinished run's other files, e.g. the profile's chunks, are
        # its resumable work, judged above as such)
        if stage not in RESUMED_STAGES and (why := table_problem(artifacts, stage, _table_files(artifacts, stage),
                                                                  quick=True)):
            return f"its input {stage} cannot be read ({why}): `rollscale study` runs {stage} again, then this stage"
    return None


def search_table_damage(sweep_dir: Path) -> str | None:
    """What is wrong with the ``search`` table against the sweep's last finished run's record of checksums
    (or as Parquet), or None. A table a sweep that did not finish wrote differs from that record too: it is
    rebuilt as well, to the same rows (the decisions are a pure function of the runs' evaluations)."""
    import pandas as pd

    # the name from the leaf list of tables, not from rollscale.sweep.rungs: every stage runs this module, and
    # rungs imports the search methods, which no stage but the sweep runs (their edits rerun the sweep alone)
    from rollscale.tables import SEARCH_COLUMNS, TABLES

    table = sweep_dir / Path(TABLES["search"]).name
    if not table.exists():
        return None
    if problem := outputs_problem(sweep_dir.parent, sweep_dir.name, [table]):
        return problem
    try:
        stored = pd.read_parquet(table)
    except Exception as err:  # noqa: BLE001 - Arrow raises many types for a damaged file
        return f"{table} is not readable Parquet ({type(err).__name__})"
    if missing := [c for c in SEARCH_COLUMNS if c not in stored.columns]:
        return f"{table} is not a search table (no column {', '.join(missing)})"
    return None
