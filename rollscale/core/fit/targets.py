"""Steps and rollouts to a target reward, rules against uniform, and the CRS check (science §7).

DataFrames in, DataFrames out (see :mod:`rollscale.core.fit.analysis` for the
inputs). Every number a claim rests on carries a bootstrap interval over
seeds (:mod:`rollscale.core.fit.bootstrap`), or says "1 seed, no interval".
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from rollscale.core.fit import curves as fit
from rollscale.core.fit.bootstrap import Bootstrap, interval, interval_note, linear_inverse_b_refits, seeds_per_stratum
from rollscale.core.fit.bootstrap import weighted_means
from rollscale.core.fit.columns import CONFIG, EVAL_COLUMNS, FAMILY, families, fit_row, fits_frame, require

__all__ = [
    "AXES",
    "SteppedTables",
    "crs_prediction",
    "measured_crs",
    "rule_comparison",
    "steps_to_target_analysis",
    "target_reward",
]

AXES: tuple[str, ...] = ("prompt", "rollout")
UNIFORM = "uniform"


def _salt(ids: tuple) -> int:
    return zlib.crc32(repr(ids).encode())


def _steps_intervals(f: fit.StepsToTargetFit, usable: list[dict], boot: Bootstrap, ids: tuple) -> dict[str, Any]:
    """S(B) refitted on runs resampled within each B: intervals of S_min, B_crit, E_min."""
    names = ("s_min", "b_crit", "e_min")
    seeds = seeds_per_stratum([r["b"] for r in usable])
    out: dict[str, Any] = {f"{q}_{end}": math.nan for q in names for end in ("lo", "hi")}
    if f.ok and boot.resamples and seeds >= 2:
        counts = boot.run_counts([r["b"] for r in usable], salt=_salt(ids))
        refit = linear_inverse_b_refits([r["b"] for r in usable], [r["steps"] for r in usable], counts)
        with np.errstate(invalid="ignore", divide="ignore"):
            values = {"s_min": refit[:, 0], "b_crit": refit[:, 1] / refit[:, 0], "e_min": refit[:, 1]}
        for q in names:
            out[f"{q}_lo"], out[f"{q}_hi"] = (float(v) for v in interval(values[q], seeds))
    return {**out, "n_seeds": seeds, "interval": interval_note(seeds, boot.resamples)}


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
    require(evals, "evals", EVAL_COLUMNS)
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
    evals: pd.DataFrame, target: float | None = None, gain_fraction: float = 0.5, boot: Bootstrap | None = None
) -> SteppedTables:
    """S(B), E(B) = B·S(B) and the fit S(B) = S_min (1 + B_crit / B), per axis (science §7).

    ``evals`` is :func:`run_evals`'s table. Per family the target R* comes from
    :func:`target_reward` (``target_source`` says which). Along the prompt axis
    (runs with the same n, B_problem varying) and the rollout axis (same
    B_problem, n varying), each run's S is its first evaluated step with
    validation reward >= R*; runs that never got there have ``reached`` False
    and no S; runs already there at step 0 (S = 0) are listed but carry no
    information about B and are left out of the fit. A family without such
    runs on an axis gets one fit row whose status says so. With ``boot``, the
    runs of each B are resampled (seeds, with replacement) and S(B) refitted:
    ``s_min_lo/_hi``, ``b_crit_lo/_hi``, ``e_min_lo/_hi``.
    """
    boot = boot if boot is not None else Bootstrap(0)
    require(evals, "evals", [*EVAL_COLUMNS, "n", "b_problem", "b", *FAMILY])
    rows, fit_rows = [], []
    if evals.empty:
        fit_rows = [fit_row(f"steps_to_target_{a}", a, None, None, None, None, n_points=0,
                             status="no evaluations of finished runs") for a in AXES]
    for (bucket, rule), fam in families(evals):
        value, source = target_reward(fam, target, gain_fraction)
        for axis in AXES:
            groups = _axis_groups(fam, axis)
            if not groups:
                why = ("no two runs with the same n and different B_problem" if axis == "prompt"
                       else "no two runs with the same B_problem and different n")
                fit_rows.append(fit_row(f"steps_to_target_{axis}", axis, bucket, rule, None, None, target=value,
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
                bands = _steps_intervals(f, usable, boot, (axis, bucket, rule, fixed))
                n_not = sum(not r["reached"] for r in group_rows)
                n_start = sum(r["reached"] and r["steps"] == 0 for r in group_rows)
                values = f.to_dict()
                if not f.ok and (n_not or n_start):
                    values["status"] = (f"{f.status}; of {len(group_rows)} runs {n_not} never reached the target "
                                        f"{value:.4g} and {n_start} were there at step 0")
                fit_rows.append(fit_row(f"steps_to_target_{axis}", axis, bucket, rule, fixed, None, target=value,
                                        target_source=source, n_not_reached=n_not, n_at_start=n_start, **values,
                                        **bands))
    columns = ["axis", "bucket", "rule", "fixed", "run_id", "seed", "n", "b_problem", "b", "target", "target_source",
               "reached", "steps", "e"]
    table = pd.DataFrame(rows, columns=columns)
    return SteppedTables(steps_to_target=table, fits=fits_frame(fit_rows))


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
    require(noise_steps, "noise_steps", ["n", "crs"])
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


def _best_n_shares(g: pd.DataFrame, observed: int, predicted: int | None, boot: Bootstrap,
                   ids: tuple) -> dict[str, Any]:
    """Share of seed resamples whose best n is the observed one, and the predicted one."""
    seeds = seeds_per_stratum(g["n"])
    out = {"observed_best_share": math.nan, "predicted_share": math.nan, "n_seeds": seeds,
           "interval": interval_note(seeds, boot.resamples)}
    if seeds < 2 or not boot.resamples:
        return out
    counts = boot.run_counts(g["n"].to_numpy(), salt=_salt(ids))
    ns = sorted(int(n) for n in g["n"].unique())
    reward = g["avg_at_k"].to_numpy(float)
    means = np.stack([weighted_means(np.where(g["n"].to_numpy() == n, reward, np.nan), counts) for n in ns])
    best = np.asarray(ns)[np.argmax(means, axis=0)]  # ties to the smaller n, as the point estimate
    out["observed_best_share"] = float(np.mean(best == observed))
    if predicted is not None:
        out["predicted_share"] = float(np.mean(best == predicted))
    return out


def crs_prediction(evals: pd.DataFrame, noise_steps: pd.DataFrame | None,
                   boot: Bootstrap | None = None) -> pd.DataFrame:
    """The CRS-predicted best n beside the observed best n (science §7, CRS from §6.3).

    Per family, the comparison groups are the runs sharing a total batch B
    with at least two n (basis "iso-batch"); where no two n share a B, runs
    with the same B_problem and C_max (basis "same B_problem and C_max", B
    then varies with n and ``b`` is NaN). A run's reward is its final
    validation avg@k, averaged over seeds per n. The CRS is
    :func:`measured_crs`; where it is missing, ``predicted_n`` and ``agree``
    are empty and ``status`` says "not measured". With ``boot``, seeds are
    resampled within each n: ``observed_best_share`` / ``predicted_share`` are
    the shares of resamples whose best n is the observed / predicted one.
    """
    require(evals, "evals", [*EVAL_COLUMNS, "n", "b_problem", "b", "c_max", *FAMILY])
    columns = ["bucket", "rule", "basis", "b", "b_problem", "c_max", "crs", "crs_n", "predicted_n",
               "observed_best_n", "observed_best_reward", "reward_by_n", "agree", "observed_best_share",
               "predicted_share", "n_seeds", "interval", "status"]
    boot = boot if boot is not None else Bootstrap(0)
    rows = []
    if evals.empty:
        rows.append({"status": "no evaluations of finished runs"})
    for (bucket, rule), fam in families(evals):
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
                **_best_n_shares(g, p.observed_best_n, p.predicted_n, boot, (bucket, rule, basis)),
            })
    df = pd.DataFrame(rows, columns=columns)
    for col in ("predicted_n", "observed_best_n", "crs_n"):
        df[col] = pd.array([None if v is None or pd.isna(v) else int(v) for v in df[col]], dtype="Int64")
    df["agree"] = pd.array([None if v is None or pd.isna(v) else bool(v) for v in df["agree"]], dtype="boolean")
    for col in ("b", "b_problem", "c_max", "crs", "observed_best_reward"):
        df[col] = pd.to_numeric(df[col], errors="coerce").astype(float)
    return df


# ---------------------------------------------------------------------------
# rules against uniform: rollouts and step seconds to target

STEP_SECONDS = ("t_generate", "t_score", "t_train")  # a training step's phases; evaluation (t_eval) is not one


def _first_hit(r: pd.DataFrame, target: float) -> tuple[float, float]:
    """(steps, rollouts C) at a run's first evaluation with reward >= target; NaN if never."""
    hit = r[r["avg_at_k"] >= target].sort_values("step")
    return (float(hit["step"].iloc[0]), float(hit["c"].iloc[0])) if len(hit) else (math.nan, math.nan)


