"""The search of science §9.4 on simulated studies, per family: the answer at C* against the truth, rollouts spent.

    python benchmarks/search_budget.py --per-family 40 --seeds-min 2 3
    python benchmarks/search_budget.py --per-family 40 --seeds-min 2 --draws 400 1600   # avg@4 and avg@16
    python benchmarks/search_budget.py --per-family 10 --tradeoff
    python benchmarks/search_budget.py --per-family 40 --oracle   # the most 2, 3, 4 seeds can be right
    python benchmarks/search_budget.py --method forecast --c-star-multiple 4 --per-family 8 --seeds-min 2

Studies: rollscale.core.search.simulate (rollout axis, B_problem 16, C_max = C* = 40,000, avg@4 over
100 problems, evaluations on the §9.1 schedule from C_max / 64, 4 per doubling, the sweep's default), its five families
and the three of MORE_FAMILIES; the search runs through rollscale.core.search.decisions with method
"decision" (rollscale.core.search.simulate_budget). Prints markdown: per family, the share of studies
whose answer is within epsilon of the true best at C* ("right"), the share decided, the median and
largest rollouts spent against the grid's (every key, seeds_max seeds, to C_max), the mean regret and
the seeds added, and how often that grid itself is right (its own decision at C*, the ceiling of any search); with --tradeoff one row per setting moved from epsilon 0.02, alpha 0.3, eta 1.41,
seeds_min 2 (one at a time), over all families. With --method forecast (science §10.5) and --c-star-multiple m the
search decides at C* = m x C_max, judged against the true curves at C*; the table adds the rollouts spent against
2 x C* (science §10's cost) and the keys stopped before C_max.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rollscale.config import DecisionParams, SearchParams  # noqa: E402
from rollscale.core.search.state import SearchSettings  # noqa: E402
from rollscale.core.search.simulate import FAMILIES, MORE_FAMILIES, make_studies  # noqa: E402
from rollscale.core.search.simulate_budget import (  # noqa: E402
    seeds_oracle,
    simulate_decision,
    summarise_decision,
)

SCHEDULE = (625.0, 4)  # the sweep's default: sweep.eval_per_doubling 4 from c_max / 64


def run(per: int, seeds_min: int, seeds_max: int, draws: int = 1600, grid: bool = False, tolerance: float = 0.02,
        method: str = "decision", multiple: float | None = None, **kw: float) -> tuple:
    studies = make_studies(per, seed=0, families=tuple(FAMILIES) + tuple(MORE_FAMILIES),
                           seeds=tuple(range(seeds_min)), schedule=SCHEDULE, eval_draws=draws)
    t = time.process_time()
    settings = SearchSettings(SearchParams(method=method, seeds_max=seeds_max, **kw),
                              DecisionParams(tolerance=tolerance, target_budget=round(multiple * studies[0].c_max)
                                             if multiple else None))
    result = simulate_decision(studies, settings, grid=grid)
    return summarise_decision(result), time.process_time() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-family", type=int, default=40)
    ap.add_argument("--seeds-min", type=int, nargs="+", default=[2, 3])
    ap.add_argument("--seeds-max", type=int, default=4)
    ap.add_argument("--eta", type=float, default=1.41)
    ap.add_argument("--alpha", type=float, default=0.3)
    ap.add_argument("--draws", type=int, nargs="+", default=[1600],
                    help="samples behind one evaluation: 1600 = avg@16 over 100 problems (the default), 400 = avg@4")
    ap.add_argument("--tradeoff", action="store_true", help="one row per epsilon x alpha x eta x seeds_min")
    ap.add_argument("--oracle", action="store_true", help="per family: right with 2-4 seeds' true curves, no fit")
    ap.add_argument("--method", default="decision", help="the search method: decision (science §9.4) or forecast (§10.5)")
    ap.add_argument("--c-star-multiple", type=float, default=1.0, help="C* = this x C_max (40,000)")
    ap.add_argument("--resamples", type=int, default=200, help="the search's bootstrap refits")
    args = ap.parse_args()
    if args.method != "decision" or args.c_star_multiple != 1.0:
        forecast_table(args)
        return
    if args.oracle:
        studies = make_studies(args.per_family, seed=0, families=tuple(FAMILIES) + tuple(MORE_FAMILIES),
                               eval_draws=args.draws[0])
        print("| seeds | " + " | ".join(FAMILIES | MORE_FAMILIES) + " |")
        print("| ---: |" + " ---: |" * len(FAMILIES | MORE_FAMILIES))
        for m in (2, 3, 4):
            right = {f: [seeds_oracle(s, m) for s in studies if s.family == f] for f in FAMILIES | MORE_FAMILIES}
            print(f"| {m} | " + " | ".join(f"{sum(v) / len(v):.1%}" for v in right.values()) + " |")
        return
    if not args.tradeoff:
        for draws in args.draws:
            for m in args.seeds_min:
                cap = max(m, args.seeds_max)
                table, cpu = run(args.per_family, m, cap, draws, grid=True, eta=args.eta, alpha=args.alpha)
                print(f"\nseeds_min {m}, seeds_max {cap}, epsilon 0.02, alpha {args.alpha:g}, eta {args.eta:g}, "
                      f"{draws} samples an evaluation ({cpu:.0f} CPU s)\n")
                print("| family | studies | A2 holds | right (regret <= epsilon) | the grid right | decided | "
                      "median spent | max spent | median spent, 3-seed grid | mean regret | seeds added |")
                print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
                for fam, r in table.iterrows():
                    print(f"| {fam} | {r['studies']} | {'yes' if r['a2_holds'] else 'no'} | {r['right']:.1%} | "
                          f"{r['grid_right']:.1%} | {r['decided']:.0%} | {r['median_spent']:.1%} | "
                          f"{r['max_spent']:.1%} | {r['median_spent'] * cap / 3:.1%} | {r['mean_regret']:.4f} | "
                          f"{r['seeds_added']:.2f} |", flush=True)
        return
    print("| epsilon | alpha | eta | seeds_min | right, worst family | right, all | median spent | worst family's "
          "median spent | CPU s |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    base = (0.02, args.alpha, args.eta, 2)  # one setting moved at a time from the tested one
    moves = [base, (0.01, *base[1:]), (0.04, *base[1:]), (base[0], 0.1, *base[2:]), (*base[:2], 2.0, 2),
             (*base[:3], 3)]
    for eps, alpha, eta, m in moves:
        table, cpu = run(args.per_family, m, max(m, args.seeds_max), args.draws[0], tolerance=eps, alpha=alpha,
                         eta=eta)
        fams = table.drop(index="all")
        holds = fams[fams["a2_holds"].astype(bool)]
        print(f"| {eps:g} | {alpha:g} | {eta:g} | {m} | {holds['right'].min():.1%} | {table.loc['all', 'right']:.1%} | "
              f"{table.loc['all', 'median_spent']:.1%} | {fams['median_spent'].max():.1%} | {cpu:.0f} |", flush=True)


def forecast_table(args: argparse.Namespace) -> None:
    """Per family at C* = m x C_max: right, rollouts against 2 x C* and the grid, keys stopped early."""
    for m in args.seeds_min:
        cap = max(m, args.seeds_max)
        table, cpu = run(args.per_family, m, cap, args.draws[0], method=args.method, multiple=args.c_star_multiple,
                         eta=args.eta,
                         alpha=args.alpha, bootstrap_resamples=args.resamples)
        print(f"\nmethod {args.method}, C* = {args.c_star_multiple:g} x C_max, seeds_min {m}, seeds_max "
              f"{cap}, epsilon 0.02, alpha {args.alpha:g}, eta {args.eta:g}, {args.resamples} refits, "
              f"{args.draws[0]} samples an evaluation ({cpu:.0f} CPU s)\n")
        print("| family | studies | right (regret <= epsilon) | median spent / 2 C* | max spent / 2 C* | "
              "median spent / grid | keys stopped early | seeds added | mean regret |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for fam, r in table.iterrows():
            print(f"| {fam} | {r['studies']} | {r['right']:.1%} | {r['median_spent_c_star']:.1%} | "
                  f"{r['max_spent_c_star']:.1%} | {r['median_spent']:.1%} | {r['stopped_early']:.2f} | "
                  f"{r['seeds_added']:.2f} | {r['mean_regret']:.4f} |", flush=True)


if __name__ == "__main__":
    main()
