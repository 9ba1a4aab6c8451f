"""``rollscale export --to trl|verl``: the study's answer written as a production run's settings.

Reads ``params.yaml`` and the fit stage's ``decision`` table, picks the leader at C* (or ``--key``),
writes the framework's files and returns what to print; what the framework cannot express is
returned as warning lines (stderr) besides the comment block in the files.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd

from rollscale.config import load_params
from rollscale.files import write_text_atomic
from rollscale.integrations.export.plan import production_run
from rollscale.integrations.export.trl_config import trl_gaps, trl_snippet, trl_yaml
from rollscale.integrations.export.verl_overrides import verl_gaps, verl_shell
from rollscale.report.reasons import blocking_reasons
from rollscale.tables import TABLES

__all__ = ["FRAMEWORKS", "Exported", "export_run", "print_exported"]

FRAMEWORKS = ("trl", "verl")
DEFAULT_OUTPUT = {"trl": "export/trl_grpo.yaml", "verl": "export/verl_overrides.sh"}


@dataclass(frozen=True)
class Exported:
    """What ``rollscale export`` wrote and what to tell: ``files``, the run's ``headline``, ``warnings``."""

    files: list[Path]
    headline: str
    warnings: list[str]


def export_run(to: str, params_path: str = "params.yaml", artifacts: str = "artifacts", key: int | None = None,
               rule: str | None = None, output: str | None = None, budget: int | None = None,
               force: bool = False, *, read_table: Callable[[str, str], pd.DataFrame]) -> Exported:
    """Write the production run of the study for framework ``to`` (``trl``: a GRPOConfig YAML and a Python
    snippet beside it; ``verl``: a bash script of Hydra overrides) at ``output`` (default under ``export/``), of
    ``budget`` rollouts (else ``study.target_budget`` where params.yaml sets it). A study whose verdict is not an
    answer at that budget (science §11.5) is refused, a one-line error (exit 2); with ``force`` the files are
    written with that reason at their top. ``read_table``: the verified reader of the study's tables
    (:func:`rollscale.pipeline.query.storage.read_table`, passed by the CLI: the integrations do not import the
    pipeline)."""
    if to not in FRAMEWORKS:
        raise ValueError(f"--to {to}: expected one of {', '.join(FRAMEWORKS)}")
    params = load_params(params_path)
    table = Path(artifacts) / TABLES["decision"]
    if not table.exists():
        raise LookupError(f"{table}: no decision yet; run the fit stage first (rollscale run fit)")
    run = production_run(params, decision_table(artifacts, read_table), key, rule, artifacts, budget)
    if blocking := blocking_reasons(_study_tables(artifacts, read_table), params):
        # the report's "No answer yet" (an unfinished sweep, buckets too small, no run learning) comes first there,
        # before any key's standing, so here too: one verdict, one first reason
        run = replace(run, refusal=f"the study has no answer yet: {blocking[0]}")
    if run.refusal and not force:
        raise LookupError(f"export: {run.refusal}; nothing written (--force writes it with this reason at its top)")
    source = f"{Path(params_path).resolve().parent} ({params_path}, {table})"
    out = Path(output or DEFAULT_OUTPUT[to])
    if to == "trl":
        snippet = out.with_suffix(".py")
        write_text_atomic(trl_yaml(run, source), out)
        write_text_atomic(trl_snippet(run, out.name), snippet)
        files, gaps = [out, snippet], trl_gaps(run)
    else:
        write_text_atomic(verl_shell(run, source), out)
        out.chmod(0o755)
        files, gaps = [out], verl_gaps(run)
    warnings = [f"{to} cannot express {g.what}: {g.why}" for g in gaps]
    return Exported(files, run.headline(), ([f"not an answer, written with --force: {run.refusal}"] if run.refusal
                                            else []) + warnings)


# the decision table's columns the production run is made of (rollscale.integrations.export.plan)
DECISION_COLUMNS = ("design", "bucket", "rule", "fixed", "key", "n", "b_problem", "c_star", "status", "reward",
                    "reward_lo", "reward_hi")


def _study_tables(artifacts: str, read_table: Callable[[str, str], pd.DataFrame]) -> dict[str, pd.DataFrame | None]:
    """The tables the report's blocking reasons read (:func:`rollscale.report.reasons.blocking_reasons`), each as
    every reader reads it; None for one not written yet (a damaged one raises)."""
    out: dict[str, pd.DataFrame | None] = {}
    for name in ("runs", "evals", "steps", "bucket_counts", "profile"):
        try:
            out[name] = read_table(artifacts, name)
        except LookupError:  # not written yet
            out[name] = None
    return out


def decision_table(artifacts: str, read_table: Callable[[str, str], pd.DataFrame]) -> pd.DataFrame:
    """The fit stage's ``decision`` table, read as every reader reads a table (only as the fit's last finished run
    recorded it: ``read_table``, :func:`rollscale.pipeline.query.storage.read_table`), with the columns an export
    needs."""
    decision = read_table(artifacts, "decision")
    if missing := [c for c in DECISION_COLUMNS if c not in decision.columns]:
        raise ValueError(f"{Path(artifacts) / TABLES['decision']}: not a decision table of this rollscale (no column "
                         f"{', '.join(missing)}); run the fit stage again (rollscale run fit)")
    return decision


def print_exported(done: Exported) -> None:
    """The files written (stdout) and one warning line per setting the framework cannot express (stderr)."""
    print(f"exported {done.headline}")
    for path in done.files:
        print(f"wrote {path}")
    for line in done.warnings:
        print(f"rollscale export: warning: {line}", file=sys.stderr)
