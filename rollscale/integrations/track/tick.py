"""One tick of ``rollscale track``: the run's logs now, against the table's points and the study's band.

Pure: the caller reads the params, the ``decision`` table, the study's evaluations, the run's log and the
``production`` table, and writes what :func:`track_tick` returns (nothing when nothing is new).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from rollscale.config import StudyParams, TrackParams
from rollscale.core.fit.verdict import forecast_settings
from rollscale.integrations.export.plan import ProductionRun, production_run
from rollscale.integrations.track.advice import setting_differences
from rollscale.integrations.track.band import Band, forecast_band, study_band
from rollscale.integrations.track.logs import RunLog, logged_n, reward_series
from rollscale.integrations.track.page import expected_line, production_chart, production_page
from rollscale.integrations.track.points import PRODUCTION_COLUMNS, departure, merged, one_per_step, production_rows

__all__ = ["Tick", "compared", "track_settings", "track_tick"]


@dataclass(frozen=True)
class Tick:
    """What a tick found: the whole ``production`` table and the page to write (None: nothing new, write
    nothing), the lines to print and the warnings (one line each)."""

    table: pd.DataFrame | None
    page: str | None
    lines: list[str]
    warnings: list[str] = field(default_factory=list)


def _same(a: pd.DataFrame, b: pd.DataFrame) -> bool:
    try:
        pd.testing.assert_frame_equal(a.reset_index(drop=True), b.reset_index(drop=True), check_dtype=False)
    except AssertionError:
        return False
    return True


def _replaces(before: pd.DataFrame, points: pd.DataFrame, step: int) -> bool:
    """Whether the table's points from ``step`` on change now (a restart not yet said; said once)."""
    old = before.loc[before["step"] >= step, ["step", "reward"]].set_index("step")["reward"]
    new = points.set_index("step")["value"].reindex(old.index)
    return before.empty or bool((~np.isclose(old.to_numpy(float), new.to_numpy(float), equal_nan=False)).any())


def _n_warning(run: ProductionRun, log: RunLog) -> list[str]:
    n = logged_n(log.settings)
    if n is None or n == run.n:
        return []
    return [f"{log.source}: the run logs n = {n} rollouts per prompt but was exported with n = {run.n} (key "
            f"{run.key}): C counts the exported B = B_problem x n = {run.batch} rollouts a step; export the key it "
            "runs (rollscale export --key) or track with --key"]


def _band(params: StudyParams, run: ProductionRun, decision: pd.DataFrame, evals: pd.DataFrame) -> Band:
    """The study's band for the run's key: off the forecast's surface where the decision at C* is the forecast's
    (science §10.2, its ``source``), else the §9.3 fit; either way, at C* it is the decision's interval."""
    where = [decision[c].astype(str) == str(v) for c, v in (("design", run.design), ("bucket", run.bucket),
                                                             ("rule", run.rule), ("fixed", run.fixed))]
    mine = decision[np.logical_and.reduce(where)]
    group = (run.design, run.bucket, run.rule, run.fixed)
    if "source" in mine.columns and (mine["source"].astype(str) == "forecast").any():
        settings = forecast_settings(params.fit.bootstrap_resamples, params.fit.bootstrap_seed,
                                     params.bucket.val_size * params.sweep.eval_k,  # the fit stage's (tasks/fit.py)
                                     form=params.study.forecast_form)
        return forecast_band(evals, *group, run.key, run.c_star, settings)
    return study_band(evals, *group, run.key, run.c_star)


