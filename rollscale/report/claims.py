"""The report's headline: the claims the data supports, each with its interval (science §7).

A claim that one setting beats another (n1 vs n2, a rule vs uniform) is made
only where the bootstrap interval of the difference excludes zero; elsewhere
the headline says "not distinguishable", and a point with one seed says so.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from rollscale.core.fit.bootstrap import ONE_SEED
from rollscale.report.base import TableSpec, absent, as_numeric, fmt_value
from rollscale.report.decision_text import fmt_budget

BUDGETS_SHOWN = 4  # budgets per frontier, spread over its grid in log C
NEAR_C_STAR = 0.25  # best-n claims within 2^0.25 of C* are left to the decision at C*
AGREE = 0.95  # share of seed resamples that must agree on the observed best n for it to be a claim
# what a headline row rests on: only DECIDED rows answer; ONE_SEED rows are observations, never claims
DECIDED, OVERLAP, UNDECIDED, CAVEAT, WARNING = "decided", "intervals overlap", "undecided", "caveat", "warning"
COLUMNS = ["claim", "where", "at", "finding"]
# a row resting on an input with no finite estimate (an infinite CRS: the measured signal |G|^2 <= 0) is no claim,
# however many seed resamples agree on the rest (issue 43); listed with the observations, as one seed's rows are
NO_FINITE = "no finite estimate"
NOT_CLAIMS = (ONE_SEED, NO_FINITE)


def interval_text(value: Any, lo: Any, hi: Any) -> str:
    """``v [lo, hi]``, or ``v (1 seed, no interval)`` where the interval is missing."""
    v = fmt_value(value)
    lo_f, hi_f = (float(pd.to_numeric(x, errors="coerce")) for x in (lo, hi))
    if v == "—":
        return v
    if math.isnan(lo_f) or math.isnan(hi_f):
        return f"{v} ({ONE_SEED})"
    return f"{v} [{fmt_value(lo_f)}, {fmt_value(hi_f)}]"


def _best_n_claims(frontier: pd.DataFrame) -> list[dict[str, str]]:
    rows = []
    fr = frontier[frontier["design"].astype(str) == "n"] if "design" in frontier else frontier
    fr = fr.assign(**{c: fr[c].astype(str) if c in fr else "all" for c in ("bucket", "rule")})
    for (bucket, rule), g in fr.groupby(["bucket", "rule"], sort=True):
        g = g.sort_values("c").reset_index(drop=True)
        for i in np.unique(np.linspace(0, len(g) - 1, BUDGETS_SHOWN).round().astype(int)):
            r = g.iloc[i]
            best = int(r["best_key"])
            share, lo, hi = (float(pd.to_numeric(r.get(k), errors="coerce")) for k in
                             ("best_key_share", "best_key_lo", "best_key_hi"))
            if math.isnan(share):
                verdict, basis = f"n* = {best} ({ONE_SEED})", ONE_SEED
            elif lo == hi == best:
                verdict, basis = f"n* = {best}: {share:.0%} of refits agree", DECIDED
            else:
                verdict, basis = (f"n* = {best} in {share:.0%} of refits; not distinguishable from "
                                  f"n in [{fmt_value(lo)}, {fmt_value(hi)}]"), OVERLAP
            rows.append({"claim": "best n at budget", "where": f"{bucket} / {rule}", "at": f"C = {fmt_budget(r['c'])}",
                         "finding": verdict, "basis": basis, "best_n": best, "c": float(r["c"]), "share": share})
    return rows


def _rule_claims(fits: pd.DataFrame) -> list[dict[str, str]]:
    rows = []
    if "rule" not in fits:
        return rows
    rules = fits[(fits["kind"].astype(str) == "rollouts_to_target") & (fits["rule"].astype(str) != "uniform")]
    for _, r in rules.iterrows():
        if "ratio_to_uniform" not in r or math.isnan(float(pd.to_numeric(r["ratio_to_uniform"], errors="coerce"))):
            finding, basis = str(r.get("verdict") or r.get("status") or "no ratio"), UNDECIDED
        else:
            ratio = interval_text(r["ratio_to_uniform"], r.get("ratio_to_uniform_lo"), r.get("ratio_to_uniform_hi"))
            finding = f"{r['rule']} needs {ratio}× the rollouts of uniform: {r.get('verdict')}"
            basis = _ratio_basis(ratio, r.get("verdict"))
        where, at = f"{r['bucket']} / {r['rule']}", f"{r['fixed']}, R* = {fmt_value(r.get('target'))}"
        rows.append({"claim": "rule vs uniform (rollouts to target)", "where": where, "at": at, "finding": finding,
                     "basis": basis})
        # PODS-like rules train on fewer rollouts than they generate: their claim is about time, not rollouts
        time_ratio = float(pd.to_numeric(r.get("time_ratio_to_uniform"), errors="coerce"))
        if math.isfinite(time_ratio):
            ratio = interval_text(time_ratio, r.get("time_ratio_to_uniform_lo"), r.get("time_ratio_to_uniform_hi"))
            rows.append({"claim": "rule vs uniform (step seconds to target)", "where": where, "at": at,
                         "finding": f"{r['rule']} needs {ratio}× the step seconds of uniform: "
                                    f"{r.get('time_verdict')}", "basis": _ratio_basis(ratio, r.get("time_verdict"))})
    return rows


def _crs_claims(cp: pd.DataFrame) -> list[dict[str, str]]:
    rows = []
    for _, r in cp.iterrows():
        if pd.isna(r.get("observed_best_n")):
            continue
        share = float(pd.to_numeric(r.get("observed_best_share"), errors="coerce"))
        observed = f"observed best n = {fmt_value(r['observed_best_n'])}"
        observed += f" ({share:.0%} of seed resamples agree)" if not math.isnan(share) else f" ({ONE_SEED})"
        crs = float(pd.to_numeric(r.get("crs"), errors="coerce"))
        basis = (ONE_SEED if math.isnan(share) else NO_FINITE if not math.isfinite(crs) else DECIDED if share >= AGREE
                 else OVERLAP)
        predicted = "CRS not measured" if pd.isna(r.get("predicted_n")) else (
            # an infinite CRS is no measurement of a size (issue 32): the signal |G|^2 measured <= 0 (science §6.2)
            f"CRS ∞ (no finite estimate: the measured signal |G|² ≤ 0) points only to the grid's largest n = "
            f"{fmt_value(r['predicted_n'])}" if math.isinf(crs) else
            f"CRS {fmt_value(r['crs'])} predicts n = {fmt_value(r['predicted_n'])}")
        rows.append({"claim": "CRS predicted vs observed best n", "where": f"{r.get('bucket')} / {r.get('rule')}",
                     "at": str(r.get("basis")), "finding": f"{predicted}; {observed}", "basis": basis})
    return rows


def _unbent_curve_claims(fits: pd.DataFrame) -> list[dict[str, str]]:
    """A sigmoid whose fit left parameters at a bound: its A and C_mid are extrapolations."""
    if "at_bound" not in fits.columns:
        return []
    rows = []
    for _, r in fits[fits["kind"].astype(str).str.startswith("sigmoid")].iterrows():
        if not isinstance(r["at_bound"], str) or not r["at_bound"]:
            continue
        variable = str(r["kind"]).removeprefix("sigmoid_")
        rows.append({"claim": "curve not bent within the budget", "where": f"{r.get('bucket')} / {r.get('rule')}",
                     "at": f"{variable} = {r.get('key')}",
                     "finding": f"{r['at_bound']} at the edge of the fit's range: A ({fmt_value(r.get('a'))}) and C_mid "
                                f"are not identified; the curve is read only within its data", "basis": CAVEAT})
    return rows


def _a2_claims(fits: pd.DataFrame) -> list[dict[str, str]]:
    """Warning rows where the rollout axis's n* falls with budget (science §8, A2: the search assumes it does not)."""
    if "a2_holds" not in fits.columns:
        return []
    checks = fits[fits["kind"].astype(str) == "a2_check"]
    bad = checks[~checks["a2_holds"].astype("boolean").fillna(True)]
    return [{"claim": "warning: A2 (n* does not fall with budget)", "where": f"{r.get('bucket')} / {r.get('rule')}",
             "at": str(r.get("fixed")), "finding": str(r["status"]), "basis": WARNING} for _, r in bad.iterrows()]


