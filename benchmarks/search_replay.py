"""Replay a finished grid study through the frontier search: what it would have decided and spent.

    python benchmarks/search_replay.py artifacts                     # the default study's rollout axis
    python benchmarks/search_replay.py artifacts --design rule       # the rules preset of docs/results.md
    python benchmarks/search_replay.py artifacts --start-keys 4 8 16 --decisions
    python benchmarks/search_replay.py artifacts --alpha 0.4           # other settings than params.yaml's

Reads the study's ``runs`` and ``evals`` tables (through DuckDB, rollscale.pipeline.storage) and the
search's settings from params.yaml (``sweep.search``, ``sweep.eval_every`` and ``sweep.b_max``), replays
the finished runs rung by rung
(rollscale.core.search.replay.replay: each run truncated where the search would have stopped it) and
prints one row per group: its stops, the keys it would add (in the grid or not), rollouts spent
against the grid's, and whether the best key matches the grid's wherever the grid's share is
>= 95 %. ``--decisions`` prints every decision row too. Pure reading: nothing is written.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rollscale.config import load_params  # noqa: E402
from rollscale.core.search.decisions import SearchSettings  # noqa: E402
from rollscale.core.search.replay import DESIGNS, replay  # noqa: E402
from rollscale.pipeline.storage import query  # noqa: E402
from rollscale.train.search_groups import search_settings  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("artifacts", type=Path)
    ap.add_argument("--params", type=Path, default=Path("params.yaml"))
    ap.add_argument("--design", choices=list(DESIGNS), default="n")
    ap.add_argument("--start-keys", nargs="+", help="start the search from these keys of the grid (bracket test)")
    ap.add_argument("--decisions", action="store_true", help="print every decision row")
    ap.add_argument("--eta", type=float, help="instead of params.yaml's sweep.search.eta")
    ap.add_argument("--alpha", type=float, help="instead of params.yaml's sweep.search.alpha")
    args = ap.parse_args()
    params = load_params(args.params)
    settings = search_settings(params.sweep, params.study)
    settings = dataclasses.replace(settings, **{k: v for k, v in (("eta", args.eta), ("alpha", args.alpha))
                                                 if v is not None})
    runs = query("SELECT * FROM runs", args.artifacts)
    evals = query("SELECT * FROM evals", args.artifacts)
    start = None
    if args.start_keys:
        keys = tuple(k if args.design == "rule" else int(k) for k in args.start_keys)
        start = _all_groups(runs, evals, args.design, params.sweep.b_max, keys, settings)
    # method decision: keys start with seeds_min of the grid's seeds, as the sweep's search starts them
    seeds_min = params.sweep.search.seeds_min if settings.method == "decision" else None
    result = replay(runs, evals, args.design, settings, params.sweep.b_max, start, seeds_min=seeds_min)
    print(f"{args.artifacts}: {len(runs)} runs; search eta {settings.eta:g}, alpha {settings.alpha:g}, "
          f"first rung {settings.first_rung:g}, extra seeds {settings.extra_seeds}\n")
    table = result.summary.assign(spent=lambda d: d["spent"].map("{:.1%}".format),
                                  agree=lambda d: d["agree"].map(lambda v: "—" if pd.isna(v) else f"{v:.1%}"))
    print(table.to_markdown(index=False))
    if args.decisions:
        print()
        print(result.decisions.drop(columns=["decision"]).to_markdown(index=False, floatfmt=".4g"))


def _all_groups(runs: pd.DataFrame, evals: pd.DataFrame, design: str, b_max: int, keys: tuple,
                settings: SearchSettings) -> dict[str, tuple]:
    """The same start keys for every group of the design."""
    from rollscale.core.fit.analysis import run_evals
    from rollscale.core.search.replay import replay_groups

    groups, _ = replay_groups(run_evals(runs, evals), design, b_max)
    return {g.group: keys for g in groups}


if __name__ == "__main__":
    main()
