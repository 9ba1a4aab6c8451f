"""The report's first screen: the decision at C*, or the answer, or "no answer yet" and what to change.

With a ``decision`` table (science §9) the first line is the decision at the target budget
(:mod:`rollscale.report.decision_text`), its table follows, and the claims below (frontier, rules, the
CRS comparison) are read beside it; without one (an older fit), the claims lead (science §7).

The study answers when at least one claim is decided by its interval: a best n
that every bootstrap refit agrees on, a rule whose ratio to uniform excludes 1,
an observed best n that 95 % of seed resamples agree on. Otherwise the headline
says "No answer yet" and why, each reason with the params key that fixes it:
stages not run, what ran (:mod:`rollscale.report.reasons`: unfinished runs, runs that did not learn,
infinite noise estimates, a bucket too small), one seed per setting (no interval: what one seed shows is listed
apart, never claimed), curves that could not be fitted (too few evaluations per
run), curves not bent within the budget, intervals that overlap (the validation
noise floor from :mod:`rollscale.core.fit.power`). The sweep's search (science §9.4)
adds what it spent against a grid of the same runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd

from rollscale.core.fit import power
from rollscale.config.sections import MeasureParams
from rollscale.report.base import TableSpec, as_numeric, check_tables, fmt_value, params_dict, stages_not_run
from rollscale.report.reasons import blocking_reasons, infinite_noise
from rollscale.report.claims import CAVEAT, DECIDED, OVERLAP, claim_rows, headline_table, observations_table
from rollscale.report.decision_text import decision_headline, decision_spec, first_design, fmt_budget, \
    from_forecast
from rollscale.report.charts.search import search_cost, search_sentence
from rollscale.report.horizon import UNTRUSTED, backtest_failed, backtest_sentence, untrained_above

__all__ = ["Answer", "study_answer"]

SHOWN = 3  # decided claims quoted in the headline sentence


@dataclass(frozen=True)
class Answer:
    answered: bool
    headline: str  # one sentence: the answer, or "No answer yet: ..."; then the search's cost (§9.4)
    fixes: list[str]  # what to change, each naming its params key
    claims: TableSpec
    observations: TableSpec | None
    decision: TableSpec | None = None  # the decision at C* (science §9.4), first below the headline


def _seeds_per_setting(runs: pd.DataFrame) -> int:
    keys = [c for c in ("bucket", "rule", "n", "b_problem") if c in runs.columns]
    if "seed" not in runs.columns or not keys:
        return 1
    return int(runs.groupby(keys)["seed"].nunique().max())


def _fit_fixes(t: Mapping[str, pd.DataFrame | None]) -> list[str]:
    fixes = []
    fits, evals = t.get("fits"), t.get("evals")
    sig = fits[fits["kind"].astype(str).str.startswith("sigmoid")] if fits is not None and "kind" in fits else None
    if sig is not None and "status" in sig and len(sig):
        failed = sig[sig["status"].astype(str) != "ok"]
        if len(failed):
            per_run = evals.groupby("run_id").size() if evals is not None and "run_id" in evals else pd.Series(dtype=int)
            have = f"runs have {int(per_run.min())}-{int(per_run.max())} evaluations; " if len(per_run) else ""
            fixes.append(f"more evaluations per run: {len(failed)} of {len(sig)} reward curves could not be fitted "
                         f"({failed['status'].astype(str).iloc[0]}); {have}a sigmoid needs {power.FIT_MIN_EVALS} "
                         f"record points at distinct budgets, about {power.EVALS_COMFORTABLE} evaluations: raise "
                         "sweep.eval_per_doubling (lower sweep.eval_every when it is 0) or sweep.c_max")
    elif fits is not None and t.get("frontier") is None:
        fixes.append("more evaluations per run (sweep.eval_every, sweep.c_max): no curve could be fitted")
    return fixes


def _noise_fix(evals: pd.DataFrame | None) -> str:
    """Validation noise at the study's own size: the difference it cannot resolve."""
    if evals is None or not {"n_problems", "k", "avg_at_k"} <= set(evals.columns):
        return "more seeds (sweep.seeds) and validation problems (bucket.val_size): the intervals overlap"
    val, k = int(as_numeric(evals["n_problems"]).max()), int(as_numeric(evals["k"]).max())
    p = float(as_numeric(evals["avg_at_k"]).mean())
    d = power.detectable_difference(power.avg_at_k_se(val, k, min(p * (1 - p), 0.25)))
    return (f"more validation problems (bucket.val_size, now {val}) or samples (sweep.eval_k, now {k}), and seeds "
            f"(sweep.seeds): at {val} x {k} samples, avg@k differences below {fmt_value(d, 3)} are not detectable, "
            "and the intervals overlap")


def _answer_text(decided: pd.DataFrame) -> str:
    """The decided claims in a sentence: the best n as budget ranges per bucket and rule
    ("n* = 4 at C = 200-1,008, n* = 8 at C = 5,080"), then the other claims' findings."""
    parts = []
    best = decided[decided["claim"] == "best n at budget"]
    for where, g in best.sort_values("c").groupby("where", sort=False):
        runs = (g["best_n"] != g["best_n"].shift()).cumsum()
        spans = [f"n* = {int(r['best_n'].iloc[0])} at C = {fmt_budget(r['c'].min())}"
                 + (f"-{fmt_budget(r['c'].max())}" if len(r) > 1 else "") for _, r in g.groupby(runs)]
        parts.append(f"{where}: {', '.join(spans)} (every other n's interval below it)")
    others = decided[decided["claim"] != "best n at budget"]
    shown = 0 if parts else SHOWN  # the best n leads; other claims are quoted when there is none
    parts += [f"{r.finding} ({r.where})" for r in others.head(shown).itertuples()]
    more = len(others) - shown
    return "; ".join(parts) + (f"; {more} more claim{'s' if more > 1 else ''} below" if more > 0 else "")


