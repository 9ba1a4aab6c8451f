"""Study-level frontier analysis: from the sweep's runs and evaluations to the fit tables (science §7).

DataFrames in, DataFrames out, built on :mod:`rollscale.core.fit`. The inputs are
the sweep's ``runs`` and ``evals`` tables (and the measure stage's
``noise_steps`` for the CRS check); the outputs are the rows of the ``fits``,
``frontier``, ``epoch_transitions``, ``steps_to_target``, ``crs_prediction``
and ``record_points`` tables.

Runs are analysed in *families*: one training bucket and one allocation rule.
Runs of different buckets or rules are never pooled. Within a family the free
variable of a frontier (its *design*) is

* ``n``: rollouts per prompt, every run with that n pooled (x = compute C);
* ``b_problem``: prompts per step, among runs with the same n (x = C);
* ``iso_batch``: n among runs with the same total batch B = n·B_problem
  (x = optimizer steps M; the frontier's ``c`` is then B·M).

``fixed`` names what is held fixed in a group: ``"all"`` for the n design,
``"n=8"``, ``"B=128"``, ``"B_problem=16"``. A fit or check that cannot be made
(one n only, too few points, a CRS not measured) is never an exception: its
row carries NaN numbers and a ``status`` saying why.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from rollscale.core import fit

__all__ = [
    "AXES",
    "DESIGNS",
    "FrontierTables",
    "SteppedTables",
    "crs_prediction",
    "frontier_analysis",
    "measured_crs",
    "record_points",
    "run_evals",
    "steps_to_target_analysis",
    "target_reward",
]

DESIGNS: tuple[str, ...] = ("n", "b_problem", "iso_batch")
AXES: tuple[str, ...] = ("prompt", "rollout")

RUN_COLUMNS = ("run_id", "n", "b_problem")
EVAL_COLUMNS = ("run_id", "step", "c", "avg_at_k")
FAMILY = ["bucket", "rule"]
_FIT_ID = ["kind", "design", "bucket", "rule", "fixed", "key"]
_FRONTIER_COLUMNS = ["design", "bucket", "rule", "fixed", "c", "m", "frontier_reward", "best_key", "n_star_fit"]
_TRANSITION_COLUMNS = ["design", "bucket", "rule", "fixed", "c", "m", "from_key", "to_key", "epochs"]


# ---------------------------------------------------------------------------
# inputs


def _require(df: Any, name: str, columns: Sequence[str]) -> pd.DataFrame:
    if not isinstance(df, pd.DataFrame):
        raise ValueError(f"{name}: expected a pandas DataFrame, got {type(df).__name__}")
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(f"{name}: missing columns {missing} (has {list(df.columns)})")
    return df


def run_evals(
    runs: pd.DataFrame, evals: pd.DataFrame, statuses: Iterable[str] | None = ("finished",)
) -> pd.DataFrame:
    """Every evaluation with its run's design, sorted by run and step (science §1, §5, §7).

    ``runs`` needs ``run_id, n, b_problem`` (``bucket``, ``rule``, ``seed``,
    ``c_max``, ``status`` are used when present); ``evals`` needs ``run_id,
    step, c, avg_at_k`` (``epochs`` when present). Only runs whose status is in
    ``statuses`` are kept (None keeps all): a diverged or interrupted run's
    curve would bias the fits. A repeated (run, step) keeps its last row.

    Columns: ``run_id, bucket, rule, seed, c_max, n, b_problem, b, step, c,
    epochs, avg_at_k`` with ``b = n * b_problem`` (science §1).
    """
    _require(runs, "runs", RUN_COLUMNS)
    _require(evals, "evals", EVAL_COLUMNS)
    r = runs.copy()
    if statuses is not None and "status" in r.columns:
        r = r[r["status"].astype(str).isin(set(statuses))]
    for col, default in (("bucket", "all"), ("rule", "all"), ("seed", 0), ("c_max", np.nan)):
        if col not in r.columns:
            r[col] = default
    r = r[["run_id", "bucket", "rule", "seed", "c_max", "n", "b_problem"]].drop_duplicates("run_id", keep="last")
    r["run_id"] = r["run_id"].astype(str)
    r["bucket"] = r["bucket"].fillna("all").astype(str)
    r["rule"] = r["rule"].fillna("all").astype(str)
    for col in ("n", "b_problem"):
        values = pd.to_numeric(r[col], errors="coerce")
        if values.isna().any() or (values < 1).any() or (values != values.round()).any():
            raise ValueError(f"runs.{col}: expected positive integers, got {r[col].tolist()[:5]}")
        r[col] = values.astype(int)
    r["b"] = r["n"] * r["b_problem"]

    e = evals.copy()
    e["run_id"] = e["run_id"].astype(str)
    if "epochs" not in e.columns:
        e["epochs"] = np.nan
    e = e[["run_id", "step", "c", "epochs", "avg_at_k"]]
    for col in ("step", "c", "epochs", "avg_at_k"):
        e[col] = pd.to_numeric(e[col], errors="coerce").astype(float)
    e = e.dropna(subset=["step", "c", "avg_at_k"])
    out = r.merge(e, on="run_id", how="inner")
    out = out.sort_values(["run_id", "step"]).drop_duplicates(["run_id", "step"], keep="last")
    return out.reset_index(drop=True)


def record_points(evals: pd.DataFrame, bin_width: float) -> pd.DataFrame:
    """Each run's evaluations with ``is_record``: its record-breaking points (science §7).

    ``evals`` is :func:`run_evals`'s table; within a run, rows in step order
    (compute non-decreasing) are bucketed into reward bins of ``bin_width`` and
    the first row of each new highest bin is a record.
    """
    _require(evals, "evals", EVAL_COLUMNS)
    if not (isinstance(bin_width, (int, float)) and math.isfinite(bin_width) and bin_width > 0):
        raise ValueError(f"bin_width: expected a positive finite number, got {bin_width!r}")
    out = evals.sort_values(["run_id", "step"]).reset_index(drop=True)
    out["is_record"] = False
    for run_id, g in out.groupby("run_id", sort=False):
        try:
            keep = fit.record_breaking_points(g["c"].to_numpy(float), g["avg_at_k"].to_numpy(float), bin_width)
        except ValueError as err:
            raise ValueError(f"evals of run {run_id!r}: {err}") from err
        out.loc[g.index[keep], "is_record"] = True
    return out


# ---------------------------------------------------------------------------
# frontier F(C), n*(C), epochs at transitions


@dataclass(frozen=True)
class FrontierTables:
    """One design's rows of the ``fits``, ``frontier`` and ``epoch_transitions`` tables."""

    fits: pd.DataFrame
    frontier: pd.DataFrame
    transitions: pd.DataFrame