def _step_seconds(steps: pd.DataFrame | None) -> dict[Any, pd.DataFrame] | None:
    """Per run, its steps' (step, seconds = t_generate + t_score + t_train); None without timings."""
    if steps is None or not set(STEP_SECONDS) <= set(steps.columns):
        return None
    require(steps, "steps", ["run_id", "step"])
    seconds = steps[list(STEP_SECONDS)].apply(pd.to_numeric, errors="coerce").sum(axis=1, skipna=False)
    table = pd.DataFrame({"run_id": steps["run_id"], "step": steps["step"], "seconds": seconds})
    return dict(tuple(table.groupby("run_id")))


def _seconds_to(runs: dict[Any, pd.DataFrame] | None, run_id: Any, step: float) -> float:
    """Step seconds of a run up to and including ``step``; NaN if unreached, untimed or its rows stop short."""
    r = runs.get(run_id) if runs is not None else None
    if r is None or not math.isfinite(step) or r["step"].max() < step:
        return math.nan
    return float(r.loc[r["step"] <= step, "seconds"].sum(skipna=False))


def _ratio_verdict(lo: float, hi: float, seeds: int, fewer: str = "fewer rollouts", more: str = "more rollouts") -> str:
    """``fewer`` / ``more`` "than uniform" where the ratio's interval excludes 1, else not distinguishable."""
    if seeds < 2 or not math.isfinite(lo) or not math.isfinite(hi):
        return "no interval: cannot be told apart from uniform"
    if lo <= 1.0 <= hi:
        return "not distinguishable from uniform"
    return f"{fewer} than uniform" if hi < 1.0 else f"{more} than uniform"


