"""Calibration of the decision's intervals at C* on simulated studies (science §9.3, §9.4).

    python benchmarks/decision_calibration.py                  # 40 studies per family, 2 and 3 seeds
    python benchmarks/decision_calibration.py --per-family 100 --seen 1.0 0.55

Simulated studies (rollscale.core.search.simulate: the embedded default's shape, every key trained as a
grid) are decided at C* = C_max from runs seen up to ``seen`` x C* (1.0: within data; 0.55: every key
extrapolated, within eta = 2). Per family, seeds and seen share: the coverage of the nominal 95 % interval
of each key's reward at C* (its true curve there), the same for the paired seed bootstrap's percentile
interval (what a per-key bootstrap gives), the median half-width of the reward interval and of D's, and how
often the decision (tolerance 0.02) is made and names a key within 0.02 of the true best.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rollscale.core.fit.analysis import run_evals  # noqa: E402
from rollscale.core.fit.decision import decide, fit_groups, paired_refits  # noqa: E402
from rollscale.core.search.simulate import FAMILIES, grid_tables, make_studies  # noqa: E402


def _true(curve: tuple, c: float) -> float:
    r0, a, c_mid, beta = curve
    return r0 + (min(a, 1.0) - r0) / (1.0 + (c_mid / c) ** beta)


def run(per_family: int, seeds: int, seen: float, tolerance: float, seed: int) -> pd.DataFrame:
    studies = [replace(s, seeds=tuple(range(seeds))) for s in make_studies(per_family, seed=seed)]
    runs, evals = grid_tables(studies)
    ev = run_evals(runs, evals, None)
    curves = fit_groups(ev[ev["c"] <= ev["c_max"] * seen], "n", "bucket")
    rows = []
    for s in studies:
        out = decide(curves[s.name], s.c_max, tolerance, 2.0, rollout_axis=True).set_index("key")
        keys, refits = paired_refits(curves[s.name], s.c_max, 200, 0)
        lo_b, hi_b = np.percentile(refits, [2.5, 97.5], axis=0)
        truth = {k: _true(s.curves[k], s.c_max) for k in out.index}
        best = max(truth.values())
        lead = out["leader"].iloc[0]
        for i, k in enumerate(keys):
            r = out.loc[k]
            rows.append({"family": s.family, "key": k, "cover": r["reward_lo"] <= truth[k] <= r["reward_hi"],
                         "cover_boot": lo_b[i] <= truth[k] <= hi_b[i], "half": (r["reward_hi"] - r["reward_lo"]) / 2,
                         "d_half": (r["d_hi"] - r["d_lo"]) / 2 if k != lead else np.nan,
                         "decided": bool(r["decided"]), "right": best - truth[lead] <= tolerance})
    return pd.DataFrame(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-family", type=int, default=40)
    ap.add_argument("--seeds", type=int, nargs="+", default=[2, 3])
    ap.add_argument("--seen", type=float, nargs="+", default=[1.0, 0.55])
    ap.add_argument("--tolerance", type=float, default=0.02)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    table = []
    for seen in args.seen:
        for seeds in args.seeds:
            t0 = time.perf_counter()
            df = run(args.per_family, seeds, seen, args.tolerance, args.seed)
            secs = time.perf_counter() - t0
            for family, g in [("all", df), *df.groupby("family")]:
                per_study = g.groupby(g.index // 4)[["decided", "right"]].first()
                table.append({"seen": seen, "seeds": seeds, "family": family, "intervals": len(g),
                              "coverage": g["cover"].mean(), "bootstrap_coverage": g["cover_boot"].mean(),
                              "median_half_width": g["half"].median(), "median_d_half_width": g["d_half"].median(),
                              "decided": per_study["decided"].mean(), "leader_within_eps": per_study["right"].mean(),
                              "seconds": secs if family == "all" else np.nan})
    out = pd.DataFrame(table)
    assert set(out["family"]) <= {"all", *FAMILIES}
    print(out.to_markdown(index=False, floatfmt=".3f"))


if __name__ == "__main__":
    main()