@dataclass(frozen=True)
class _Group:
    bucket: str
    rule: str
    fixed: str
    key_col: str
    x_col: str
    batch: int | None  # the fixed total batch B of an iso-batch group
    rows: pd.DataFrame


def _families(df: pd.DataFrame) -> list[tuple[tuple[str, str], pd.DataFrame]]:
    return [((str(b), str(r)), g) for (b, r), g in df.groupby(FAMILY, sort=True)]


def _keys_text(values: Iterable[Any]) -> str:
    return ", ".join(str(int(v)) for v in sorted(set(values)))


def _design_groups(df: pd.DataFrame, design: str) -> tuple[list[_Group], list[dict[str, Any]]]:
    """The groups a design's frontier is fitted on, and status rows for families that have none."""
    groups: list[_Group] = []
    missing: list[dict[str, Any]] = []
    for (bucket, rule), fam in _families(df):
        found = []
        if design == "n":
            if fam["n"].nunique() >= 2:
                found.append(_Group(bucket, rule, "all", "n", "c", None, fam))
            reason = f"only one n ({_keys_text(fam['n'])}): no frontier over n"
        elif design == "b_problem":
            for n_value, g in fam.groupby("n"):
                if g["b_problem"].nunique() >= 2:
                    found.append(_Group(bucket, rule, f"n={int(n_value)}", "b_problem", "c", None, g))
            reason = "no two runs with the same n and different B_problem"
        else:
            for b_value, g in fam.groupby("b"):
                if g["n"].nunique() >= 2:
                    found.append(_Group(bucket, rule, f"B={int(b_value)}", "n", "step", int(b_value), g))
            reason = "no two n share a total batch B = n·B_problem"
        groups += found
        if not found:
            missing.append({"bucket": bucket, "rule": rule, "fixed": None, "status": reason})
    return groups, missing


