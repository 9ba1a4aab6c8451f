"""The search's verdict against the report's first line, per simulated family (science §11.3, §11.5).

    python benchmarks/verdict_agreement.py --per-family 24 --families late close cross unbent

Studies: rollscale.core.search.simulate (rollout axis, B_problem 16, C_max 40,000, avg@16 over 100 problems, the
§9.1 schedule), 2 seeds a key to start, 3 at most; the search ``--method`` (default forecast, science §10.5 / §11.3)
at C* = ``--c-star-multiple`` x C_max. Per study the first line is made as the fit stage and the report make it
(rollscale.core.search.simulate_budget.first_lines: the decision table from the search's runs and its table).
Prints markdown, per family: studies, right within epsilon (the search's leader, decided or not) with its 95 %
Clopper-Pearson interval, decided, wrong and decided (an answer a practitioner would act on, more than epsilon short
of the best), the first line answered, agreement, the answer a key the search had stopped, median rollouts against
2 x C*. Several ``--seed`` values pool their sets of studies per family (24 studies cannot tell a method right in
95 % from one right in 90 %: at 95 % one set shows 22 of 24 or fewer a third of the time).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scipy.stats import beta  # noqa: E402

from rollscale.config import DecisionParams, SearchParams  # noqa: E402
from rollscale.core.search.simulate import FAMILIES, MORE_FAMILIES, make_studies  # noqa: E402
from rollscale.core.search.simulate_budget import first_lines, simulate_decision  # noqa: E402
from rollscale.core.search.state import SearchSettings  # noqa: E402
from rollscale.report.decision_text import decision_headline  # noqa: E402

C_MAX = 40_000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-family", type=int, default=24)
    ap.add_argument("--families", nargs="+", default=[*FAMILIES, *MORE_FAMILIES])
    ap.add_argument("--method", default="forecast")
    ap.add_argument("--c-star-multiple", type=float, default=4.0)
    ap.add_argument("--resamples", type=int, default=40, help="the search's bootstrap refits")
    ap.add_argument("--seed", type=int, nargs="+", default=[0], help="one set of studies a seed, pooled")
    ap.add_argument("--form", default=DecisionParams().forecast_form, help="study.forecast_form")
    ap.add_argument("--spend-max", type=float, default=None, help="sweep.search.spend_max (x C*; default: no cap)")
    args = ap.parse_args()
    settings = SearchSettings(SearchParams(method=args.method, eta=1.41, alpha=0.3, seeds_min=2, seeds_max=3,
                                           spend_max=args.spend_max, bootstrap_resamples=args.resamples),
                              DecisionParams(tolerance=0.02, target_budget=int(args.c_star_multiple * C_MAX),
                                             forecast_form=args.form),
                              eval_draws=1600)
    print("| family | studies | right [95 %] | decided | wrong and decided | first line answered | agree | "
          "answer a stopped key | median rollouts / 2 C* | seconds |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for family in args.families:
        start = time.time()
        parts = []
        for seed in args.seed:
            studies = make_studies(args.per_family, seed=seed, families=(family,), seeds=(0, 1),
                                   schedule=(625.0, 4), eval_draws=1600)
            result = simulate_decision(studies, settings)
            parts.append((result.studies, first_lines(studies, result, settings, decision_headline)))
        s = pd.concat([p[0] for p in parts], ignore_index=True)
        lines = pd.concat([p[1] for p in parts], ignore_index=True)
        print(f"| {family} | {len(s)} | {s['right'].mean():.1%} {_clopper_pearson(int(s['right'].sum()), len(s))} | "
              f"{s['decided'].mean():.1%} | "
              f"{(s['decided'] & ~s['right']).mean():.1%} | "
              f"{lines['line_answered'].mean():.1%} | {int(lines['agree'].sum())} of {len(lines)} | "
              f"{int(s['stopped_answer'].sum())} | {s['spent_c_star'].median():.2f} | {time.time() - start:.0f} |",
              flush=True)


def _clopper_pearson(k: int, n: int, level: float = 0.95) -> str:
    """The exact binomial interval of a share k / n, as "[lo, hi]" in percent."""
    a = (1 - level) / 2
    lo = beta.ppf(a, k, n - k + 1) if k > 0 else 0.0
    hi = beta.ppf(1 - a, k + 1, n - k) if k < n else 1.0
    return f"[{lo:.1%}, {hi:.1%}]"


if __name__ == "__main__":
    main()