# (column of the rule's mean, ratio column prefix, verdict column, words for fewer / more)
_RATIOS = (("rollouts", "ratio_to_uniform", "verdict", "fewer rollouts", "more rollouts"),
           ("seconds", "time_ratio_to_uniform", "time_verdict", "less step time", "more step time"))


def rule_comparison(evals: pd.DataFrame, target: float | None = None, gain_fraction: float = 0.5,
                    boot: Bootstrap | None = None, steps: pd.DataFrame | None = None) -> pd.DataFrame:
    """Steps, rollouts and step seconds to target per rule and config, each rule against uniform (science §4, §7).

    One target R* per bucket (:func:`target_reward` over all its rules, so
    rules are compared at the same reward). Per (bucket, rule, n, B_problem)
    the mean over seeds of the first step, and of the rollouts C, at which
    validation reward >= R* (runs that never got there are left out of the
    mean and counted in ``n_reached``). ``ratio_to_uniform`` = rule's mean
    rollouts / uniform's at the same bucket, n and B_problem; with ``boot``
    each side's seeds are resampled independently, and ``verdict`` says
    "not distinguishable from uniform" where the ratio's interval holds 1.

    With the sweep's ``steps`` table, ``seconds`` is a run's summed step time
    t_generate + t_score + t_train over its steps up to that first step
    (evaluation time excluded), averaged and bootstrapped like the rollouts,
    with ``time_ratio_to_uniform`` and ``time_verdict``: a rule that trains
    on fewer rollouts (PODS) makes cheaper steps, which rollouts do not show.
    These are wall seconds of the step on the machine that ran it, noisy
    under load: a comparison within one study only. Without ``steps`` (or
    its ``t_*`` columns) they are NaN. Rows of the ``fits`` table, kind
    ``rollouts_to_target``.
    """
    require(evals, "evals", [*EVAL_COLUMNS, *CONFIG])
    boot = boot if boot is not None else Bootstrap(0)
    timed = _step_seconds(steps)
    rows: list[dict] = []
    for bucket, fam in evals.groupby("bucket", sort=True):
        value, source = target_reward(fam, target, gain_fraction)
        samples: dict[tuple, np.ndarray] = {}
        for (rule, n, bp), g in fam.groupby(["rule", "n", "b_problem"], sort=True):
            hits = np.array([(*hit, _seconds_to(timed, run_id, hit[0]))
                             for run_id, r in g.groupby("run_id") for hit in [_first_hit(r, value)]]).reshape(-1, 3)
            seeds, reached = len(hits), int(np.isfinite(hits[:, 1]).sum())
            row = fit_row("rollouts_to_target", "rule", str(bucket), str(rule), f"n={int(n)}, B_problem={int(bp)}",
                          None, target=value, target_source=source, n_points=seeds, n_seeds=seeds,
                          n_reached=reached, interval=interval_note(seeds, boot.resamples),
                          status="ok" if reached else f"no run reached the target {value:.4g}")
            ids = (bucket, rule, int(n), int(bp))
            counts = boot.run_counts(np.zeros(seeds), salt=_salt(ids))
            for i, name in enumerate(("steps", "rollouts", "seconds")):
                row[name] = float(np.nanmean(hits[:, i])) if np.isfinite(hits[:, i]).any() else math.nan
                means = weighted_means(hits[:, i], counts)
                row[f"{name}_lo"], row[f"{name}_hi"] = (float(v) for v in interval(means, seeds))
                samples[(*ids, name)] = means
            rows.append(row)
        for row in rows:
            if row["bucket"] != str(bucket) or row["rule"] == UNIFORM:
                continue
            n, bp = (int(part.split("=")[1]) for part in row["fixed"].split(", "))
            base = next((r for r in rows if r["bucket"] == str(bucket) and r["rule"] == UNIFORM
                         and r["fixed"] == row["fixed"]), None)
            for name, ratio, verdict, fewer, more in _RATIOS:
                if base is None:
                    row[verdict] = "no uniform runs with this n and B_problem"
                    continue
                seeds = min(row["n_seeds"], base["n_seeds"])
                with np.errstate(invalid="ignore", divide="ignore"):
                    row[ratio] = float(np.float64(row[name]) / base[name])  # 0 at step 0: inf, not an error
                    ratios = samples[(bucket, row["rule"], n, bp, name)] / samples[(bucket, UNIFORM, n, bp, name)]
                row[f"{ratio}_lo"], row[f"{ratio}_hi"] = (float(v) for v in interval(ratios, seeds))
                row[verdict] = _ratio_verdict(row[f"{ratio}_lo"], row[f"{ratio}_hi"], seeds, fewer, more)
            if timed is None and base is not None:
                row["time_verdict"] = "no step timings (the sweep's steps table was not given or has no t_* columns)"
    return fits_frame(rows)