def _ratio_basis(ratio_text: str, verdict: object) -> str:
    if ONE_SEED in ratio_text:
        return ONE_SEED
    return OVERLAP if "not distinguishable" in str(verdict) else DECIDED


def claim_rows(t: dict[str, pd.DataFrame | None]) -> pd.DataFrame:
    """Every headline row with its ``basis`` (decided, intervals overlap, undecided, caveat (an
    unbent curve), warning (A2), or one seed): best n per budget (with its ``best_n``, budget ``c`` and refit ``share``), rules
    against uniform, unbent curves, A2 warnings, the CRS check."""
    rows: list[dict[str, Any]] = []
    if t.get("frontier") is not None and {"best_key", "c"} <= set(t["frontier"].columns):
        best = _best_n_claims(t["frontier"][as_numeric(t["frontier"]["best_key"]).notna()])
        if t.get("decision") is not None and "c_star" in t["decision"].columns:
            # at C* the decision (science §9.4) answers, within its tolerance: no exact-argmax claim beside it
            c_star = float(as_numeric(t["decision"]["c_star"]).iloc[0])
            best = [r for r in best if abs(math.log2(r["c"] / c_star)) > NEAR_C_STAR]
        rows += best
    if t.get("fits") is not None and "kind" in t["fits"].columns:
        rows += _rule_claims(t["fits"]) + _unbent_curve_claims(t["fits"]) + _a2_claims(t["fits"])
    if t.get("crs_prediction") is not None and "observed_best_n" in t["crs_prediction"].columns:
        rows += _crs_claims(t["crs_prediction"])
    return pd.DataFrame(rows, columns=[*COLUMNS, "basis", "best_n", "c", "share"])