def _n_star_kind(design: str) -> str:
    # the report looks the n design's n* fit up as plain "n_star"
    return "n_star" if design == "n" else f"n_star_{design}"


def _fit_row(kind: str, design: str, bucket: str, rule: str, fixed: str | None, key: Any, **values: Any) -> dict:
    return {"kind": kind, "design": design, "bucket": bucket, "rule": rule, "fixed": fixed, "key": key, **values}


def _epochs_lookup(group: _Group) -> Any:
    """Epochs a key's runs had completed at x, averaged over its runs (seeds); NaN outside a run's range."""
    per_key: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
    for (_, key), g in group.rows.groupby(["run_id", group.key_col]):
        g = g.sort_values("step")
        per_key.setdefault(int(key), []).append((g[group.x_col].to_numpy(float), g["epochs"].to_numpy(float)))

    def lookup(key: Hashable, x: float) -> float:
        values = []
        for xs, epochs in per_key.get(int(key), []):  # type: ignore[arg-type]
            ok = np.isfinite(epochs)
            if ok.sum() >= 1 and xs[ok].min() <= x <= xs[ok].max():
                values.append(float(np.interp(x, xs[ok], epochs[ok])))
        return float(np.mean(values)) if values else math.nan

    return lookup


def _resolved_start(curves: dict[int, fit.SigmoidFit], x_lo: float, x_hi: float, min_gain: float) -> float | None:
    """The lowest x where F has risen by ``min_gain`` above F(x_lo); None if it never does."""
    if min_gain <= 0:
        return x_lo
    fine = fit.log_grid(x_lo, x_hi, 400)
    f = fit.frontier(curves, fine)["frontier_reward"].to_numpy(float)
    risen = np.flatnonzero(f - f[0] >= min_gain)
    return float(fine[risen[0]]) if len(risen) else None


