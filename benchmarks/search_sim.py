"""Frontier search against the full grid on simulated studies: rollouts spent against decisions changed.

    python benchmarks/search_sim.py --per-family 40 --eta 1.41 2 3 --alpha 0.05 0.2 0.3 0.4

For every (eta, alpha) (and ``--first-rung``, ``--extra-seeds``), the same simulated studies
(rollscale.core.search.simulate: five families shaped like the embedded default, 3 seeds) run as a
grid and as a frontier search, both through rollscale.core.search.decisions. Prints a markdown table:
where the grid names a best key in >= 95 % of its bootstrap refits, the share of those budgets
where the search names the same key ("agree", over the families where A2 holds, and for the
A2-violated family apart), the median and mean rollouts the search spent as a fraction of the
grid's, and how often the A2 warning fires on the grid's and the search's answers (in the a2
family it should; elsewhere it is a false alarm). CPU seconds per configuration are printed
too: the search's own cost, not a training time.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rollscale.core.search.decisions import SearchSettings  # noqa: E402
from rollscale.core.search.simulate import FAMILIES, make_studies, simulate, summarise  # noqa: E402

HOLDS = tuple(f for f in FAMILIES if f != "a2")  # families where A2 holds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-family", type=int, default=40)
    ap.add_argument("--eta", type=float, nargs="+", default=[1.41, 2.0, 3.0])
    ap.add_argument("--alpha", type=float, nargs="+", default=[0.05, 0.2, 0.3, 0.4])
    ap.add_argument("--first-rung", type=float, nargs="+", default=[0.0625])
    ap.add_argument("--extra-seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--resamples", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--families", action="store_true", help="one row per family as well")
    args = ap.parse_args()
    studies = make_studies(args.per_family, seed=args.seed)
    print(f"{len(studies)} studies ({args.per_family} per family: {', '.join(FAMILIES)}), "
          f"{args.resamples} bootstrap resamples\n")
    print("| eta | alpha | first rung | extra seeds | agree (A2 holds) | decided budgets | median spent | "
          "mean spent | agree (a2) | A2 warns, a2: grid / search | false alarms: grid / search | CPU s |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for eta in args.eta:
        for alpha in args.alpha:
            for first in args.first_rung:
                for extra in args.extra_seeds:
                    settings = SearchSettings(eta=eta, alpha=alpha, first_rung=first, extra_seeds=extra,
                                              resamples=args.resamples)
                    t = time.process_time()
                    result = simulate(studies, settings)
                    cpu = time.process_time() - t
                    ok, bad = summarise(result, families=HOLDS), summarise(result, families=("a2",))
                    print(f"| {eta:g} | {alpha:g} | {first:g} | {extra} | {ok['agree']:.1%} | "
                          f"{ok['decided_budgets']:.0f} | {ok['median_spent']:.1%} | {ok['mean_spent']:.1%} | "
                          f"{bad['agree']:.1%} | {bad['a2_warns_grid']:.0%} / {bad['a2_warns_search']:.0%} | "
                          f"{ok['a2_warns_grid']:.0%} / {ok['a2_warns_search']:.0%} | {cpu:.0f} |", flush=True)
                    if args.families:
                        for family in FAMILIES:
                            f = summarise(result, families=(family,))
                            print(f"|  | {family} |  |  | {f['agree']:.1%} | {f['decided_budgets']:.0f} | "
                                  f"{f['median_spent']:.1%} | {f['mean_spent']:.1%} |  |  |  |  |", flush=True)


if __name__ == "__main__":
    main()
