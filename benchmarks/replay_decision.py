"""Replay a stored grid study's decision at C* (science §9): from its runs cut short, and through both searches.

    python benchmarks/replay_decision.py /tmp/fresh/artifacts --params /tmp/fresh/params.yaml
    python benchmarks/replay_decision.py artifacts --cuts 1 0.5 0.25 --far-eta 4 --tolerance 0.05

Reads the study's ``runs`` and ``evals`` tables (through DuckDB, rollscale.pipeline.query.storage: nothing is
written) of a grid (every key, every seed, to C_max) and prints two markdown tables for docs/benchmarks.md:

1. **Truncation** (issue 28, part 6): the decision at C* (``study.target_budget``, default C_max) from every
   run cut at each fraction of C_max in ``--cuts`` (rollscale.core.search.agreement.truncated: the run as if it
   had been trained to that budget), against the decision on the full grid, both by the fit stage's
   rollscale.core.fit.decision_table.decision_table with its params (``study.tolerance``,
   ``sweep.search.eta``, ``fit.bootstrap_resamples`` and ``fit.bootstrap_seed``). Where every key is unknown
   at a cut (C* beyond eta times the data), ``--far-eta`` reads it again with that eta (beyond A3, labelled).
2. **Searches** (issue 29, part 3): the grid replayed rung by rung through every registered search method
   (rollscale.registry.SEARCH_METHODS; decision, science §9.4: keys starting with ``sweep.search.seeds_min``
   seeds) with the study's search settings (rollscale.core.search.replay.replay, which calls the search's own
   rollscale.core.search.decisions.decide): rollouts spent against the grid's, the search's own answer, and
   the fit stage's decision at C* on the runs as the search would have left them, against the full grid's.
"""

from __future__ import annotations

import argparse
import inspect
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rollscale.config import load_params  # noqa: E402
from rollscale.core.fit.analysis import run_evals  # noqa: E402
from rollscale.core.fit.decision_table import decision_table  # noqa: E402
from rollscale.core.search.agreement import decision_agreement, truncated  # noqa: E402
from rollscale.core.search.decisions import search_method  # noqa: E402
from rollscale.core.search.replay import DESIGNS, replay  # noqa: E402
from rollscale.pipeline.query.storage import query  # noqa: E402
from rollscale.registry import SEARCH_METHODS  # noqa: E402
from rollscale.sweep.groups import search_design, search_settings  # noqa: E402


def _interval(row: pd.Series) -> str:
    if pd.isna(row["reward"]):
        return "—"
    return f"{row['reward']:.3f} [{row['reward_lo']:.3f}, {row['reward_hi']:.3f}]"


def _decision_cells(row: pd.Series) -> dict[str, object]:
    """The decision's columns of a table row (shared by both tables)."""
    return {"leader": "none" if pd.isna(row["leader"]) else int(row["leader"]),
            "decided": "yes" if row["decided"] else "no", "within ε": row["within"] or "—",
            "settled": row["settled"] or "—", "open": row["open"] or "—", "unknown": row["unknown"] or "—",
            "R_leader(C*) [95 %]": _interval(row) + (" (extrapolated)" if row["extrapolated"] else ""),
            "same leader as grid": "yes" if row["same_leader"] else "no",
            "leader within ε of grid's": "yes" if row["within_grid"] else "no",
            "grid's D of leader": "—" if pd.isna(row["grid_gap"]) else f"{row['grid_gap']:+.3f}",
            "D >= -ε": "yes" if row["gap_within"] else "no",
            "covers grid's R": "yes" if row["covers_grid"] else "no"}


def truncation_table(ev: pd.DataFrame, c_max: float, c_star: float, tolerance: float, eta: float,
                     cuts: list[float], far_eta: float | None, resamples: int, seed: int) -> tuple[pd.DataFrame, str]:
    """Issue 28, part 6: one row per (cut, design group); the per-key rewards beside it as text."""
    rows, notes = [], []
    for cut in cuts:
        kept = truncated(ev, cut * c_max)
        agree = decision_agreement(ev, kept, c_star, tolerance, eta, resamples, seed)
        reads = [(f"{eta:g}", agree)]
        if far_eta is not None and (agree["unknown"] != "").any():  # read again only where eta leaves keys unknown
            reads.append((f"{far_eta:g} (beyond A3)", decision_agreement(ev, kept, c_star, tolerance, far_eta,
                                                                         resamples, seed)))
        for label, agree in reads:
            for _, r in agree.iterrows():
                rows.append({"runs cut at": f"C_max × {cut:g} = {cut * c_max:,.0f}", "eta": label,
                             "group": f"{r['design']}: {r['bucket']}/{r['rule']}/{r['fixed']}",
                             "largest C seen": f"{r['c_seen']:,.0f}", **_decision_cells(r)})
                notes.append(f"- cut {cut:g}, eta {label}, {r['bucket']}/{r['rule']}: {r['rewards']}")
    return pd.DataFrame(rows), "\n".join(notes)