def _frontier_for_group(group: _Group, design: str, grid_points: int, min_gain: float) -> FrontierTables:
    pts = group.rows[group.rows["is_record"] & (group.rows[group.x_col] > 0)]
    curves: dict[int, fit.SigmoidFit] = {}
    fit_rows = []
    for key in sorted(int(k) for k in group.rows[group.key_col].unique()):
        g = pts[pts[group.key_col] == key]
        f = fit.fit_sigmoid(g[group.x_col].to_numpy(float), g["avg_at_k"].to_numpy(float))
        curves[key] = f
        fit_rows.append(_fit_row(f"sigmoid_{design}", design, group.bucket, group.rule, group.fixed, key,
                                 **f.to_dict()))
    ids = (design, group.bucket, group.rule, group.fixed)
    n_star_kind = _n_star_kind(design)
    no_frontier, no_transitions = pd.DataFrame(columns=_FRONTIER_COLUMNS), pd.DataFrame(columns=_TRANSITION_COLUMNS)
    usable = {k: f for k, f in curves.items() if f.ok}
    if not usable:
        why = "; ".join(f"{group.key_col}={k}: {f.status}" for k, f in curves.items())
        fit_rows.append(_fit_row(n_star_kind, *ids, None, n_points=0, status=f"no usable sigmoid fit ({why})"))
        return FrontierTables(pd.DataFrame(fit_rows), no_frontier, no_transitions)
    x_lo, x_hi = float(pts[group.x_col].min()), float(pts[group.x_col].max())
    if not x_hi > x_lo:
        fit_rows.append(_fit_row(n_star_kind, *ids, None, n_points=0,
                                 status=f"record points span no range of {group.x_col}"))
        return FrontierTables(pd.DataFrame(fit_rows), no_frontier, no_transitions)

    start = _resolved_start(usable, x_lo, x_hi, min_gain)
    resolved = start is not None and start < x_hi
    grid = fit.log_grid(start if resolved else x_lo, x_hi, grid_points)
    fr = fit.frontier(usable, grid)
    log10_x = np.log10(fr["c"].to_numpy(float))
    if resolved:
        ns = fit.fit_n_star(log10_x, fr["best_key"].astype(float).to_numpy())
        fit_rows.append(_fit_row(n_star_kind, *ids, None, **ns.to_dict()))
        transitions = fit.epochs_at_transitions(fr, _epochs_lookup(group))
    else:
        # every curve is still at its base reward: which one is highest is fit noise, not a best key
        ns = None
        fit_rows.append(_fit_row(n_star_kind, *ids, None, n_points=len(grid), status=(
            f"the frontier gains less than {min_gain:g} over the {group.x_col} range: n* not resolved")))
        transitions = pd.DataFrame(columns=["c", "from_key", "to_key", "epochs"])
    frontier_df = pd.DataFrame({"design": design, "bucket": group.bucket, "rule": group.rule, "fixed": group.fixed,
                                "c": fr["c"].to_numpy(float), "m": np.nan,
                                "frontier_reward": fr["frontier_reward"].to_numpy(float),
                                "best_key": pd.array([int(k) for k in fr["best_key"]], dtype="Int64"),
                                "n_star_fit": ns.predict(log10_x) if ns is not None and ns.ok else np.nan})
    transitions = transitions.assign(design=design, bucket=group.bucket, rule=group.rule, fixed=group.fixed, m=np.nan)
    if group.batch is not None:
        # iso-batch: the grid is in optimizer steps M; C = B·M is the nominal compute (exact for the uniform rule)
        frontier_df["m"] = frontier_df["c"]
        frontier_df["c"] = frontier_df["m"] * group.batch
        transitions["m"] = transitions["c"]
        transitions["c"] = transitions["m"] * group.batch
    transitions = transitions[_TRANSITION_COLUMNS].astype({"from_key": "Int64", "to_key": "Int64"})
    return FrontierTables(pd.DataFrame(fit_rows), frontier_df[_FRONTIER_COLUMNS], transitions)


def _fits_frame(rows: list[dict]) -> pd.DataFrame:
    df = pd.DataFrame(rows)
    if df.empty:
        return pd.DataFrame(columns=[*_FIT_ID, "n_points", "status"])
    for col in _FIT_ID:
        if col not in df.columns:
            df[col] = None
    df["key"] = pd.array([None if v is None or pd.isna(v) else int(v) for v in df["key"]], dtype="Int64")
    df["n_points"] = pd.to_numeric(df["n_points"]).astype(int)
    rest = [c for c in df.columns if c not in _FIT_ID]
    return df[_FIT_ID + rest]


def _concat(frames: list[pd.DataFrame], columns: list[str]) -> pd.DataFrame:
    frames = [f for f in frames if not f.empty]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)


