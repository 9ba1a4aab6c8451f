"""The long grid of the embedded default (science §10, "What it must show"): every key n = 2 to 32 with 2 seeds,
trained to 4 x 40,000 = 160,000 rollouts, its ``runs``, ``steps`` and ``evals`` tables stored in the repository
(``benchmarks/data/long_grid/``) so that tests replay the forecast against it (tests/test_long_grid.py).

    python benchmarks/long_grid.py --artifacts /tmp/long-grid      # trains (resumes), then stores the tables
    python benchmarks/long_grid.py --artifacts /tmp/long-grid --store-only
    python benchmarks/long_grid.py --summary      # n*(C) and the forecasts from cut runs, from the stored tables

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
import os
import subprocess
import sys
import time
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
    """The sweep's runs, evaluations and steps (:data:`STEP_COLUMNS`) as three Parquet files under ``out``."""
    runs = read(artifacts, "runs")
    unfinished = runs.loc[runs["status"] != "finished", "run_id"].tolist()
    if unfinished:
        raise SystemExit(f"{artifacts}: runs not finished yet: {', '.join(unfinished)} (run the script again)")
    tables = {"runs": runs.sort_values("run_id"),
              "evals": read(artifacts, "evals").sort_values(["run_id", "step"]),
              "steps": read(artifacts, "steps")[STEP_COLUMNS].sort_values(["run_id", "step"])}
    out.mkdir(parents=True, exist_ok=True)
    for name, table in tables.items():
        table.to_parquet(out / f"{name}.parquet", index=False, compression="zstd")
    return {name: len(t) for name, t in tables.items()}


# the budgets n*(C) is read at (within the long grid's data), and the cuts the forecast to C* = 160,000 starts from
BUDGETS = (10_000, 20_000, 40_000, 80_000, 160_000)
CUTS = (40_000, 80_000)


def stored_evals(folder: Path = OUT) -> pd.DataFrame:
    """The stored long grid's evaluations with their runs' key ``n`` and seed."""
    runs = pd.read_parquet(folder / "runs.parquet")
    return pd.read_parquet(folder / "evals.parquet").merge(runs[["run_id", "n", "seed"]], on="run_id")


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--artifacts", type=Path, help="the study's artifacts folder (kept: resumes)")
    ap.add_argument("--params", type=Path, default=ROOT / "params.yaml", help="the study to widen")
    ap.add_argument("--store-only", action="store_true", help="store the tables of a finished long grid")
    ap.add_argument("--summary", action="store_true", help="print n*(C) and the forecasts from the stored tables")
    args = ap.parse_args()
    if args.summary:
        print(summary())
        return
    if args.artifacts is None:
        ap.error("--artifacts is required to train or store the long grid")
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
    rows = store(artifacts)
    print(f"stored in {OUT.relative_to(ROOT)}: " + ", ".join(f"{name} {n} rows" for name, n in rows.items()))


if __name__ == "__main__":
    main()
