"""The long grid of the embedded default (science §10, "What it must show"): every key n = 2 to 32 with 2 seeds,
trained to 4 x 40,000 = 160,000 rollouts, its ``runs``, ``steps`` and ``evals`` tables stored in the repository
(``benchmarks/data/long_grid/``) so that tests replay the forecast against it (tests/test_long_grid.py).

    python benchmarks/long_grid.py --artifacts /tmp/long-grid      # trains (resumes), then stores the tables
    python benchmarks/long_grid.py --artifacts /tmp/long-grid --store-only
    python benchmarks/long_grid.py --summary      # n*(C) and the forecasts from cut runs, from the stored tables
    python benchmarks/long_grid.py --grid benchmarks/data/long_grid --cut 40000 --target 160000 [--json]
    python benchmarks/long_grid.py --score benchmarks/data/long_grid /work/longgrid/seed1-tables --sim 24
    python benchmarks/long_grid.py --score GRID... --save rows.parquet; python benchmarks/long_grid.py --load rows.parquet

``--grid``: any folder holding ``runs``, ``evals`` (and ``steps``) Parquet files, with ``profile.parquet`` (the
profile rows of its validation problems) when the forecast is to be bounded by the base's pass@k (science
§11.2); every key's forecast at ``--target`` from its runs cut at ``--cut``, its interval and its error against
the grid's own value at the target (each key's per-run fit within its data, science §9.3). ``--score``: every
candidate form (rollscale.core.fit.forms, and the §10.1 surface) scored at 4x (40,000 to 160,000) and 8x
(20,000 to 160,000) on every grid folder given and on the simulated families (science §11.1-11.2); with two
grids or more, the form chosen leave-one-grid-out and its score on each held-out grid.

The study is the default one (``params.yaml``) with the sweep widened: ``sweep.n`` 2-32, seeds 0 and 1,
``c_max`` 160,000, every run to its end (``search.method: grid``). The base, profile and bucket stages run once
(skipped when their record is in ``--artifacts``); the sweep resumes its runs from their checkpoints, so the
script can be stopped and run again. Its sweep took 6,295 s of its last stretch beside other work, over two sessions
(docs/benchmarks.md, "The long grid"): no idle-machine figure.

On the evaluation schedule (science §9.1): every run is evaluated at 4 budgets a doubling from c_max / 64 =
2,500 rollouts: the same budgets a 40,000-rollout study evaluates at from 2,500 on (it starts at 625).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rollscale.pipeline.query.storage import table_files  # noqa: E402
from rollscale.pipeline.stages.record import read_record  # noqa: E402

OUT = ROOT / "benchmarks" / "data" / "long_grid"
SWEEP = {"n": [2, 4, 8, 16, 32], "seeds": [0, 1], "c_max": 160_000, "search": {"method": "grid"}}
PREPARE = ("base", "profile", "bucket")
# the steps' columns a replay or a reader of the curves needs (the rest: timing and the loss's parts, ~6x larger)
STEP_COLUMNS = ["run_id", "step", "c", "reward_mean", "zero_var_frac", "entropy", "kl", "grad_norm", "lr",
                "response_len_mean", "trunc_frac"]


def long_grid_params(params_file: Path) -> dict:
    params = yaml.safe_load(params_file.read_text())
    params["sweep"] = {**params["sweep"], **SWEEP, "search": {**params["sweep"].get("search", {}), **SWEEP["search"]}}
    # one torch thread: base's two (for a machine to itself) ran ~10x slower beside other jobs (2026-11-27)
    params["base"] = {**params["base"], "threads": 1}
    return params


def run_stage(stage: str, params: Path, artifacts: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "rollscale.pipeline.cli", "--artifacts", str(artifacts), "run", stage,
                    "--params", str(params)], check=True, cwd=ROOT, env=env)
    return time.perf_counter() - start


def read(artifacts: Path, name: str) -> pd.DataFrame:
    files = table_files(artifacts, name)
    if not files:
        raise SystemExit(f"{artifacts}: no {name} table (has the sweep run?)")
    return pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)


def store(artifacts: Path, out: Path = OUT) -> dict[str, int]:
    """The sweep's runs, evaluations and steps (:data:`STEP_COLUMNS`) as Parquet files under ``out``, and the
    profile rows of the runs' validation problems (``profile.parquet``: pass@k, science §11.2) where the study
    has its profile and buckets tables."""
    runs = read(artifacts, "runs")
    unfinished = runs.loc[runs["status"] != "finished", "run_id"].tolist()
    if unfinished:
        raise SystemExit(f"{artifacts}: runs not finished yet: {', '.join(unfinished)} (run the script again)")
    tables = {"runs": runs.sort_values("run_id"),
              "evals": read(artifacts, "evals").sort_values(["run_id", "step"]),
              "steps": read(artifacts, "steps")[STEP_COLUMNS].sort_values(["run_id", "step"])}
    if table_files(artifacts, "profile") and table_files(artifacts, "buckets"):
        buckets = read(artifacts, "buckets")
        val = buckets[(buckets["split"] == "val") & buckets["bucket"].isin(runs["bucket"].unique())]
        profile = read(artifacts, "profile")
        tables["profile"] = profile[profile["problem_id"].isin(val["problem_id"])][
            ["problem_id", "k", "n_correct", "avg_at_k"]].sort_values("problem_id")
    out.mkdir(parents=True, exist_ok=True)
    for name, table in tables.items():
        table.to_parquet(out / f"{name}.parquet", index=False, compression="zstd")
    return {name: len(t) for name, t in tables.items()}


# the budgets n*(C) is read at (within the long grid's data), and the cuts the forecast to C* = 160,000 starts from
BUDGETS = (10_000, 20_000, 40_000, 80_000, 160_000)
CUTS = (40_000, 80_000)


def stored_evals(folder: Path = OUT) -> pd.DataFrame:
    """A stored grid's evaluations with their runs' key ``n`` and seed (a clear error naming a missing file)."""
    for name in ("runs", "evals"):
        if not (folder / f"{name}.parquet").is_file():
            raise SystemExit(f"{folder}: no {name}.parquet (a grid folder holds runs, steps and evals Parquet files)")
    runs = pd.read_parquet(folder / "runs.parquet")
    return pd.read_parquet(folder / "evals.parquet").merge(runs[["run_id", "n", "seed"]], on="run_id")


def grid_ceiling(folder: Path) -> float | None:
    """The base's pass@k on the grid's validation problems (``profile.parquet``), None without one."""
    from rollscale.core.fit.passk import validation_ceiling

    file = folder / "profile.parquet"
    return validation_ceiling(pd.read_parquet(file)) if file.is_file() else None


def grid_truth(evals: pd.DataFrame, target: float) -> dict[int, float]:
    """Each key's own value at ``target`` (its per-run fits within its data, science §9.3)."""
    from rollscale.core.fit.decision import fit_runs, key_rewards

    est = key_rewards(fit_runs(evals, "n"), target)
    return dict(zip((int(k) for k in est.keys), est.reward.tolist(), strict=True))