def frontier_analysis(
    points: pd.DataFrame, design: str, grid_points: int = 50, min_gain: float = 0.0
) -> FrontierTables:
    """Sigmoid per key, the frontier F(C) and its argmax, the n* fit and epochs at transitions (science §7).

    ``points`` is :func:`record_points`'s table. For each group of the design
    (module docstring): the monotonic sigmoid R(x) is fitted per key to the
    pooled record-breaking points at x > 0 of all runs with that key; the
    frontier is the max over the usable fits on a log grid of ``grid_points``
    values up to the highest record point; the logistic of log2 n* in log10 x
    is fitted to its argmax; and where the argmax changes, the epochs the new
    key's runs had completed there (interpolated in each run's evaluations,
    averaged over its runs).

    The grid starts at the lowest record point, or, with ``min_gain`` > 0 (the
    fit stage passes the record bin width), at the lowest x where F has risen
    by ``min_gain`` above its value there. We add this: below it every curve
    is still at the base reward, and which fitted R0 is highest is noise, not
    a best key. A frontier that never rises that much gets no n* fit, and its
    status says so.

    ``fits`` rows: kind ``sigmoid_<design>`` (one per key) and ``n_star``
    (n design) or ``n_star_<design>``; a family with no group for the design
    gets one ``n_star`` row whose status says why.
    """
    if design not in DESIGNS:
        raise ValueError(f"design: expected one of {list(DESIGNS)}, got {design!r}")
    _require(points, "points", [*EVAL_COLUMNS, "n", "b_problem", "b", "is_record", *FAMILY])
    if int(grid_points) != grid_points or grid_points < 2:
        raise ValueError(f"grid_points: expected an integer >= 2, got {grid_points!r}")
    if not (math.isfinite(min_gain) and min_gain >= 0):
        raise ValueError(f"min_gain: expected a non-negative number, got {min_gain!r}")
    groups, missing = _design_groups(points, design)
    fit_rows = [_fit_row(_n_star_kind(design), design, m["bucket"], m["rule"], m["fixed"], None, n_points=0,
                         status=m["status"]) for m in missing]
    if points.empty:
        fit_rows = [_fit_row(_n_star_kind(design), design, None, None, None, None, n_points=0,
                             status="no evaluations of finished runs")]
    parts = [_frontier_for_group(g, design, int(grid_points), float(min_gain)) for g in groups]
    fits_rows = [*(r for p in parts for r in p.fits.to_dict("records")), *fit_rows]
    return FrontierTables(
        fits=_fits_frame(fits_rows),
        frontier=_concat([p.frontier for p in parts], _FRONTIER_COLUMNS),
        transitions=_concat([p.transitions for p in parts], _TRANSITION_COLUMNS),
    )


# ---------------------------------------------------------------------------
# steps to target: S(B), E(B)


@dataclass(frozen=True)
class SteppedTables:
    """Rows of the ``steps_to_target`` table and the ``steps_to_target_<axis>`` fits."""

    steps_to_target: pd.DataFrame
    fits: pd.DataFrame


def target_reward(evals: pd.DataFrame, target: float | None = None, gain_fraction: float = 0.5) -> tuple[float, str]:
    """The target validation reward R* of a family, and where it came from (science §7, S(B)).

    A ``target`` from params is used as it is. Without one, R* = base +
    ``gain_fraction`` × (best − base), with base the mean step-0 evaluation of
    the runs (each run's first evaluation where there is no step 0) and best
    the highest validation reward any of them reached.
    """
    _require(evals, "evals", EVAL_COLUMNS)
    if target is not None:
        if not (math.isfinite(target) and 0.0 <= target <= 1.0):
            raise ValueError(f"target: expected a reward in [0, 1] or None, got {target!r}")
        return float(target), "params"
    if not (math.isfinite(gain_fraction) and 0.0 < gain_fraction <= 1.0):
        raise ValueError(f"gain_fraction: expected a number in (0, 1], got {gain_fraction!r}")
    if evals.empty:
        raise ValueError("evals: expected at least one evaluation to set a default target")
    first = evals.sort_values("step").groupby("run_id").head(1)
    base = float(first["avg_at_k"].mean())
    best = float(evals["avg_at_k"].max())
    at = "step-0" if (first["step"] == 0).all() else "first-evaluation"
    value = base + gain_fraction * (best - base)
    return value, (f"default: {at} base {base:.4g} + {gain_fraction:g} × best gain {best - base:.4g}")


def _axis_groups(fam: pd.DataFrame, axis: str) -> list[tuple[str, pd.DataFrame]]:
    out = []
    if axis == "prompt":  # n fixed, B_problem varies
        for n_value, g in fam.groupby("n"):
            if g["b_problem"].nunique() >= 2:
                out.append((f"n={int(n_value)}", g))
    else:  # B_problem fixed, n varies
        for b_value, g in fam.groupby("b_problem"):
            if g["n"].nunique() >= 2:
                out.append((f"B_problem={int(b_value)}", g))
    return out


