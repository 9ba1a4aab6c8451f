"""A finished study written by hand for ``rollscale track``'s tests: its runs' evaluations (sigmoids with seed
noise, committed as the sweep commits them) and the fit stage's decision computed from them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from rollscale.core.fit.analysis import run_evals
from rollscale.core.fit.decision_table import decision_table

PARAMS = {
    "sweep": {"bucket": "easy", "design": "rollout_axis", "n": [2, 4], "b_problem": [2], "c_max": 320, "seeds": [0, 1, 2],
              "eval_k": 4, "train": {"lr_base": 1e-3, "b_base": 8, "recipe": "off"}},
    "sampling": {"max_new_tokens": 4},
    "study": {"target_budget": 160},
}
# each key's curve: R0 0.2, rising to A at C_mid (science §7); n = 4 learns more
CURVES = {2: (0.45, 60.0), 4: (0.6, 50.0)}


def study_runs(seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    rng = np.random.default_rng(seed)
    runs, evals = [], []
    for n, (a, mid) in CURVES.items():
        for s in (0, 1, 2):
            run_id = f"n{n}_s{s}"
            runs.append({"run_id": run_id, "n": n, "b_problem": 2, "bucket": "easy", "rule": "uniform", "seed": s,
                         "c_max": 320, "status": "finished"})
            for step in range(0, 320 // (2 * n) + 1, max(1, 16 // n)):
                c = step * 2 * n
                r = 0.2 + (a - 0.2) / (1 + (mid / c) ** 2) if c else 0.2
                evals.append({"run_id": run_id, "step": step, "c": c, "avg_at_k": r + rng.normal(0, 0.01)})
    return pd.DataFrame(runs), pd.DataFrame(evals)


def write_study(root: Path) -> pd.DataFrame:
    """params.yaml, the sweep's runs and evaluations (committed by a checkpoint) and the decision; the decision."""
    (root / "params.yaml").write_text(yaml.safe_dump(PARAMS))
    runs, evals = study_runs()
    for run_id, ev in evals.groupby("run_id"):
        folder = root / "artifacts/sweep/runs" / run_id
        (folder / f"ckpt-{int(ev['step'].max()):06d}").mkdir(parents=True)
        runs[runs["run_id"] == run_id].to_parquet(folder / "run.parquet")
        ev.to_parquet(folder / f"evals-{int(ev['step'].max()):06d}.parquet")
        # a manifest of the first format commits every part up to its step (rollscale.train.manifest)
        (folder / f"ckpt-{int(ev['step'].max()):06d}" / "MANIFEST.json").write_text(
            json.dumps({"step": int(ev["step"].max()), "version": 1}))
    decision = decision_table(run_evals(runs, evals), 160.0, 0.02, 2.0)
    (root / "artifacts/fit").mkdir(parents=True)
    decision.to_parquet(root / "artifacts/fit/decision.parquet")
    return decision