def cut_forecast(evals: pd.DataFrame, cut: float, target: float, form: str, ceiling: float | None,
                 resamples: int = 200, calibrate: bool = True, eval_draws: int = 100 * 16) -> pd.DataFrame:
    """The ``forecast`` table's trained rows at ``target`` from ``evals`` cut at ``cut``; with ``calibrate``, the
    interval widened by the cut runs' own backtest at the same multiple (science §11.4)."""
    from rollscale.core.fit.backtest import backtest
    from rollscale.core.fit.forecast import ForecastSettings, bootstrap_surface, forecast_group
    from rollscale.core.fit.averaged import AveragedForm

    part = evals[evals["c"] <= cut]
    settings = ForecastSettings(resamples=resamples, eval_draws=eval_draws, seed=0, form=form, ceiling=ceiling,
                                multiple=target / cut)
    note = ""
    if calibrate:
        bt = backtest(part, "n", settings, multiple=target / cut)
        settings = replace(settings, widen=bt.widen, widen_d=bt.widen_d)
        note = bt.note
    boot = bootstrap_surface(part, "n", settings)
    rows = forecast_group(part, "n", target, settings=settings, boot=boot)
    weights = (", ".join(f"{n} {w:.2f} (backtest RMSE {e:.3f})" for n, w, e in
                         zip(boot.form.names, boot.form.weights, boot.form.rmse, strict=True))
               if isinstance(boot.form, AveragedForm) else "")
    return rows[rows["trained"]].assign(widen=settings.widen, backtest=note, weights=weights).reset_index(drop=True)