def track_tick(params: StudyParams, track: TrackParams, decision: pd.DataFrame, study_evals: pd.DataFrame,
               log: RunLog, table: pd.DataFrame | None, logs_id: str, fmt: str, artifacts: str = "artifacts",
               band: Band | None = None) -> Tick:
    """The run's points now (one per step; a resumed run's replace its earlier ones), the table with them, the
    page, and a flag when the run is below the band's lower bound at ``track.patience`` evaluations in a row.
    ``band``: another forecast than the study's (its §9.3 fit, or its §10.2 surface past the data; :mod:`.band`)."""
    # the band runs to the study's C*: the production run it tracks is the one exported at C* (science §11.5)
    c_star = int(round(float(decision["c_star"].iloc[0]))) if len(decision) else None
    run = production_run(params, decision, track.key, track.rule, artifacts, budget=c_star)
    metric, series = reward_series(log, track.metrics)
    points, restarts = one_per_step(series)
    table = table if table is not None else pd.DataFrame(columns=PRODUCTION_COLUMNS)
    mine = (table["logs"] == logs_id) & (table["metric"] == metric)
    before = table[mine].sort_values("step")
    points, cut = merged(before[["step", "reward"]].rename(columns={"reward": "value"}), points)
    restarts += [cut] if cut else []
    if band is None:
        band = _band(params, run, decision, study_evals)
    rows = production_rows(points, run.batch, band, {"logs": logs_id, "format": fmt, "metric": metric, "key": run.key,
                                                     "n": run.n, "b_problem": run.b_problem, "c_star": run.c_star})
    warnings = _n_warning(run, log)
    if run.refusal:  # a non-answer is no plan to track against (science §11.5)
        warnings.insert(0, f"not an answer: {run.refusal}; the band is the leader's forecast, not a plan")
    last = rows.iloc[-1]
    where = f"step {int(last['step'])} (C = {last['c']:,.0f} of C* = {run.c_star:,}): {metric} {last['reward']:.3f}, "
    if pd.notna(last["forecast_lo"]) and pd.notna(last["forecast_hi"]):
        where += f"the study's band {last['forecast_lo']:.3f} - {last['forecast_hi']:.3f}"
    elif float(last["c"]) > run.c_star:
        where += f"past the study's budget C* = {run.c_star:,} rollouts: no band there"
    else:
        where += "before the band's first C: no band there yet"
    if _same(before[PRODUCTION_COLUMNS], rows):
        return Tick(None, None, [f"track: nothing new in {logs_id}; last {where}"], warnings)
    warnings += [f"{logs_id}: the log goes back from step {r.after} to step {r.at} (a run resumed from a "
                 f"checkpoint): its points from step {r.at} on replace the earlier ones" for r in restarts
                 if _replaces(before, points, r.at)]
    new = len(rows) - int(np.isin(rows["step"], before["step"]).sum())
    lines = [f"track: {max(new, 0)} new points ({len(rows)} in all); last {where}",
             expected_line(band, run.c_star, run.eval_k), compared(metric, params, run)]
    flag, advice = None, []
    if (dep := departure(rows, track.patience)) is not None:
        inside = rows.loc[rows["forecast_lo"].notna()]
        past = bool(len(inside) < len(rows) and float(rows["c"].max()) > run.c_star)
        back = "" if dep.still else "; it is back in since"
        if past:  # NaN bounds past C* are no "back in": the band ends there
            still = bool(inside.sort_values("step")["below"].iloc[-1]) if len(inside) else True
            back = ("; still below at the band's end" if still else "; back in by the band's end") + \
                f"; the run is past the study's budget C* = {run.c_star:,} rollouts since then"
        flag = (f"The run left the study's band: below its lower bound at {dep.count} evaluations in a row from step "
                f"{dep.step} (C = {dep.c:,.0f}; K = {track.patience})" + back)
        advice = setting_differences(run, log.settings) or [
            "the run's log states no setting that differs from the study's (or none at all: compare the framework's "
            "config with `rollscale export`)"]
        lines += [flag, *[f"  study vs run: {a}" for a in advice]]
    summary = [*([f"Not an answer: {run.refusal}."] if run.refusal else []), f"Exported: {run.headline()}.",
               f"Logs: {logs_id} ({fmt}, metric {metric}).", lines[2], f"Last: {where}.", lines[1]]
    page = production_page(production_chart(rows, band, run.c_star, metric), summary, flag, advice)
    full = pd.concat([table[~mine], rows], ignore_index=True) if (~mine).any() else rows
    return Tick(full[PRODUCTION_COLUMNS], page, lines, warnings)


def compared(metric: str, params: StudyParams, run: ProductionRun) -> str:
    """What the tracker sets against what: the run's logged metric (train or validation reward, on its problems)
    against the study's validation avg@k on its validation problems."""
    name = metric.lower()
    kind = "validation" if any(w in name for w in ("eval", "val/", "val_", "valid", "test")) else "train"
    where = ("its own validation problems" if kind == "validation" else
             "the problems it trains on (a train reward: on other problems than the study's, and while learning)")
    return (f"Compared: the run's {kind} reward {metric!r} on {where}, against the study's validation "
            f"avg@{run.eval_k} over its {params.bucket.val_size} validation problems of bucket {run.bucket}.")


def track_settings(base: TrackParams, overrides: dict[str, object]) -> TrackParams:
    """``params.yaml``'s ``track`` section with the command's flags over it (None: not given), validated as the
    section is; a local log path made absolute (the served deployment's runs start elsewhere)."""
    from pydantic import ValidationError

    from rollscale.config import ParamsError, format_validation_error

    given = {k: v for k, v in overrides.items() if v is not None}
    try:
        track = TrackParams.model_validate({**base.model_dump(), **given})
    except ValidationError as err:
        raise ParamsError(format_validation_error(err, "rollscale track (flags over params.yaml's track section)")) \
            from None
    if not track.logs:
        raise ValueError("track.logs: no logs to read; give --logs DIR (or track.logs in params.yaml)")
    local = track.format != "mlflow" or ("://" not in track.logs and not track.logs.startswith(("sqlite:", "databricks")))
    if local:
        where, sep, run = track.logs.partition("#")
        track = track.model_copy(update={"logs": str(Path(where).resolve()) + sep + run})
    return track
