"""Replay a finished grid study through the sweep's search (science §9.4): what it would have decided and spent.

    python benchmarks/search_replay.py artifacts                     # the default study's rollout axis
    python benchmarks/search_replay.py artifacts --design rule       # the rules preset of docs/results.md
    python benchmarks/search_replay.py artifacts --start-keys 4 8 16 --decisions
    python benchmarks/search_replay.py artifacts --alpha 0.4           # other settings than params.yaml's

Reads the study's ``runs`` and ``evals`` tables (through DuckDB, rollscale.pipeline.query.storage) and the
search's settings from params.yaml (``sweep.search``, ``sweep.eval_every`` and ``sweep.b_max``), replays
the finished runs rung by rung
(rollscale.core.search.replay.replay: each run truncated where the search would have stopped it) and
prints one row per group: its stops, the keys it would add (in the grid or not), rollouts spent
against the grid's and the search's own answer. It also reads the grid's own decision at C* on every run
(``grid_decision``) and says whether the search's answer is the grid's leader or within epsilon of it.
``--decisions`` prints every decision row too. Pure reading: nothing is written.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rollscale.config import load_params  # noqa: E402
from rollscale.core.search.replay import DESIGNS, replay  # noqa: E402
from rollscale.core.search.state import SearchSettings  # noqa: E402
from rollscale.pipeline.query.storage import query  # noqa: E402
from rollscale.sweep.groups import search_settings  # noqa: E402


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
    search = params.sweep.search.model_copy(update={k: v for k, v in (("eta", args.eta), ("alpha", args.alpha))
                                                    if v is not None})
    settings = search_settings(params.sweep.model_copy(update={"search": search}), params.study, params.bucket.val_size)
    runs = query("SELECT * FROM runs", args.artifacts)
    evals = query("SELECT * FROM evals", args.artifacts)
    start = None
    if args.start_keys:
        keys = tuple(k if args.design == "rule" else int(k) for k in args.start_keys)
        start = _all_groups(runs, evals, args.design, params.sweep.b_max, keys, settings)
    result = replay(runs, evals, args.design, settings, params.sweep.b_max, start)  # keys start as the sweep's
    print(f"{args.artifacts}: {len(runs)} runs; search eta {settings.eta:g}, alpha {settings.alpha:g}, "
          f"first rung {settings.first_rung:g}, extra seeds {settings.extra_seeds}\n")
    table = result.summary.assign(spent=lambda d: d["spent"].map("{:.1%}".format))
    print(table.to_markdown(index=False))
    print("\nThe decision at C* (science §9.4) read on every run of the grid, beside the search's answer:\n")
    print(grid_decision(runs, evals, args.design, settings, params.sweep.b_max, result).to_markdown(index=False))
    if args.decisions:
        print()
        print(result.decisions.drop(columns=["decision"]).to_markdown(index=False, floatfmt=".4g"))


def grid_decision(runs: pd.DataFrame, evals: pd.DataFrame, design: str, settings: SearchSettings, b_max: int,
                  result) -> pd.DataFrame:
    """Per group the grid's own decision at C* (every key, every seed, to C_max; the search's decision function,
    rollscale.core.search.standing.standings, so rules are keys too) and whether the search's answer is the grid's
    leader or within epsilon of it there (the grid's lower bound of its D >= -epsilon)."""
    from rollscale.core.fit.analysis import run_evals
    from rollscale.core.search.methods.decision import c_star, standings
    from rollscale.core.search.replay import replay_groups

    groups, points = replay_groups(run_evals(runs, evals), design, b_max)
    table = standings(points, groups, {g.group: g.c_max for g in groups}, settings)
    answers = result.summary.set_index("group")["search_leader"]
    rows = []
    for g in groups:
        t = table[g.group].star
        lead, answer = t["leader"].iloc[0], answers.get(g.group)
        key = g.key_of(answer) if answer is not None else None
        mine = t.loc[key] if key in t.index else None
        rows.append({"group": g.group, "c_star": c_star(g, settings), "grid_leader": lead,
                     "grid_leader_share": float(t["leader_share"].iloc[0]), "search_answer": answer,
                     "answer_d": float(mine["d"]) if mine is not None else math.nan,
                     "answer_d_lo": float(mine["d_lo"]) if mine is not None else math.nan,
                     "same_leader": key is not None and key == lead,
                     "within_epsilon": mine is not None and (key == lead
                                                             or float(mine["d_lo"]) >= -settings.tolerance)})
    return pd.DataFrame(rows)


def _all_groups(runs: pd.DataFrame, evals: pd.DataFrame, design: str, b_max: int, keys: tuple,
                settings: SearchSettings) -> dict[str, tuple]:
    """The same start keys for every group of the design."""
    from rollscale.core.fit.analysis import run_evals
    from rollscale.core.search.replay import replay_groups

    groups, _ = replay_groups(run_evals(runs, evals), design, b_max)
    return {g.group: keys for g in groups}


if __name__ == "__main__":
    main()