def grid_report(folder: Path, cut: float, target: float, form: str, calibrate: bool = True) -> pd.DataFrame:
    """:func:`cut_forecast` on a grid folder, each key's error against the grid's own value at ``target``."""
    evals = stored_evals(folder)
    ceiling = grid_ceiling(folder)
    rows = cut_forecast(evals, cut, target, form, ceiling, calibrate=calibrate)
    truth = grid_truth(evals, target)
    rows["grid"] = rows["key"].map(truth)
    rows["error"] = rows["reward"] - rows["grid"]
    rows["covered"] = (rows["reward_lo"] <= rows["grid"]) & (rows["grid"] <= rows["reward_hi"])
    rows["ceiling"] = ceiling if ceiling is not None else math.nan
    return rows


def summary(folder: Path = OUT) -> str:
    """n*(C) on the long grid (each key's per-run fit within its data, science §9.3, at each of :data:`BUDGETS`)
    and the forecast to 160,000 from the same runs cut at :data:`CUTS` (§10.2), as Markdown tables."""
    from rollscale.core.fit.decision import fit_runs, key_rewards
    from rollscale.core.fit.forecast import ForecastSettings, forecast_group

    evals = stored_evals(folder)
    est = {c: key_rewards(fit_runs(evals, "n"), c) for c in BUDGETS}
    keys = est[BUDGETS[0]].keys
    lines = ["| C (rollouts) | " + " | ".join(f"n = {k}" for k in keys) + " | n*(C) |",
             "|---|" + "---|" * (len(keys) + 1)]
    for c, e in est.items():
        lines.append(f"| {c:,} | " + " | ".join(f"{r:.3f}" for r in e.reward) + f" | {int(e.keys[e.reward.argmax()])} |")
    truth = dict(zip(est[BUDGETS[-1]].keys.tolist(), est[BUDGETS[-1]].reward.tolist(), strict=True))
    settings = ForecastSettings(resamples=200, eval_draws=100 * 16, seed=0)
    lines += ["", "| cut at | key | forecast at 160,000 [95 %] | long grid at 160,000 | covered | leader |",
              "|---|---|---|---|---|---|"]
    for cut in CUTS:
        rows = forecast_group(evals[evals["c"] <= cut], "n", BUDGETS[-1], settings=settings)
        for r in rows[rows["trained"]].itertuples():
            covered = r.reward_lo <= truth[r.key] <= r.reward_hi
            lines.append(f"| {cut:,} | {r.key} | {r.reward:.3f} [{r.reward_lo:.3f}, {r.reward_hi:.3f}] | "
                         f"{truth[r.key]:.3f} | {'yes' if covered else 'no'} | {r.leader} |")
    return "\n".join(lines)


SCORE_CUTS = ((40_000, 160_000), (20_000, 160_000))  # science §11.1: the answer's multiples, 4x and 8x
SCORE_FAMILIES = ("rising", "late_flip", "cross", "unbent")