def search_table(runs: pd.DataFrame, evals: pd.DataFrame, ev: pd.DataFrame, params, design: str, c_star: float,
                 resamples: int, seed: int) -> pd.DataFrame:
    """Issue 29, part 3: one row per (method, search group)."""
    rows = []
    for method in (m for m in SEARCH_METHODS.names() if search_method(m).searches):
        search = params.sweep.search.model_copy(update={"method": method})
        sweep = params.sweep.model_copy(update={"search": search})
        settings = search_settings(sweep, params.study, params.bucket.val_size)
        start = time.perf_counter()
        res = replay(runs, evals, design, settings, sweep.b_max)
        seconds = time.perf_counter() - start
        # the fit stage reads the sweep's search table beside the runs where its decision takes it (science §9.4)
        table = res.decisions if "search" in inspect.signature(decision_table).parameters else None
        agree = decision_agreement(ev, res.evals, c_star, params.study.tolerance, search.eta, resamples, seed, table)
        for _, s in res.summary.iterrows():
            # the decision table's group of this search group (one per bucket and rule on these designs)
            bucket, rule = (dict(p.split("=", 1) for p in s["group"].split(":", 1)[1].split("/"))[k]
                            for k in ("bucket", "rule"))
            mine = agree[(agree["bucket"] == bucket) & (agree["rule"] == rule) & (agree["design"] == "n")]
            own = f"{s['search_leader']}" if s["search_decided"] else f"not decided ({s['search_leader']} leads)"
            row = {"method": method, "group": s["group"], "rungs": s["rungs"], "stops": s["stops"] or "—",
                   "seeds not in grid": s["seeds_not_in_grid"],
                   "rollouts": f"{s['search_rollouts']:,.0f} of {s['grid_rollouts']:,.0f} ({s['spent']:.1%})",
                   "search's answer": own, "replay s": f"{seconds:.1f}"}
            if len(mine):
                row.update({f"fit at C*: {k}": v for k, v in _decision_cells(mine.iloc[0]).items()})
            rows.append(row)
    return pd.DataFrame(rows)


def _commit(path: Path) -> str:
    try:
        return subprocess.run(["git", "-C", str(path), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("artifacts", type=Path)
    ap.add_argument("--params", type=Path, default=Path("params.yaml"))
    ap.add_argument("--cuts", type=float, nargs="+", default=[1.0, 0.5, 0.25],
                    help="fractions of C_max every run is cut at (1: the full grid)")
    ap.add_argument("--far-eta", type=float, default=4.0, help="eta to read a cut again where every key is unknown")
    ap.add_argument("--design", choices=list(DESIGNS), help="the search's design (default: the sweep's)")
    ap.add_argument("--resamples", type=int, help="instead of params.yaml's fit.bootstrap_resamples")
    ap.add_argument("--tolerance", type=float, help="instead of params.yaml's study.tolerance (epsilon)")
    args = ap.parse_args()
    if not all(0 < c <= 1 for c in args.cuts):
        ap.error(f"--cuts: fractions of C_max in (0, 1], got {args.cuts}")
    params = load_params(args.params)
    if args.tolerance is not None:
        params = params.model_copy(update={"study": params.study.model_copy(update={"tolerance": args.tolerance})})
    runs = query("SELECT * FROM runs", args.artifacts)
    evals = query("SELECT * FROM evals", args.artifacts)
    ev = run_evals(runs, evals, params.fit.run_status)
    if ev.empty:
        sys.exit(f"{args.artifacts}: no finished run with evaluations in the runs / evals tables")
    c_max, c_star = float(params.sweep.c_max), float(params.target_budget)
    resamples = args.resamples if args.resamples is not None else max(params.fit.bootstrap_resamples, 1)
    seed, tol, eta = params.fit.bootstrap_seed, params.study.tolerance, params.sweep.search.eta
    design = args.design or search_design(params.sweep) or "n"
    print(f"{args.artifacts}: {ev['run_id'].nunique()} runs, seeds {sorted(ev['seed'].unique().tolist())}, "
          f"C_max {c_max:,.0f}, C* {c_star:,.0f}, epsilon {tol:g}, eta {eta:g}, {resamples} paired refits; "
          f"code at {_commit(Path(__file__).resolve().parents[1])}, study at {_commit(args.artifacts.resolve().parent)}\n")
    start = time.perf_counter()
    table, notes = truncation_table(ev, c_max, c_star, tol, eta, args.cuts, args.far_eta, resamples, seed)
    print(f"## The decision at C* from runs cut short ({time.perf_counter() - start:.1f} s)\n")
    print(table.to_markdown(index=False))
    print("\nEvery key's R(C*) [95 %]:\n" + notes + "\n")
    print(f"## The searches replayed on the grid (design {design})\n")
    print(search_table(runs, evals, ev, params, design, c_star, resamples, seed).to_markdown(index=False))


if __name__ == "__main__":
    main()
