"""The report's summary tables (science §2, §6.3, §7), formatted as strings."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from rollscale.core.noise.pooled import PIECES, RESOLVED, RHO_S, UNRESOLVED, pooled_noise, prompts_to_resolve
from rollscale.core.noise.summary import summary_stats
from rollscale.report.base import (
    MIN_INTERVAL_SEEDS,
    TableSpec,
    check_tables,
    fmt_interval,
    fmt_value,
    format_frame,
    absent,
    as_numeric,
    require_columns,
)
from rollscale.report.charts.noise import k_sat_null_by_n, usable_k_sat, quintile_tables
from rollscale.report.reasons import runs_as_ended
from rollscale.report.charts.search import table_search
from rollscale.report.horizon import table_more_compute
from rollscale.tables import table_stage


def _table_bucket_counts(t: dict[str, pd.DataFrame | None]) -> TableSpec:
    name, title = "bucket_counts", "Bucket counts"
    caption = "Problems per difficulty bucket and split (science §2), with the avg@k range found in each bucket."
    b = t["buckets"]
    if b is None:
        return TableSpec(name, title, caption, missing=absent(t, "buckets", "buckets"))
    require_columns(b, "buckets", ["problem_id", "bucket", "split"])
    counts = pd.crosstab(b["bucket"].astype(str), b["split"].astype(str))
    counts["total"] = counts.sum(axis=1)
    counts = counts.reset_index().rename(columns={"row_0": "bucket"})
    counts.columns.name = None
    prof = t["profile"]
    if prof is not None and {"problem_id", "avg_at_k"} <= set(prof.columns):
        merged = b.merge(prof[["problem_id", "avg_at_k"]], on="problem_id", how="left")
        merged["avg_at_k"] = as_numeric(merged["avg_at_k"])
        rng = merged.groupby(merged["bucket"].astype(str))["avg_at_k"].agg(["min", "max"])
        counts["avg@k min"] = counts["bucket"].map(rng["min"])
        counts["avg@k max"] = counts["bucket"].map(rng["max"])
    return TableSpec(name, title, caption, frame=format_frame(counts))


def _table_profile(t: dict[str, pd.DataFrame | None]) -> TableSpec:
    name, title = "profile_summary", "Difficulty profile"
    caption = "The profiled problem pool by source (science §2): avg@k, length in tokens and truncation rate."
    prof = t["profile"]
    if prof is None:
        return TableSpec(name, title, caption, missing=absent(t, "profile", "difficulty profile"))
    require_columns(prof, "profile", ["problem_id", "avg_at_k"])
    df = prof.copy()
    df["source"] = df["source"].astype(str) if "source" in df else "all"
    df["avg_at_k"] = as_numeric(df["avg_at_k"])
    rows = []
    for source, g in [("all", df), *(df.groupby("source") if df["source"].nunique() > 1 else [])]:
        rows.append(
            {
                "source": source,
                "problems": len(g),
                "k": fmt_value(as_numeric(g["k"]).max()) if "k" in g else "—",
                "mean avg@k": g["avg_at_k"].mean(),
                "avg@k = 0": int((g["avg_at_k"] == 0).sum()),
                "avg@k = 1": int((g["avg_at_k"] == 1).sum()),
                "mean length [tokens]": as_numeric(g["mean_len"]).mean() if "mean_len" in g else math.nan,
                "truncation rate": as_numeric(g["trunc_rate"]).mean() if "trunc_rate" in g else math.nan,
            }
        )
    return TableSpec(name, title, caption, frame=format_frame(pd.DataFrame(rows)))


def _table_k_sat_summary(t: dict[str, pd.DataFrame | None]) -> TableSpec:
    name, title = "k_sat_summary", "Split-half K_sat, unfiltered and IQR-filtered, beside its null"
    caption = (
        "Split-half K_sat over all measured prompts (science §6.3) with the null |R| + 1 beside it and the ratio "
        "K_sat / (|R| + 1); a ratio near 1 means the estimator saw nothing beyond exchangeable rollouts."
    )
    np_ = t["noise_prompts"]
    if np_ is None:
        return TableSpec(name, title, caption, missing=absent(t, "noise_prompts", "noise measurements"))
    require_columns(np_, "noise_prompts", ["n", "pass_rate", "k_sat"])
    df = usable_k_sat(np_)
    if df.empty:
        return TableSpec(name, title, caption, missing="The `noise_prompts` table has no prompt with a defined K_sat.")
    nulls = k_sat_null_by_n(df)
    rows = []
    for n_value, g in df.groupby("n"):
        stats = summary_stats(g["k_sat"].to_numpy())
        null = nulls[int(n_value)]
        n_inf = int(np.isinf(g["k_sat"]).sum())
        for stat in ("count", "mean", "median", "std", "max"):
            unf, fil = stats[stat], stats[f"{stat}_filtered"]
            ratio = stat in ("mean", "median", "max")
            rows.append(
                {
                    "n": int(n_value),
                    "statistic": stat + (f" ({n_inf} infinite)" if stat == "count" and n_inf else ""),
                    "unfiltered": unf,
                    "IQR-filtered": fil,
                    "null |R|+1": null if ratio else math.nan,
                    "unfiltered / null": unf / null if ratio else math.nan,
                    "filtered / null": fil / null if ratio else math.nan,
                }
            )
    return TableSpec(name, title, caption, frame=format_frame(pd.DataFrame(rows)))


def _tables_quintiles(t: dict[str, pd.DataFrame | None]) -> list[TableSpec]:
    specs = []
    labels = {
        "unfiltered": ("k_sat_quintiles", "K_sat by pass-rate quintile (unfiltered)"),
        "iqr_filtered": ("k_sat_quintiles_filtered", "K_sat by pass-rate quintile (IQR-filtered)"),
    }
    caption = (
        "Split-half K_sat by pass-rate quintile (science §6.3): count, mean, median and std, with the null |R| + 1 "
        "and median / null beside them."
    )
    np_ = t["noise_prompts"]
    frames: dict[str, pd.DataFrame] = {}
    missing = None
    if np_ is None:
        missing = absent(t, "noise_prompts", "noise measurements")
    else:
        require_columns(np_, "noise_prompts", ["n", "pass_rate", "k_sat"])
        if usable_k_sat(np_).empty:
            missing = "The `noise_prompts` table has no prompt with a defined K_sat."
        else:
            frames = quintile_tables(np_)
    for key, (name, title) in labels.items():
        if missing is not None:
            specs.append(TableSpec(name, title, caption, missing=missing))
        else:
            specs.append(TableSpec(name, title, caption, frame=format_frame(frames[key])))
    return specs


def _table_noise_steps(t: dict[str, pd.DataFrame | None]) -> TableSpec:
    name, title = "noise_steps", "Step-level gradient noise"
    caption = ("Per measurement step (science §6.2, §6.3): between-prompt signal |G|^2 (beside the biased all-pairs "
               "form where logged), B_simple per step and its EMA, B_naive beside them (its bias has no fixed sign: "
               "never read it alone), prompt- and rollout-axis noise, rho_icc, K_crit and CRS.")
    ns = t["noise_steps"]
    if ns is None:
        return TableSpec(name, title, caption, missing=absent(t, "noise_steps", "noise measurements"))
    cols = [c for c in ("step", "n", "g_norm2", "g_norm2_all_pairs", "b_simple", "b_simple_ema", "b_naive",
                        "prompt_noise", "rollout_noise", "rho_icc", "k_sat_icc", "k_crit", "crs") if c in ns.columns]
    return TableSpec(name, title, caption, frame=format_frame(ns[cols].sort_values(cols[:2])))


REWARD_PARAMS = ("r0", "a", "frontier_reward", "target")  # in [0, 1] for 0/1 rewards


def fit_cell(param: str, value: Any, lo: Any, hi: Any, seeds: int | None) -> str:
    """A fitted value with its bootstrap interval where the interval is one (science §7, §9.3): ``seeds`` >= 3
    (None: a row that does not say), the estimate strictly inside it; a reward's interval clipped to [0, 1].
    Otherwise the value and why not."""
    v, lo_f, hi_f = (float(pd.to_numeric(x, errors="coerce")) for x in (value, lo, hi))
    if math.isnan(v):
        return "—"
    if math.isnan(lo_f) or math.isnan(hi_f) or (seeds is not None and seeds < 2):
        return fmt_interval(v, math.nan, math.nan)
    if seeds is not None and seeds < MIN_INTERVAL_SEEDS:
        return fmt_interval(v, math.nan, math.nan, no_interval=f"{seeds} seeds, no interval")
    if param in REWARD_PARAMS:
        lo_f, hi_f = max(lo_f, 0.0), min(hi_f, 1.0)
    if not lo_f < v < hi_f:
        return fmt_interval(v, math.nan, math.nan, no_interval="at the edge of its bootstrap: no interval")
    return fmt_interval(v, lo_f, hi_f)


_READINGS = {
    UNRESOLVED: "signal not resolved: |G|² is not above 0 within its interval, so no noise scale means anything yet; "
                "measure more prompts (measure.b_problem) or steps (measure.steps)",
    RHO_S: "K_crit infinite because rho s > |G|²: rollouts of one prompt share so much of their gradient that no n "
           "reaches the signal; add prompts, not rollouts (science §6.3)",
    RESOLVED: "resolved: every noise scale has a finite estimate",
}
_POOLED = (("g_norm2", "|G|²"), ("b_simple", "B_simple [rollouts]"), ("prompt_noise", "prompt-axis B_noise [prompts]"),
           ("rollout_noise", "rollout-axis noise [rollouts]"), ("rho_icc", "rho_icc"), ("k_sat_icc", "K_sat_icc"),
           ("k_crit", "K_crit [rollouts]"))


def _table_noise_pooled(t: dict[str, pd.DataFrame | None]) -> TableSpec:
    name, title = "noise_pooled", "Gradient noise pooled over steps"
    caption = ("Every measured step's prompts pooled before any ratio (science §6.2: numerators and denominators "
               "smoothed over steps first), with a 95 % bootstrap interval over prompts (resampled within each "
               "step); per n. The reading tells a signal not resolved (measure more prompts) from an infinite K_crit "
               "because rho s > |G|² (science §6.3: add prompts, not rollouts).")
    np_ = t["noise_prompts"]
    if np_ is None:
        return TableSpec(name, title, caption, missing=absent(t, "noise_prompts", "noise measurements"))
    if not set(PIECES) <= set(np_.columns):
        return TableSpec(name, title, caption, missing="The `noise_prompts` table predates the per-prompt pieces "
                         "these estimates pool: rerun the `measure` stage (dvc repro measure).")
    rows = []
    for n_value, g in np_.groupby("n", sort=True):
        try:
            pooled = pooled_noise(g, int(n_value))
        except ValueError as exc:
            rows.append({"n": int(n_value), "reading": str(exc)})
            continue
        row: dict[str, Any] = {"n": int(n_value),
                               "steps × prompts": f"{pooled.steps} × {pooled.prompts // pooled.steps}"}
        for key, label in _POOLED:
            v, lo, hi = pooled.values[key]
            row[label] = fmt_interval(v, lo, hi, no_interval="no interval")
        reading = _READINGS[pooled.reading]
        need = prompts_to_resolve(pooled)
        if need is not None:
            per_step = math.ceil(need[0] / pooled.steps)
            reading += (f" (at {pooled.steps} steps, {'at least' if need[1] else 'about'} {fmt_value(per_step)} "
                        "prompts a step would resolve this one)")
        rows.append({**row, "reading": reading})
    return TableSpec(name, title, caption, frame=pd.DataFrame(rows).fillna("—"))


def _tables_fits(t: dict[str, pd.DataFrame | None]) -> list[TableSpec]:
    caption = (f"Fitted values with 95 % bootstrap intervals over seeds [lo, hi] (science §7), shown only for a key "
               f"with {MIN_INTERVAL_SEEDS} or more seeds: the bootstrap of 1-2 seeds is no interval (science §9.3; "
               "the decision above pools the seed spread across keys instead). Rewards (R0, A) are clipped to "
               "[0, 1]; an interval whose estimate sits on its edge (a fit at a bound) is not shown. Least-squares "
               "SEs, which treat pooled record points as independent and understate the error, stay in the fits "
               "table as <param>_se. R², points used and fit status.")
    fits = t["fits"]
    if fits is None:
        return [TableSpec("fits", "Fits", caption, missing=absent(t, "fits", "fits"))]
    require_columns(fits, "fits", ["kind"])
    specs = []
    params_cols = [c for c in fits.columns if f"{c}_lo" in fits.columns or f"{c}_se" in fits.columns]
    for kind, g in fits.groupby(fits["kind"].astype(str), sort=False):
        present = [c for c in params_cols if as_numeric(g[c]).notna().any()]
        rows = []
        for _, r in g.iterrows():
            row: dict[str, Any] = {}
            if "key" in g and g["key"].notna().any():
                row["key"] = fmt_value(r["key"])
            for c in ("fixed", "rule"):  # only where the kind's rows differ in them
                if c in g and g[c].astype(str).nunique() > 1:
                    row[c] = str(r[c])
            seeds = int(pd.to_numeric(r.get("n_seeds"), errors="coerce")) if pd.notna(r.get("n_seeds")) else None
            for c in present:
                row[c] = fit_cell(c, r[c], r.get(f"{c}_lo", math.nan), r.get(f"{c}_hi", math.nan), seeds)
            for c in ("verdict", "time_verdict", "at_bound", "r2", "n_points", "status"):
                if c in g and g[c].replace("", np.nan).notna().any():  # at_bound is "" where no bound was hit
                    row[c] = fmt_value(r[c]) if not isinstance(r[c], str) else r[c]
            rows.append(row)
        specs.append(TableSpec(f"fits_{kind}", f"Fit: {kind}", caption, frame=pd.DataFrame(rows)))
    return specs


def _table_steps_to_target(t: dict[str, pd.DataFrame | None]) -> TableSpec:
    name, title = "steps_to_target", "Steps to target"
    caption = (
        "First step S at which validation reward reached the target, and E = B·S rollouts trained on, per batch "
        "size B (science §7); the S(B) fits are under Fits."
    )
    st = t["steps_to_target"]
    if st is None:
        return TableSpec(name, title, caption, missing=absent(t, "steps_to_target", "steps-to-target results"))
    cols = [c for c in ("axis", "target", "n", "b_problem", "b", "steps", "e") if c in st.columns]
    order = [c for c in ("axis", "b") if c in cols]
    return TableSpec(name, title, caption, frame=format_frame(st[cols].sort_values(order)))


def _table_crs(t: dict[str, pd.DataFrame | None]) -> TableSpec:
    name, title = "crs_prediction", "CRS prediction check"
    caption = (
        "Best n predicted by the measured CRS beside the observed best n under each fixed total batch B (science §7); "
        "the shares of seed resamples whose best n is the observed / the predicted one."
    )
    cp = t["crs_prediction"]
    if cp is None:
        return TableSpec(name, title, caption, missing=absent(t, "crs_prediction", "CRS prediction check"))
    wanted = ("b", "crs", "predicted_n", "observed_best_n", "observed_best_reward", "agree", "observed_best_share",
              "predicted_share", "interval")
    cols = [c for c in wanted if c in cp.columns]
    return TableSpec(name, title, caption, frame=format_frame(cp[cols]))


def _table_transitions(t: dict[str, pd.DataFrame | None]) -> TableSpec:
    name, title = "epoch_transitions", "Epochs at frontier transitions"
    caption = (
        "Where the frontier's argmax changes from one key to the next, the epochs the new best run had completed "
        "(science §7)."
    )
    et = t["epoch_transitions"]
    if et is None:
        return TableSpec(name, title, caption, missing=absent(t, "epoch_transitions", "frontier transitions"))
    return TableSpec(name, title, caption, frame=format_frame(et))


def _table_runs(t: dict[str, pd.DataFrame | None]) -> TableSpec:
    name, title = "runs", "Runs"
    caption = (
        "Every sweep run with its design, the compute it used, and its final and peak validation avg@k "
        "(science §1, §5)."
    )
    runs = t["runs"]
    if runs is None:
        return TableSpec(name, title, caption, missing=absent(t, "runs", "sweep runs"))
    require_columns(runs, "runs", ["run_id"])
    runs = runs_as_ended(runs, t["steps"])  # an interrupted run at its last step, as `rollscale status` has it
    cols = [c for c in ("run_id", "bucket", "n", "b_problem", "m", "rule", "seed", "c_max", "status", "steps", "c")
            if c in runs.columns]
    df = runs[cols].copy()
    df["run_id"] = df["run_id"].astype(str)
    ev = t["evals"]
    if ev is not None and {"run_id", "c", "avg_at_k"} <= set(ev.columns):
        e = ev[["run_id", "c", "avg_at_k"]].copy()
        e["run_id"] = e["run_id"].astype(str)
        e["c"], e["avg_at_k"] = as_numeric(e["c"]), as_numeric(e["avg_at_k"])
        e = e.dropna().sort_values(["run_id", "c"])
        last = e.groupby("run_id").tail(1).set_index("run_id")
        best = e.loc[e.groupby("run_id")["avg_at_k"].idxmax()].set_index("run_id")
        df["final avg@k"] = df["run_id"].map(last["avg_at_k"])
        df["peak avg@k"] = df["run_id"].map(best["avg_at_k"])
        df["C at peak [rollouts]"] = df["run_id"].map(best["c"])
    st = t["steps"]
    if st is not None and "run_id" in st.columns:
        s = st.copy()
        s["run_id"] = s["run_id"].astype(str)
        if "c_tokens" in s:
            df["tokens generated"] = df["run_id"].map(s.groupby("run_id")["c_tokens"].max())
        timing = [c for c in ("t_generate", "t_score", "t_train") if c in s]
        if timing:
            total = s[timing].apply(pd.to_numeric, errors="coerce").sum(axis=1).groupby(s["run_id"]).sum()
            df["time [s]"] = df["run_id"].map(total)
    return TableSpec(name, title, caption, frame=format_frame(df))


def _table_stages(t: dict[str, pd.DataFrame | None]) -> TableSpec:
    empty = getattr(t, "empty", frozenset())
    rows = [
        {"table": name, "stage": table_stage(name),
         "rows": "0 (empty)" if name in empty else "missing" if df is None else str(len(df))}
        for name, df in t.items()
    ]
    return TableSpec(
        "stages",
        "Study tables",
        "Which study tables the report found, and the stage that writes each.",
        frame=pd.DataFrame(rows),
    )


def summary_tables(tables: Mapping[str, pd.DataFrame | None]) -> list[TableSpec]:
    """The report's tables, formatted as strings, in order (science §2, §6.3, §7).

    (The claims lead the report from :func:`rollscale.report.answer.study_answer`.)
    Study tables found; bucket counts; difficulty profile; split-half K_sat
    summary (unfiltered and IQR-filtered, with the null |R| + 1 and the
    ratio beside it); K_sat by pass-rate quintile, unfiltered and filtered;
    step-level noise; one table per fit kind with parameters ± SE, R²,
    points and status; steps to target; epochs at frontier transitions; CRS
    prediction check; runs; the search's decisions (science §9.4). A missing table gives a TableSpec saying which
    stage to run.
    """
    t = check_tables(tables)
    return [
        _table_stages(t),
        _table_bucket_counts(t),
        _table_profile(t),
        _table_k_sat_summary(t),
        *_tables_quintiles(t),
        _table_noise_pooled(t),
        _table_noise_steps(t),
        *_tables_fits(t),
        _table_steps_to_target(t),
        _table_transitions(t),
        _table_crs(t),
        _table_runs(t),
        table_search(t),
        table_more_compute(t),
    ]