def score_rows(grids: list[Path], forms: list[str], sims: int, families: tuple[str, ...] = SCORE_FAMILIES,
               resamples: int = 100) -> pd.DataFrame:
    """One row per form, source (a grid folder or a simulated study), multiple and key: the forecast's error,
    coverage and width (science §11.2). A simulated study's runs end at C_max = 40,000 and are forecast at 4x and
    8x; its truth is the family's curve."""
    from rollscale.core.search.forecast_sim import forecast_studies, study_evals, true_at

    out = []
    for form in forms:
        for folder in grids:
            evals, ceiling = stored_evals(folder), grid_ceiling(folder)
            for cut, target in SCORE_CUTS:
                truth = grid_truth(evals, target)
                rows = cut_forecast(evals, cut, target, form, ceiling, resamples)
                out += [{"form": form, "source": str(folder), "family": "grid", "multiple": target / cut,
                         "key": int(r.key), "error": r.reward - truth[int(r.key)],
                         "covered": r.reward_lo <= truth[int(r.key)] <= r.reward_hi, "width": r.width}
                        for r in rows.itertuples()]
        if sims:
            studies = forecast_studies(families, sims, seed=52)
            evals = study_evals(studies)
            for st in studies:
                part = evals[evals["bucket"] == st.name]
                for m in (4.0, 8.0):
                    target = m * st.c_max
                    rows = cut_forecast(part, st.c_max, target, form, None, resamples)
                    for r in rows.itertuples():
                        t = true_at(st, int(r.key), target)
                        out.append({"form": form, "source": st.name, "family": st.family, "multiple": m,
                                    "key": int(r.key), "error": r.reward - t,
                                    "covered": r.reward_lo <= t <= r.reward_hi, "width": r.width})
            print(f"{form}: {len(studies)} simulated studies done", file=sys.stderr, flush=True)
    return pd.DataFrame(out)


def score_table(rows: pd.DataFrame) -> str:
    """Per form, data (a grid folder, or a simulated family) and multiple: signed error, absolute error,
    coverage, median width (Markdown)."""
    lines = ["| form | data | multiple | keys | mean signed error | mean abs error | coverage | median width |",
             "|---|---|---|---|---|---|---|---|"]
    data = rows["source"].where(rows["family"] == "grid", rows["family"])
    for (form, fam, m), t in rows.assign(data=data).groupby(["form", "data", "multiple"], sort=False):
        lines.append(f"| {form} | {fam} | {m:.0f}x | {len(t)} | {t['error'].mean():+.3f} | "
                     f"{t['error'].abs().mean():.3f} | {t['covered'].mean():.2f} | {t['width'].median():.3f} |")
    return "\n".join(lines)


def choice_table(rows: pd.DataFrame) -> str:
    """The form chosen leave-one-grid-out (:func:`rollscale.core.fit.form_choice.leave_one_grid_out`) and its
    score on each held-out grid (Markdown)."""
    from rollscale.core.fit.form_choice import leave_one_grid_out

    lines = ["| held-out grid | form chosen on the other grids | multiple | keys | mean signed error | "
             "mean abs error | coverage | median width |", "|---|---|---|---|---|---|---|---|"]
    for r in leave_one_grid_out(rows).itertuples():
        lines.append(f"| {r.held_out} | {r.form} | {r.multiple:.0f}x | {r.keys} | {r.mean_error:+.3f} | "
                     f"{r.mean_abs_error:.3f} | {r.coverage:.2f} | {r.median_width:.3f} |")
    return "\n".join(lines)


def _print_grid(rows: pd.DataFrame, folder: Path, cut: float, target: float, as_json: bool) -> None:
    if as_json:
        cols = ["key", "reward", "reward_lo", "reward_hi", "d", "d_lo", "d_hi", "leader", "unknown", "trained",
                "c_seen", "width", "continued_hi", "form", "reason", "widen", "grid", "error", "covered", "ceiling"]
        out = [{c: (None if isinstance(v, float) and not math.isfinite(v) else
                    v.item() if hasattr(v, "item") else v) for c, v in r.items()}
               for r in rows[cols].to_dict(orient="records")]
        print(json.dumps(out, indent=1))
        return
    bound = (f"bounded by the base's pass@k {rows['ceiling'].iloc[0]:.3f}" if math.isfinite(rows["ceiling"].iloc[0])
             else "no profile table: forecast without the pass@k bound")
    print(f"{folder}: cut at {cut:,.0f}, forecast at {target:,.0f} ({target / cut:.0f}x), form "
          f"{rows['form'].iloc[0]}, {bound}; {rows['backtest'].iloc[0]}"
          + (f"; weights: {rows['weights'].iloc[0]}" if rows["weights"].iloc[0] else ""))
    print("| key | forecast [95 %] | grid | error | covered |\n|---|---|---|---|---|")
    for r in rows.itertuples():
        print(f"| {r.key} | {r.reward:.3f} [{r.reward_lo:.3f}, {r.reward_hi:.3f}] | {r.grid:.3f} | {r.error:+.3f} | "
              f"{'yes' if r.covered else 'no'} |")


