"""Stage ``measure``: gradient noise at large n (science §6).

For each group size n (e.g. 16 and 32) we take a few GRPO steps from the base
model on the bucket's training split. Before each update, the Gram matrix of
the per-rollout gradients of the step's loss (one forward and one backward
pass through per-layer hooks) gives the gradient noise scale B_simple (and the
mini-batch B_naive), its prompt-axis and rollout-axis parts, the intraclass
within-group correlation rho_icc with K_sat = 1 / rho_icc, the critical rollout
size K_crit and CRS = min(K_sat, K_crit); per prompt, the essay's split-half
rho and K_sat, always beside its null value |R| + 1.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from prefect import flow

from rollscale.files import write_parquets_atomic
from rollscale.sweep.grid import run_configs
from tasks.common import ARTIFACTS, bucket_problems, read_model_ref, read_params, refresh_duckdb
from tasks.measure import measure_noise
from rollscale.pipeline.runtime.workers import local_runner, raise_first_error, run_all
from tasks.models import sampling_config


@flow(name="measure")
def measure_flow(params_path: str = "params.yaml", artifacts: str = str(ARTIFACTS)) -> dict[str, pd.DataFrame]:
    params = read_params(params_path)
    root = Path(artifacts)
    ref = read_model_ref(root)
    m = params.measure
    train, val = bucket_problems(root, m.bucket)
    # the same GRPO step as the sweep (its train settings), uniform allocation, noise every step; one seed and
    # m.steps steps of each n, no search (a grid: the sweep's search settings are not the measure's)
    sweep = params.sweep.model_dump()
    design = type(params.sweep).model_validate({**sweep, **{
        "bucket": m.bucket, "design": "rollout_axis", "n": m.n, "b_problem": [m.b_problem], "rules": ["uniform"],
        "seeds": [m.seed], "b_max": max(m.n) * m.b_problem, "c_max": m.steps * max(m.n) * m.b_problem,
        "noise_every": 1, "search": {**sweep["search"], "method": "grid"},
    }})
    configs = run_configs(design, sampling_config(params.sampling))
    for config in configs:
        print(f"measure: n = {config.n}, B_problem = {config.b_problem}, {m.steps} steps on {m.bucket!r}")
    # one unit per n, side by side; each is seeded by its run config, not by the worker
    units = [{"ref": ref, "config": c, "bucket": m.bucket, "train": train, "val": val, "steps": m.steps,
              "lora": params.model.lora, "device": params.model.device, "sampling": params.sampling} for c in configs]
    results, errors = run_all(local_runner(params.workers, params.torch_threads), measure_noise, units,
                              [f"n = {c.n}" for c in configs])
    raise_first_error("measure", errors)
    steps = [results[i]["noise_steps"] for i in range(len(configs))]
    prompts = [results[i]["noise_prompts"] for i in range(len(configs))]
    noise_steps, noise_prompts = pd.concat(steps, ignore_index=True), pd.concat(prompts, ignore_index=True)
    out_dir = root / "measure"
    write_parquets_atomic({out_dir / "noise_steps.parquet": noise_steps,  # all at once
                           out_dir / "noise_prompts.parquet": noise_prompts})
    refresh_duckdb(root)
    cols = ["n", "step", "b_simple", "b_simple_ema", "rho_icc", "k_sat_icc", "k_crit", "crs"]
    print("measure: noise per step\n" + noise_steps[cols].to_string(index=False, float_format=lambda x: f"{x:.3g}"))
    by_n = noise_prompts.groupby("n").agg(k_sat_median=("k_sat", "median"), k_sat_null=("k_sat_null", "first"))
    print("measure: split-half K_sat (median over prompts) beside its null |R| + 1\n" + by_n.to_string())
    return {"noise_steps": noise_steps, "noise_prompts": noise_prompts}


if __name__ == "__main__":
    measure_flow()
