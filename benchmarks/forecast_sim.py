"""The forecast past the data on simulated studies, per family, at 2x, 4x and 8x C_max (science §10).

    python benchmarks/forecast_sim.py --per-family 20 --resamples 100 [--no-perturb] [--tau-held] [--calibrated]

Every family of rollscale.core.search.simulate plus two that break A4 (rollscale.core.search.forecast_sim:
``tie_top``, ``bend``); 2 seeds a key, avg@16 over 100 problems (1,600 draws an evaluation) on the §9.1 schedule
(500 rollouts, 4 evaluations a doubling), every key 2-16 trained to C_max = 40,000. Per family and multiple:
coverage of the 95 % intervals over keys x studies, answered (the leader's interval no wider than 0.15),
right (over the answered studies: the leader's true reward within 0.02 of the best),
the share of keys unknown (interval wider than 0.15), the median interval width, the backtest's failure and A4
shares (one backtest per study, the same at every multiple), the studies where the cap (§10.4) stopped the true
best key (must be 0) and the keys it stopped per study; with ``--calibrated`` also the coverage, answered, right
and median width of the interval the fit stage and the report read (calibrated by the study's own backtest at the
answer's multiple, science §11.4) and the backtest's median widening. Prints a markdown table and the CPU seconds
per study.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rollscale.core.fit.forecast import ForecastSettings  # noqa: E402
from rollscale.core.search.forecast_sim import (  # noqa: E402
    ALL_FAMILIES,
    forecast_studies,
    judge_study,
    study_evals,
    summarise_forecast,
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-family", type=int, default=20)
    ap.add_argument("--resamples", type=int, default=100)
    ap.add_argument("--families", nargs="+", default=list(ALL_FAMILIES))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-perturb", action="store_true", help="refits without the perturbed prior")
    ap.add_argument("--tau-held", action="store_true", help="refits at the deviations' estimated sd, not drawn")
    ap.add_argument("--out", type=Path, default=None, help="also write every study's rows as CSV")
    ap.add_argument("--calibrated", action="store_true", help="also judge the fit stage's calibrated interval")
    args = ap.parse_args()
    settings = ForecastSettings(resamples=args.resamples, eval_draws=1600, perturb=not args.no_perturb,
                                tau_spread=not args.tau_held)
    rows = []
    cpu = time.process_time()
    for family in args.families:
        studies = forecast_studies((family,), args.per_family, seed=args.seed)
        evals = study_evals(studies)
        for s in studies:
            rows += judge_study(s, evals[evals["bucket"] == s.name], settings, with_calibrated=args.calibrated)
        print(f"{family}: done", file=sys.stderr, flush=True)
    per_study = (time.process_time() - cpu) / max(len(rows) // 3, 1)
    table = pd.DataFrame(rows)
    if args.out:
        table.to_csv(args.out, index=False)
    summary = summarise_forecast(table)
    cols = ["family", "multiple", "studies", "coverage", "answered", "right", "unknown", "width", "backtest_failed",
            "a4_flag",
            "cap_stops_best", "cap_stops"] + (["coverage_cal", "answered_cal", "right_cal", "width_cal", "widen"]
                                               if args.calibrated else [])
    print("| " + " | ".join(cols) + " |")
    print("|" + " --- |" * len(cols))
    for _, r in summary[cols].iterrows():
        cells = [str(r["family"]), f"{r['multiple']:g}x", f"{int(r['studies'])}"]
        cells += [f"{r[c]:.2f}" for c in ("coverage", "answered", "right", "unknown")] + [f"{r['width']:.3f}"]
        cells += [f"{r[c]:.2f}" for c in ("backtest_failed", "a4_flag")]
        cells += [f"{int(r['cap_stops_best'])}", f"{r['cap_stops']:.2f}"]
        if args.calibrated:
            cells += [f"{r[c]:.2f}" for c in ("coverage_cal", "answered_cal", "right_cal")]
            cells += [f"{r['width_cal']:.3f}", f"{r['widen']:.2f}"]
        print("| " + " | ".join(cells) + " |")
    print(f"\nCPU seconds per study (forecast at 3 multiples, backtest, caps, {args.resamples} refits each): "
          f"{per_study:.2f}")


if __name__ == "__main__":
    main()
