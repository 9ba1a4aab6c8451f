"""Stage ``fit``: the compute-optimal frontier, steps to target and the CRS check (science §7).

Runs are analysed per training bucket and allocation rule, using runs that
finished (``fit.run_status``). In each run's validation curve, reward against
compute C is cut into bins of ``fit.bin_width`` and the first evaluation of
each new highest bin is kept: its record-breaking points. For every n, a
monotonic sigmoid R(C) = R0 + (A - R0) / (1 + (C_mid / C)^beta) is fitted to
the pooled record points of all runs with that n; the frontier F(C) is the
maximum of these curves on a log grid of C, n*(C) its argmax, and a logistic
in log10 C is fitted to log2 n*. The same is done with B_problem as the free
variable among runs with the same n, and with n among runs sharing a total
batch B (iso-batch, against optimizer steps M). Where n* changes, we report
the epochs the new best run had completed there. Validation avg@k is a mean of
0/1 rewards, so no curve's asymptote exceeds 1; a curve is used up to
``sweep.search.eta`` times past its last evaluation (a run the frontier
search stopped early), and the frontier marks budgets decided beyond that;
along the rollout axis a row says whether n* falls with budget (science §8).

For the critical batch size, each run's S(B) is the first step whose
validation reward reaches a target R* (``fit.target``; by default the step-0
reward plus ``fit.target_gain`` of the best gain), E(B) = B·S(B), and
S(B) = S_min (1 + B_crit / B) is fitted along the prompt axis (n fixed) and
the rollout axis (B_problem fixed). Finally, the critical rollout size
measured by the measure stage (median over steps at its largest n) is put
beside the best n observed under a fixed total batch; and every allocation
rule's rollouts to a common target reward, and its training steps' wall
seconds to it (a rule that trains on fewer rollouts makes cheaper steps), are
set against uniform GRPO's. Along training, every step's two random halves of prompts give |G|^2, the
step's noise, B_simple, K_crit and the CRS per run, key and doubling of C (science §6.4), with block-bootstrap
intervals over steps.

Every fitted number gets a 95 % interval from refits on runs resampled with
replacement within each config (its seeds; ``fit.bootstrap_resamples``); a
config with one seed says "1 seed, no interval" instead.

The decision (science §9): at the target budget C* (``study.target_budget``,
default ``sweep.c_max``) one R0 from every run's step-0 evaluation, every
run's sigmoid at it, each key's reward at C* with an interval that pools the
seed-to-seed spread across keys, and its difference D to the leader: a key
is settled when D's upper bound is at most ``study.tolerance``, within
tolerance when its lower bound is at least minus it; keys past eta times
their data are unknown.

Past the data (science §10): in each group with an ordered key (n; B_problem at a fixed n) one reward
surface is fitted to every run at once, the keys' curve parameters pooled towards a line in log2 of the key;
its bootstrap refits resample seed slots paired across keys and redraw the evaluation noise. Every key's
reward, trained or not, is read at C* and at 2, 4 and 8 times the runs' budget (the ``forecast`` table), and
the forecast is checked on the study's own runs cut at half their budget (the ``backtest`` table): a group
whose intervals cover fewer than two thirds of its keys' final rewards, or whose key lies off the surface, is
not to be trusted past its data. Where C* lies beyond eta times a group's data (no key, or not its leader, can be
read there by its own runs' fits) the group's decision is the forecast's: the leader is the trained key the
surface puts first, a key is settled when the upper bound of its D is at most the tolerance, and a reward whose
interval is wider than the forecast's widest answer is unknown (the ``decision`` table's ``source`` says which).

A fit that has too few points is kept as a row saying why, never an error.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from prefect import flow

from rollscale.core.fit.analysis import DESIGNS
from rollscale.core.fit.verdict import honest_intervals
from rollscale.files import write_parquets_atomic
from tasks.common import ARTIFACTS, read_params, refresh_duckdb
from tasks.fit import (
    crs_prediction,
    decision,
    decision_past_the_data,
    evaluations,
    forecast,
    frontier,
    noise_along,
    read_tables,
    record_points,
    rule_comparison,
    steps_to_target,
)


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    kept = [f for f in frames if len(f.columns)]
    return pd.concat([f for f in kept if not f.empty] or kept[:1], ignore_index=True)


@flow(name="fit")
def fit_flow(params_path: str = "params.yaml", artifacts: str = str(ARTIFACTS)) -> dict[str, pd.DataFrame]:
    params = read_params(params_path)
    root = Path(artifacts)
    study = read_tables(root, ["runs", "evals", "noise_steps", "noise_prompts", "steps", "search"])
    if study["runs"] is None or study["evals"] is None:
        raise FileNotFoundError(f"{root / 'sweep' / 'runs'} has no runs with evaluations: "
                                "run the 'sweep' stage first (dvc repro sweep)")
    if study["noise_steps"] is None:
        print("fit: no noise_steps table (the measure stage has not run): the CRS check will say 'not measured'")

    evals = evaluations(study["runs"], study["evals"], params.fit)
    used = evals["run_id"].nunique()
    print(f"fit: {used} of {len(study['runs'])} runs have status in {params.fit.run_status} and evaluations")
    points = record_points(evals, params.fit)
    fronts = {design: frontier(points, design, params.fit, params.sweep.search.eta) for design in DESIGNS}
    stepped = steps_to_target(evals, params.fit)
    rules = rule_comparison(evals, study["steps"], params.fit)
    crs = crs_prediction(evals, study["noise_steps"], params.fit)
    # the noise along training (science §6.4): each step's two halves of prompts, pooled per doubling of C
    along = noise_along(study["runs"], study["steps"], study["noise_prompts"], params.fit)
    # the search's verdicts join the decision: a key it settled at a rung stays settled (science §9.4)
    decided = decision(evals, params.target_budget, params.study.tolerance, params.sweep.search.eta, params.fit,
                       study["search"])
    # past the data (science §10): one surface over each ordered group's keys, read at C* and at 2x, 4x and 8x
    # the runs' budget, and its backtest on the runs cut at half their budget
    ahead = forecast(evals, params.target_budget, params.sweep.c_max, params.bucket.val_size * params.sweep.eval_k,
                     params.fit, params.study.forecast_form, params.sweep)
    # where C* lies past what the per-run fits can read (every key, or the leader, beyond eta x its data) the
    # study's decision is the forecast's
    decided = decision_past_the_data(decided, ahead.forecast)

    tables = {
        "record_points": points,
        "fits": _concat([*(f.fits for f in fronts.values()), stepped.fits, rules]),
        "frontier": _concat([f.frontier for f in fronts.values()]),
        "epoch_transitions": _concat([f.transitions for f in fronts.values()]),
        "steps_to_target": stepped.steps_to_target,
        "crs_prediction": crs,
        "noise_along": along,
        "decision": decided,
        "forecast": ahead.forecast,
        "backtest": ahead.backtest,
    }
    # no estimate outside its interval, no degenerate interval in what the report and export read (science §11.5)
    tables.update({name: honest_intervals(tables[name]) for name in ("decision", "forecast", "fits")})
    # all at once: a failure while writing (a full disk) leaves the earlier tables whole and consistent
    write_parquets_atomic({root / "fit" / f"{name}.parquet": table for name, table in tables.items()})
    refresh_duckdb(root)

    fits = tables["fits"]
    for _, row in fits[~fits["kind"].str.startswith("sigmoid")].iterrows():
        where = "/".join(str(v) for v in (row["bucket"], row["rule"], row["fixed"]) if isinstance(v, str))
        print(f"fit: {row['kind']:24s} {where:28s} {row['status']}")
    return tables


if __name__ == "__main__":
    fit_flow()