def headline_table(t: dict[str, pd.DataFrame | None]) -> TableSpec:
    """The claims: best n per budget with the share of refits that agree; rules against uniform;
    the CRS check; each with its interval. A single-seed row is never among them
    (:func:`observations_table`)."""
    name, title = "headline", "Claims the data supports"
    caption = ("Each claim with its 95 % bootstrap interval over seeds (science §7): a difference is claimed "
               "only where its interval excludes zero (a ratio's excludes 1); otherwise it says "
               "'not distinguishable'. Observations from one seed are not claims and are listed apart.")
    rows = claim_rows(t)
    rows = rows[~rows["basis"].isin(NOT_CLAIMS)]
    if rows.empty:
        why = absent(t, "fits", "the fitted claims") if t.get("fits") is None else (
            "No claim: the data cannot decide yet (the answer above says what to change).")
        return TableSpec(name, title, caption, missing=why)
    return TableSpec(name, title, caption, frame=rows[COLUMNS].reset_index(drop=True))


def observations_table(t: dict[str, pd.DataFrame | None]) -> TableSpec | None:
    """What one seed showed: listed, never claimed (no interval, so no claim); None if nothing."""
    rows = claim_rows(t)
    rows = rows[rows["basis"].isin(NOT_CLAIMS)]
    if rows.empty:
        return None
    return TableSpec("observations", "Single-seed observations (not claims)",
                     "One run per setting: no interval, so none of these is a claim; with more seeds "
                     "(sweep.seeds) they become claims or 'not distinguishable'. A row resting on an estimate that "
                     "is not finite (an infinite CRS) is listed here too: it is no claim.",
                     frame=rows[COLUMNS].reset_index(drop=True))