def main() -> None:
    from rollscale.core.fit.forms import DEFAULT_FORM

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--artifacts", type=Path, help="the study's artifacts folder (kept: resumes)")
    ap.add_argument("--params", type=Path, default=ROOT / "params.yaml", help="the study to widen")
    ap.add_argument("--out", type=Path, default=OUT, help="where the stored tables go")
    ap.add_argument("--store-only", action="store_true", help="store the tables of a finished long grid")
    ap.add_argument("--summary", action="store_true", help="print n*(C) and the forecasts from the stored tables")
    ap.add_argument("--grid", type=Path, help="a grid folder to forecast from (runs/evals Parquet files)")
    ap.add_argument("--cut", type=float, default=40_000, help="the budget the runs are cut at")
    ap.add_argument("--target", type=float, default=160_000, help="C*: the budget forecast")
    ap.add_argument("--form", default=DEFAULT_FORM, help="the forecast's form (rollscale.core.fit.forms, surface)")
    ap.add_argument("--json", action="store_true", help="with --grid: one JSON object a key")
    ap.add_argument("--no-calibrate", action="store_true", help="without the backtest's widening")
    ap.add_argument("--score", type=Path, nargs="*", help="score every form on these grid folders (and --sim)")
    ap.add_argument("--forms", default="decay,linear,surface", help="with --score: the forms, comma-separated")
    ap.add_argument("--sim", type=int, default=0, help="with --score: simulated studies a family")
    ap.add_argument("--families", default=",".join(SCORE_FAMILIES), help="with --score: simulated families")
    ap.add_argument("--save", type=Path, help="with --score: also write the score rows (Parquet) here")
    ap.add_argument("--load", type=Path, nargs="+", help="score rows written by --save: print their tables "
                                                         "(with --score: added to the rows scored now)")
    args = ap.parse_args()
    if args.score is not None or args.load:
        parts = [pd.read_parquet(f) for f in args.load or []]
        scored: list[pd.DataFrame] = []
        for form in args.forms.split(",") if args.score is not None else []:
            scored.append(score_rows(args.score, [form], args.sim, tuple(args.families.split(","))))
            if args.save is not None:  # after each form: a run stopped for time keeps the forms it scored
                pd.concat(scored, ignore_index=True).to_parquet(args.save, index=False)
        parts += scored
        rows = pd.concat(parts, ignore_index=True)
        print(score_table(rows))
        if rows.loc[rows["family"] == "grid", "source"].nunique() >= 2:
            print("\nLeave-one-grid-out (science §11.1; criterion: rollscale.core.fit.form_choice):\n")
            print(choice_table(rows))
        return
    if args.summary:
        print(summary(args.out))
        return
    if args.grid is not None:
        if not args.cut < args.target:
            ap.error(f"--cut {args.cut:,.0f} must be below --target {args.target:,.0f}")
        rows = grid_report(args.grid, args.cut, args.target, args.form, not args.no_calibrate)
        _print_grid(rows, args.grid, args.cut, args.target, args.json)
        return
    if args.artifacts is None:
        ap.error("--artifacts is required to train or store the long grid (or --grid / --summary)")
    artifacts = args.artifacts.resolve()
    artifacts.mkdir(parents=True, exist_ok=True)
    if not args.store_only:
        params = artifacts.parent / f"{artifacts.name}.params.yaml"
        params.write_text(yaml.safe_dump(long_grid_params(args.params), sort_keys=False))
        for stage in (*PREPARE, "sweep"):
            if stage in PREPARE and read_record(artifacts / stage) is not None:
                print(f"{stage}: done before (its record is in {artifacts / stage})", flush=True)
                continue
            seconds = run_stage(stage, params, artifacts)
            print(f"{stage}: {seconds:.1f} s", flush=True)
    rows = store(artifacts, args.out)
    print(f"stored in {args.out}: " + ", ".join(f"{name} {n} rows" for name, n in rows.items()))


if __name__ == "__main__":
    main()
