"""The default study replayed on a long grid (science §11, "What it must show": the second long grid's replay of
the default search answers "use n = X", the grid's best within epsilon, for at most 2 x C* rollouts).

    python benchmarks/grid_replay.py benchmarks/data/long_grid_seed1            # params.yaml's study
    python benchmarks/grid_replay.py GRID... --params params.yaml --json

A long grid (benchmarks/long_grid.py: every key n = 2 to 32, 2 seeds, to 160,000 rollouts) holds every run the
default study could train, and more. Its runs are cut to the study's ``sweep.c_max`` and replayed rung by rung
through the study's search (rollscale.core.search.replay: each run truncated where the search would have stopped
it); the fit stage's decision is then made as ``flows/fit.py`` makes it (the per-run decision, the forecast past
the data with its backtest, the decision read from the forecast where C* lies past the data) on what the search
kept, and the report's first line is read from it. Its answer is judged against the grid's own value at C* (each
key's per-run fit within its data, science §9.3, on every run to 160,000). Pure reading: nothing is written.

Where it stops holding: the grid evaluates from c_max / 64 of its own budget (2,500 rollouts), the default study
from 625, so the replay has fewer early evaluations than a study; they lie in the early regime the forecast's shape
leaves out (science §11.2), not in what it reads.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from long_grid import grid_truth  # noqa: E402

from rollscale.config import StudyParams, load_params  # noqa: E402


def cut_runs(runs: pd.DataFrame, evals: pd.DataFrame, c_max: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The grid's runs as a study with ``c_max`` would have trained them: each run's budget ``c_max``, its
    evaluations up to the first at or past it (the step that crosses the budget ends a run)."""
    runs = runs.assign(c_max=c_max, c=lambda d: d["c"].clip(upper=c_max))
    ends = evals[evals["c"] >= c_max].groupby("run_id")["c"].min()
    last = evals["run_id"].map(ends).fillna(float("inf"))
    return runs, evals[evals["c"] <= last].copy()


def replay_study(folder: Path, params: StudyParams) -> dict:
    """The study of ``params`` replayed on the grid in ``folder``: its first line, its answer, the rollouts its
    search spent (against C*), and the answer's value at C* against the grid's best."""
    from rollscale.core.fit.analysis import run_evals
    from rollscale.core.fit.verdict import honest_intervals
    from rollscale.core.search.replay import replay, replay_groups
    from rollscale.report.decision_text import decision_headline
    from rollscale.sweep.groups import search_settings
    from tasks.fit import decision as decide_at_c_star
    from tasks.fit import decision_past_the_data, forecast

    grid_runs, grid_evals = (pd.read_parquet(folder / f"{name}.parquet") for name in ("runs", "evals"))
    sweep = params.sweep
    c_star = float(params.target_budget)
    truth = grid_truth(grid_evals.merge(grid_runs[["run_id", "n", "seed"]], on="run_id"), c_star)
    runs, evals = cut_runs(grid_runs, grid_evals, sweep.c_max)
    settings = search_settings(sweep, params.study, params.bucket.val_size)
    # the study's keys start the search (``sweep.n``); the grid's others come in only through the bracket
    groups, _ = replay_groups(run_evals(runs, evals), "n", sweep.b_max)
    start = {g.group: tuple(k for k in sweep.n if k in g.keys) for g in groups}
    result = replay(runs, evals, "n", settings, sweep.b_max, start)
    # the fit stage's own steps (flows/fit.py), their library bodies (.fn) on what the search kept
    kept = result.evals
    decided = decide_at_c_star.fn(kept, params.target_budget, params.study.tolerance, sweep.search.eta, params.fit,
                                  result.decisions)
    ahead = forecast.fn(kept, params.target_budget, sweep.c_max, params.bucket.val_size * sweep.eval_k, params.fit,
                        params.study.forecast_form, sweep)
    decision = honest_intervals(decision_past_the_data.fn(decided, ahead.forecast))
    line, answered, _ = decision_headline(decision, sweep.eval_k)
    answer = int(line.removeprefix("Use n = ").split(" ", 1)[0]) if line.startswith("Use n = ") else None
    best = max(truth.values())
    spent = float(result.runs["search_c"].sum())
    return {"grid": str(folder), "line": line, "answered": bool(answered), "answer": answer,
            "answer_at_c_star": truth.get(answer) if answer is not None else None,
            "grid_best": best, "grid_best_key": max(truth, key=truth.get),
            "within_epsilon": answer is not None and truth[answer] >= best - params.study.tolerance,
            "rollouts": spent, "rollouts_over_c_star": spent / c_star,
            "keys_trained": sorted(int(k) for k in result.runs.loc[result.runs["search_c"] > 0, "key"].unique()),
            "backtest": ahead.backtest.to_dict(orient="records") if not ahead.backtest.empty else []}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("grids", type=Path, nargs="+", help="long grid folders (runs and evals Parquet files)")
    ap.add_argument("--params", type=Path, default=ROOT / "params.yaml", help="the study replayed")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    params = load_params(args.params)
    rows = [replay_study(folder, params) for folder in args.grids]
    if args.json:
        print(json.dumps(rows, indent=1, default=str))
        return
    print("| grid | first line | answer at C* (grid) | grid's best | within epsilon | rollouts / C* |\n"
          "|---|---|---|---|---|---|")
    for r in rows:
        at = f"{r['answer_at_c_star']:.3f}" if r["answer_at_c_star"] is not None else "-"
        print(f"| {r['grid']} | {r['line']} | {at} | n = {r['grid_best_key']}: {r['grid_best']:.3f} | "
              f"{'yes' if r['within_epsilon'] else 'no'} | {r['rollouts_over_c_star']:.2f} |")


if __name__ == "__main__":
    main()