def steps_to_target_analysis(
    evals: pd.DataFrame, target: float | None = None, gain_fraction: float = 0.5
) -> SteppedTables:
    """S(B), E(B) = B·S(B) and the fit S(B) = S_min (1 + B_crit / B), per axis (science §7).

    ``evals`` is :func:`run_evals`'s table. Per family the target R* comes from
    :func:`target_reward` (``target_source`` says which). Along the prompt axis
    (runs with the same n, B_problem varying) and the rollout axis (same
    B_problem, n varying), each run's S is its first evaluated step with
    validation reward >= R*; runs that never got there have ``reached`` False
    and no S; runs already there at step 0 (S = 0) are listed but carry no
    information about B and are left out of the fit. A family without such
    runs on an axis gets one fit row whose status says so.
    """
    _require(evals, "evals", [*EVAL_COLUMNS, "n", "b_problem", "b", *FAMILY])
    rows, fit_rows = [], []
    if evals.empty:
        fit_rows = [_fit_row(f"steps_to_target_{a}", a, None, None, None, None, n_points=0,
                             status="no evaluations of finished runs") for a in AXES]
    for (bucket, rule), fam in _families(evals):
        value, source = target_reward(fam, target, gain_fraction)
        for axis in AXES:
            groups = _axis_groups(fam, axis)
            if not groups:
                why = ("no two runs with the same n and different B_problem" if axis == "prompt"
                       else "no two runs with the same B_problem and different n")
                fit_rows.append(_fit_row(f"steps_to_target_{axis}", axis, bucket, rule, None, None, target=value,
                                         target_source=source, n_points=0, status=why))
                continue
            for fixed, g in groups:
                group_rows = []
                for run_id, r in g.groupby("run_id"):
                    s = fit.steps_to_target(r["step"].to_numpy(float), r["avg_at_k"].to_numpy(float), value)
                    first = r.iloc[0]
                    b = int(first["b"])
                    group_rows.append({
                        "axis": axis, "bucket": bucket, "rule": rule, "fixed": fixed, "run_id": run_id,
                        "seed": first["seed"], "n": int(first["n"]), "b_problem": int(first["b_problem"]), "b": b,
                        "target": value, "target_source": source, "reached": s is not None,
                        "steps": math.nan if s is None else float(s), "e": math.nan if s is None else float(b * s),
                    })
                rows += group_rows
                usable = [r for r in group_rows if r["reached"] and r["steps"] > 0]
                f = fit.fit_steps_to_target([r["b"] for r in usable], [r["steps"] for r in usable])
                n_not = sum(not r["reached"] for r in group_rows)
                n_start = sum(r["reached"] and r["steps"] == 0 for r in group_rows)
                values = f.to_dict()
                if not f.ok and (n_not or n_start):
                    values["status"] = (f"{f.status}; of {len(group_rows)} runs {n_not} never reached the target "
                                        f"{value:.4g} and {n_start} were there at step 0")
                fit_rows.append(_fit_row(f"steps_to_target_{axis}", axis, bucket, rule, fixed, None, target=value,
                                         target_source=source, n_not_reached=n_not, n_at_start=n_start, **values))
    columns = ["axis", "bucket", "rule", "fixed", "run_id", "seed", "n", "b_problem", "b", "target", "target_source",
               "reached", "steps", "e"]
    table = pd.DataFrame(rows, columns=columns)
    return SteppedTables(steps_to_target=table, fits=_fits_frame(fit_rows))


# ---------------------------------------------------------------------------
# CRS prediction check


def measured_crs(noise_steps: pd.DataFrame | None, bucket: str | None = None) -> tuple[float, int | None, str]:
    """The CRS to predict the best n with: (crs, the n it was measured at, status) (science §6.3, §7).

    The median over measurement steps of ``crs`` at the largest n measured
    (the "short run at large n"); infinite values count (an infinite median
    means "the largest n"). Where the table has a ``bucket`` column and rows
    for ``bucket``, only those are used. A missing table, or no finite-or-
    infinite positive CRS, gives NaN with the reason.
    """
    if noise_steps is None or noise_steps.empty:
        return math.nan, None, "CRS not measured (no noise_steps table: run the measure stage)"
    _require(noise_steps, "noise_steps", ["n", "crs"])
    ns = noise_steps
    if bucket is not None and "bucket" in ns.columns and (ns["bucket"].astype(str) == bucket).any():
        ns = ns[ns["bucket"].astype(str) == bucket]
    n_vals = pd.to_numeric(ns["n"], errors="coerce").dropna()
    if n_vals.empty:
        return math.nan, None, "CRS not measured (noise_steps has no n)"
    n_max = int(n_vals.max())
    crs = pd.to_numeric(ns.loc[pd.to_numeric(ns["n"], errors="coerce") == n_max, "crs"], errors="coerce").dropna()
    crs = crs[crs > 0]
    if crs.empty:
        return math.nan, n_max, f"CRS not measured (no positive CRS at n = {n_max})"
    return float(np.median(crs.to_numpy(float))), n_max, "ok"