def study_answer(tables: Mapping[str, pd.DataFrame | None], params: Mapping[str, Any] | None = None,
                 cannot_answer: str | None = None) -> Answer:
    """The answer the tables support, or why there is none yet and what to change. ``cannot_answer``: why the study
    as written cannot settle a key at its tolerance (`rollscale check`'s verdict, the line `rollscale init` refused
    it on before ``--force`` wrote it), said first."""
    t = check_tables(tables)
    tolerance, eta = _decision_settings(params)
    rows = claim_rows(t, tolerance, eta)
    claims, observations = headline_table(t, rows), observations_table(t, rows)
    decided = rows[rows["basis"] == DECIDED]
    not_run = [s for s in stages_not_run(t) if s in ("sweep", "fit")]
    fixes: list[str] = []
    blocking = [] if not_run else blocking_reasons(t, params)  # what ran leaves the fit's reasons moot (reasons.py)
    if not_run:
        fixes.append(f"run the {' and '.join(not_run)} stage{'s' if len(not_run) > 1 else ''} "
                     f"(`rollscale run {not_run[0]}`)")
    else:
        if t.get("runs") is not None and (seeds := _seeds_per_setting(t["runs"])) < 2:
            fixes.append(f"more seeds: sweep.seeds [0, 1, 2] (now {seeds} per setting): one run gives no "
                         "interval, so nothing it shows is a claim")
        fixes = blocking + fixes + ([] if blocking else _fit_fixes(t))
        if (rows["basis"] == CAVEAT).any():
            fixes.append("a larger budget (sweep.c_max): some reward curves have not bent within it, so their "
                         "ceilings are extrapolations")
        if decided.empty and (rows["basis"] == OVERLAP).any():
            fixes.append(_noise_fix(t.get("evals")))
        noise = infinite_noise(t.get("noise_steps"), t.get("noise_prompts"), t.get("bucket_counts"),
                               _measure(params))
        if noise is not None:  # the CRS check's, never the answer's
            fixes.append(noise)
    if not decided.empty:
        headline = "Answer: " + _answer_text(decided)
    elif not_run:
        headline = "No answer yet: the study has not run as far as the fit."
    elif blocking:
        headline = f"No answer yet: {blocking[0]}."
    else:
        headline = "No answer yet: the data cannot decide. " + (
            "To answer, change what is listed below." if fixes else "")
    headline, answered, table, forecast = headline.strip(), not decided.empty, None, False
    if not not_run and (decision := t.get("decision")) is not None:
        headline, answered, to_decide = decision_headline(decision, _eval_k(t.get("evals")))
        # what ran comes first (its reasons make the decision's own moot), then what the decision needs
        fixes = fixes[:len(blocking)] + to_decide + fixes[len(blocking):]
        if blocking:  # a decision among runs none of which learned (or ended) answers nothing; its
            # table stays below. The SmolLM2 hour study said "n = 2 ... 0.47 [0.00, 1.00]; n = 4 is within 0.02"
            headline, answered = f"No answer yet: {blocking[0]}.", False
        table = decision_spec(decision)
        forecast = from_forecast(first_design(decision))
        fixes = fixes + (untrained_above(t) if forecast else [])  # the bracket, on the forecast's keys
        if forecast and backtest_failed(t):
            # the answer is the verdict's (science §11.5), as export and track read it; a failed backtest stands
            # beside it (§11.4: its errors have widened the interval) and is the first thing to change
            fixes.insert(0, "sweep.c_max closer to study.target_budget: C* lies past the runs' data, where the "
                         f"answer is the forecast's, and the study's backtest says it is {UNTRUSTED}")
    # science §10.3: the backtest beside the answer, and always beside a decision the forecast made
    if (answered or forecast) and (backtest := backtest_sentence(t)) is not None:
        headline = headline + ("" if headline.endswith(".") else ".") + " " + backtest
    if (cost := search_cost(t, params)) is not None:
        headline = headline + ("" if headline.endswith(".") else ".") + " " + search_sentence(cost)
    return Answer(answered, headline, [cannot_answer, *fixes] if cannot_answer else fixes, claims, observations,
                  table)


def _measure(params: Mapping[str, Any] | Any | None) -> MeasureParams | None:
    """The study's measure settings (None: the defaults), from typed params or a mapping."""
    measure = params_dict(params).get("measure")
    try:
        return MeasureParams.model_validate(measure) if isinstance(measure, Mapping) else None
    except ValueError:
        return None


def _decision_settings(params: Mapping[str, Any] | Any | None) -> tuple[float | None, float | None]:
    """``study.tolerance`` and ``sweep.search.eta`` where params give them (None: the claims' defaults)."""
    p = params_dict(params)
    study, sweep = p.get("study") or {}, p.get("sweep") or {}
    search = sweep.get("search") if isinstance(sweep, Mapping) else None
    tolerance = study.get("tolerance") if isinstance(study, Mapping) else None
    eta = search.get("eta") if isinstance(search, Mapping) else None
    return (None if tolerance is None else float(tolerance)), (None if eta is None else float(eta))


def _eval_k(evals: pd.DataFrame | None) -> int | None:
    """The k of validation avg@k, from the evaluations (None when they do not say)."""
    if evals is None or "k" not in evals.columns or not as_numeric(evals["k"]).notna().any():
        return None
    return int(as_numeric(evals["k"]).max())