def crs_prediction(evals: pd.DataFrame, noise_steps: pd.DataFrame | None) -> pd.DataFrame:
    """The CRS-predicted best n beside the observed best n (science §7, CRS from §6.3).

    Per family, the comparison groups are the runs sharing a total batch B
    with at least two n (basis "iso-batch"); where no two n share a B, runs
    with the same B_problem and C_max (basis "same B_problem and C_max", B
    then varies with n and ``b`` is NaN). A run's reward is its final
    validation avg@k, averaged over seeds per n. The CRS is
    :func:`measured_crs`; where it is missing, ``predicted_n`` and ``agree``
    are empty and ``status`` says "not measured".
    """
    _require(evals, "evals", [*EVAL_COLUMNS, "n", "b_problem", "b", "c_max", *FAMILY])
    columns = ["bucket", "rule", "basis", "b", "b_problem", "c_max", "crs", "crs_n", "predicted_n",
               "observed_best_n", "observed_best_reward", "reward_by_n", "agree", "status"]
    rows = []
    if evals.empty:
        rows.append({"status": "no evaluations of finished runs"})
    for (bucket, rule), fam in _families(evals):
        final = fam.sort_values("step").groupby("run_id").tail(1)
        crs, crs_n, crs_status = measured_crs(noise_steps, bucket)
        comparisons = [(f"iso-batch: B = {int(b)}", float(b), math.nan, math.nan, g)
                       for b, g in final.groupby("b") if g["n"].nunique() >= 2]
        if not comparisons:
            for (bp, cm), g in final.groupby(["b_problem", "c_max"], dropna=False):
                if g["n"].nunique() >= 2:
                    basis = f"same B_problem = {int(bp)} and C_max = {cm:g} (no two n share a total batch B)"
                    comparisons.append((basis, math.nan, float(bp), float(cm), g))
        if not comparisons:
            rows.append({"bucket": bucket, "rule": rule, "crs": crs, "crs_n": crs_n,
                         "status": "no runs with two or more n under a fixed B, or a fixed B_problem and C_max"})
            continue
        for basis, b, bp, cm, g in comparisons:
            reward_by_n = {int(n): float(v) for n, v in g.groupby("n")["avg_at_k"].mean().items()}
            p = fit.predicted_vs_observed_best_n(crs, reward_by_n)
            rows.append({
                "bucket": bucket, "rule": rule, "basis": basis, "b": b, "b_problem": bp, "c_max": cm,
                "crs": crs, "crs_n": crs_n, "predicted_n": p.predicted_n, "observed_best_n": p.observed_best_n,
                "observed_best_reward": p.observed_best_reward,
                "reward_by_n": ", ".join(f"{n}: {v:.4g}" for n, v in sorted(reward_by_n.items())),
                "agree": p.agree if p.predicted_n is not None else None, "status": crs_status,
            })
    df = pd.DataFrame(rows, columns=columns)
    for col in ("predicted_n", "observed_best_n", "crs_n"):
        df[col] = pd.array([None if v is None or pd.isna(v) else int(v) for v in df[col]], dtype="Int64")
    df["agree"] = pd.array([None if v is None or pd.isna(v) else bool(v) for v in df["agree"]], dtype="boolean")
    for col in ("b", "b_problem", "c_max", "crs", "observed_best_reward"):
        df[col] = pd.to_numeric(df[col], errors="coerce").astype(float)
    return df
