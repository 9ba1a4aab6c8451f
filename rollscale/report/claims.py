"""The report's headline: the claims the data supports, each with its interval (science §7, §9.3).

One source of uncertainty: every claim about keys (each key against the leader at C*, the best n at other
budgets, the CRS's predicted n against the observed one) is read from the decision's intervals (the seed spread
pooled across keys, science §9.3): at C* the fit stage's ``decision`` table, at other budgets the same decision
made from the evaluations (:func:`rollscale.core.fit.decision_table.decisions_at`). A key is claimed better or
worse only where the interval of its difference D to the leader excludes zero, so the claims and the first line
agree by construction; elsewhere the claim says "not distinguishable", and a study with one seed a key (no pooled
spread) gives observations, never claims. Rules against uniform keep their ratio's bootstrap interval.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from rollscale.config import DecisionParams, SearchParams
from rollscale.core.fit.analysis import run_evals
from rollscale.core.fit.bootstrap import ONE_SEED
from rollscale.core.fit.decision_table import decisions_at
from rollscale.core.noise.pooled import PIECES, RHO_S, UNRESOLVED, pooled_noise
from rollscale.report.base import TableSpec, absent, as_numeric, fmt_interval, fmt_value
from rollscale.report.decision_text import fmt_budget, key_label
from rollscale.report.noise_along import along_claims

BUDGETS_SHOWN = 4  # budgets per frontier, spread over its grid in log C
NEAR_C_STAR = 0.25  # best-n claims within 2^0.25 of C* are left to the decision at C*
# what a headline row rests on: only DECIDED rows answer; ONE_SEED rows are observations, never claims
DECIDED, OVERLAP, UNDECIDED, CAVEAT, WARNING = "decided", "intervals overlap", "undecided", "caveat", "warning"
COLUMNS = ["claim", "where", "at", "finding"]
# a row resting on an input with no finite estimate (an infinite CRS: the measured signal |G|^2 <= 0) is no claim,
# however many seed resamples agree on the rest; listed with the observations, as one seed's rows are
NO_FINITE = "no finite estimate"
NOT_CLAIMS = (ONE_SEED, NO_FINITE)


def _keys(design: str, keys: list[Any]) -> str:
    return key_label(design, [int(k) for k in keys])


def decision_claims(decision: pd.DataFrame, at_c_star: bool = True) -> list[dict[str, Any]]:
    """Claims read from decision rows (science §9.4), one group at a time: at C* each key against the leader (worse
    where D's interval is below 0, or beaten where both ran (A2); else not distinguishable); at another budget the
    best n (decided where every other known key's D is below 0)."""
    rows: list[dict[str, Any]] = []
    for (_, design, bucket, rule, fixed), g in decision.groupby(["c_star", "design", "bucket", "rule", "fixed"],
                                                              sort=True):
        where = f"{bucket} / {rule}" + ("" if str(fixed) == "all" else f" / {fixed}")
        c = float(g["c_star"].iloc[0])
        at = f"C* = {fmt_budget(c)}" if at_c_star else f"C = {fmt_budget(c)}"
        lead_rows = g[g["status"] == "leader"]
        if lead_rows.empty:
            continue
        lead = lead_rows.iloc[0]
        others = g[(g["status"] != "leader") & ~g["unknown"].astype(bool)]
        one_seed = int(g["df"].iloc[0]) == 0 or lead_rows["reward_lo"].isna().all()
        if at_c_star:
            for _, r in others.iterrows():
                d = fmt_interval(r["d"], r["d_lo"], r["d_hi"], decimals=2)
                if one_seed:
                    finding, basis = f"{_keys(design, [r['key']])} against {_keys(design, [lead['key']])}: D = {d}", \
                        ONE_SEED
                elif float(r["d_hi"]) < 0 or str(r["settled_by"]).endswith("a2"):
                    how = f"D = {d}" if float(r["d_hi"]) < 0 else "beaten where both ran (A2)"
                    finding, basis = f"{_keys(design, [r['key']])} is below {_keys(design, [lead['key']])}: {how}", \
                        DECIDED
                else:
                    finding, basis = (f"{_keys(design, [r['key']])} is not distinguishable from "
                                      f"{_keys(design, [lead['key']])}: D = {d}"), OVERLAP
                rows.append({"claim": "key against the leader", "where": where, "at": at, "finding": finding,
                             "basis": basis, "best_n": int(lead["key"]), "c": c, "share": math.nan})
            continue
        if design != "n":
            continue
        best = _keys(design, [lead["key"]]).replace("n = ", "n* = ")
        close = others[~(others["d_hi"].astype(float) < 0)]
        if one_seed:
            verdict, basis = f"{best} ({ONE_SEED})", ONE_SEED
        elif close.empty:
            verdict, basis = f"{best}: every other n is below it (D's interval below 0)", DECIDED
        else:
            verdict, basis = f"{best}; not distinguishable from {_keys(design, close['key'].tolist())}", OVERLAP
        unknown = g[g["unknown"].astype(bool)]
        if len(unknown):
            verdict += f"; {_keys(design, unknown['key'].tolist())} unknown here: its runs end before C / eta"
        rows.append({"claim": "best n at budget", "where": where, "at": at, "finding": verdict, "basis": basis,
                     "best_n": int(lead["key"]), "c": c, "share": float(lead["leader_share"])})
    return rows


def _claim_budgets(t: Mapping[str, pd.DataFrame | None], c_star: float | None) -> list[float]:
    """Budgets for best-n claims: spread over the frontier's grid (else over the evaluated C) in log C, away from
    C* (the decision there answers)."""
    fr, ev = t.get("frontier"), t.get("evals")
    if fr is not None and "c" in fr.columns and as_numeric(fr["c"]).gt(0).any():
        grid = np.sort(as_numeric(fr["c"])[as_numeric(fr["c"]) > 0].unique())
    elif ev is not None and "c" in ev.columns and as_numeric(ev["c"]).gt(0).any():
        c = as_numeric(ev["c"])[as_numeric(ev["c"]) > 0]
        grid = np.geomspace(c.min(), c.max(), 25)
    else:
        return []
    picked = grid[np.unique(np.linspace(0, len(grid) - 1, BUDGETS_SHOWN).round().astype(int))]
    return [float(c) for c in picked if c_star is None or abs(math.log2(c / c_star)) > NEAR_C_STAR]


def _budget_decisions(t: Mapping[str, pd.DataFrame | None], tolerance: float, eta: float) -> pd.DataFrame | None:
    """The decision at each claim budget, from the runs' evaluations (None without runs or evaluations)."""
    runs, ev = t.get("runs"), t.get("evals")
    if runs is None or ev is None or not {"run_id", "n", "b_problem"} <= set(runs.columns):
        return None
    dec = t.get("decision")
    c_star = float(as_numeric(dec["c_star"]).iloc[0]) if dec is not None and "c_star" in dec.columns else None
    budgets = _claim_budgets(t, c_star)
    evals = run_evals(runs, ev[[c for c in ("run_id", "step", "c", "avg_at_k", "epochs") if c in ev.columns]])
    return decisions_at(evals, budgets, tolerance, eta, designs=("n",)) if budgets and len(evals) else None


def _rule_claims(fits: pd.DataFrame) -> list[dict[str, str]]:
    rows = []
    if "rule" not in fits:
        return rows
    rules = fits[(fits["kind"].astype(str) == "rollouts_to_target") & (fits["rule"].astype(str) != "uniform")]
    for _, r in rules.iterrows():
        if "ratio_to_uniform" not in r or math.isnan(float(pd.to_numeric(r["ratio_to_uniform"], errors="coerce"))):
            finding, basis = str(r.get("verdict") or r.get("status") or "no ratio"), UNDECIDED
        else:
            ratio = fmt_interval(r["ratio_to_uniform"], r.get("ratio_to_uniform_lo"), r.get("ratio_to_uniform_hi"))
            finding = f"{r['rule']} needs {ratio}× the rollouts of uniform: {r.get('verdict')}"
            basis = _ratio_basis(ratio, r.get("verdict"))
        where, at = f"{r['bucket']} / {r['rule']}", f"{r['fixed']}, R* = {fmt_value(r.get('target'))}"
        rows.append({"claim": "rule vs uniform (rollouts to target)", "where": where, "at": at, "finding": finding,
                     "basis": basis})
        # PODS-like rules train on fewer rollouts than they generate: their claim is about time, not rollouts
        time_ratio = float(pd.to_numeric(r.get("time_ratio_to_uniform"), errors="coerce"))
        if math.isfinite(time_ratio):
            ratio = fmt_interval(time_ratio, r.get("time_ratio_to_uniform_lo"), r.get("time_ratio_to_uniform_hi"))
            rows.append({"claim": "rule vs uniform (step seconds to target)", "where": where, "at": at,
                         "finding": f"{r['rule']} needs {ratio}× the step seconds of uniform: "
                                    f"{r.get('time_verdict')}", "basis": _ratio_basis(ratio, r.get("time_verdict"))})
    return rows


def _crs_decision(r: pd.Series, decision: pd.DataFrame | None) -> pd.DataFrame | None:
    """The decision rows the CRS comparison is read from: the iso-batch group of its B, or the n design at C* where
    the comparison is at the runs' common C_max = C* (science §7 at one total batch, §9.4)."""
    if decision is None:
        return None
    same = decision[(decision["bucket"].astype(str) == str(r.get("bucket")))
                    & (decision["rule"].astype(str) == str(r.get("rule")))]
    b, c_max = float(pd.to_numeric(r.get("b"), errors="coerce")), float(pd.to_numeric(r.get("c_max"), errors="coerce"))
    if math.isfinite(b):
        g = same[(same["design"] == "iso_batch") & (same["fixed"].astype(str) == f"B={int(b)}")]
    elif math.isfinite(c_max) and len(same) and abs(float(same["c_star"].iloc[0]) - c_max) <= 1e-9 * c_max:
        g = same[(same["design"] == "n") & (same["fixed"].astype(str) == "all")]
    else:
        return None
    return g if len(g) and (g["status"] == "leader").any() else None


def infinite_k_crit(noise_prompts: pd.DataFrame | None) -> str:
    """Why the CRS is infinite, from the noise pooled over steps at the largest n (science §6.3): the signal not
    resolved, or rho s > |G|^2; without the pooled pieces, what one step's estimate says."""
    if noise_prompts is not None and set(PIECES) <= set(noise_prompts.columns) and "n" in noise_prompts.columns:
        n = int(as_numeric(noise_prompts["n"]).max())
        try:
            reading = pooled_noise(noise_prompts[as_numeric(noise_prompts["n"]) == n], n).reading
        except ValueError:
            reading = None
        if reading == RHO_S:
            return "K_crit infinite because rho s > |G|² pooled over steps: add prompts, not rollouts"
        if reading == UNRESOLVED:
            return "the signal |G|² pooled over steps is not resolved: measure more prompts"
    return "no finite estimate: the measured signal |G|² ≤ 0"


def _crs_claims(cp: pd.DataFrame, decision: pd.DataFrame | None, why_infinite: str) -> list[dict[str, Any]]:
    rows = []
    for _, r in cp.iterrows():
        if pd.isna(r.get("predicted_n")):
            continue
        crs = float(pd.to_numeric(r.get("crs"), errors="coerce"))
        pred = int(r["predicted_n"])
        predicted = (f"CRS ∞ ({why_infinite}) points only to the grid's largest n = {pred}" if math.isinf(crs)
                     else f"CRS {fmt_value(crs)} predicts n = {pred}")
        g = _crs_decision(r, decision)
        where = f"{r.get('bucket')} / {r.get('rule')}"
        if g is None:
            rows.append({"claim": "CRS predicted vs observed best n", "where": where, "at": str(r.get("basis")),
                         "finding": f"{predicted}; no decision with intervals at this comparison",
                         "basis": NO_FINITE if not math.isfinite(crs) else UNDECIDED})
            continue
        lead = g[g["status"] == "leader"].iloc[0]
        at = f"{r.get('basis')}, C = {fmt_budget(lead['c_star'])}"
        observed = f"the decision's best n = {int(lead['key'])}"
        mine = g[g["key"] == pred]
        if not math.isfinite(crs):  # no claim rests on an estimate that is not finite
            finding, basis = f"{predicted}; {observed}", NO_FINITE
        elif int(g["df"].iloc[0]) == 0:
            finding, basis = f"{predicted}; {observed} ({ONE_SEED})", ONE_SEED
        elif pred == int(lead["key"]):
            finding, basis = f"{predicted}; {observed}: they agree", DECIDED
        elif mine.empty or bool(mine["unknown"].iloc[0]):
            finding, basis = f"{predicted}; {observed}; n = {pred} not trained to this budget", UNDECIDED
        else:
            d = fmt_interval(mine["d"].iloc[0], mine["d_lo"].iloc[0], mine["d_hi"].iloc[0], decimals=2)
            below = float(mine["d_hi"].iloc[0]) < 0
            how = "below it" if below else "not distinguishable"
            finding = f"{predicted}; {observed}, n = {pred} is {how}: D = {d}"
            basis = DECIDED if below else OVERLAP
        rows.append({"claim": "CRS predicted vs observed best n", "where": where, "at": at, "finding": finding,
                     "basis": basis})
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


def claim_rows(t: Mapping[str, pd.DataFrame | None], tolerance: float | None = None,
               eta: float | None = None) -> pd.DataFrame:
    """Every headline row with its ``basis`` (decided, intervals overlap, undecided, caveat (an unbent curve),
    warning (A2), or one seed): each key against the leader at C* (the ``decision`` table), the best n at other
    budgets (decisions there, with ``best_n``, budget ``c`` and the leader's refit ``share``), rules against
    uniform, unbent curves, A2 warnings, the CRS check. ``tolerance`` / ``eta``: the study's (the decision table's
    tolerance when it has one; else params' defaults)."""
    rows: list[dict[str, Any]] = []
    decision = t.get("decision")
    decision = decision if decision is not None and "c_star" in decision.columns else None
    if decision is not None:
        rows += decision_claims(decision[decision["design"] == decision["design"].iloc[0]])
    if tolerance is None:
        tolerance = float(decision["tolerance"].iloc[0]) if decision is not None else DecisionParams().tolerance
    budget = _budget_decisions(t, tolerance, eta if eta is not None else SearchParams().eta)
    if budget is not None and len(budget):
        rows += decision_claims(budget, at_c_star=False)
    if t.get("fits") is not None and "kind" in t["fits"].columns:
        rows += _rule_claims(t["fits"]) + _unbent_curve_claims(t["fits"]) + _a2_claims(t["fits"])
    if t.get("crs_prediction") is not None and "predicted_n" in t["crs_prediction"].columns:
        rows += _crs_claims(t["crs_prediction"], decision, infinite_k_crit(t.get("noise_prompts")))
    # the CRS along training (science §6.4) against the decision's n, and windows whose signal is not resolved
    rows += along_claims(t.get("noise_along"), decision, DECIDED, OVERLAP, UNDECIDED, NO_FINITE)
    return pd.DataFrame(rows, columns=[*COLUMNS, "basis", "best_n", "c", "share"])


def headline_table(t: Mapping[str, pd.DataFrame | None], rows: pd.DataFrame | None = None) -> TableSpec:
    """The claims: best n per budget with the share of refits that agree; rules against uniform;
    the CRS check; each with its interval. A single-seed row is never among them
    (:func:`observations_table`)."""
    name, title = "headline", "Claims the data supports"
    caption = ("Each claim with its 95 % interval: keys against each other from the decision's intervals (the seed "
               "spread pooled across keys, science §9.3; the first line's), rules against uniform from their "
               "bootstrap over seeds (science §7). A difference is claimed only where its interval excludes zero (a "
               "ratio's excludes 1); otherwise it says 'not distinguishable'. Observations from one seed a key, or on an "
               "estimate that is not finite, are not claims and are listed apart.")
    rows = claim_rows(t) if rows is None else rows
    rows = rows[~rows["basis"].isin(NOT_CLAIMS)]
    if rows.empty:
        why = absent(t, "fits", "the fitted claims") if t.get("fits") is None else (
            "No claim: the data cannot decide yet (the answer above says what to change).")
        return TableSpec(name, title, caption, missing=why)
    return TableSpec(name, title, caption, frame=rows[COLUMNS].reset_index(drop=True))


def observations_table(t: Mapping[str, pd.DataFrame | None], rows: pd.DataFrame | None = None) -> TableSpec | None:
    """What one seed showed: listed, never claimed (no interval, so no claim); None if nothing."""
    rows = claim_rows(t) if rows is None else rows
    rows = rows[rows["basis"].isin(NOT_CLAIMS)]
    if rows.empty:
        return None
    return TableSpec("observations", "Single-seed observations (not claims)",
                     "One run per setting: no interval, so none of these is a claim; with more seeds "
                     "(sweep.seeds) they become claims or 'not distinguishable'. A row resting on an estimate that "
                     "is not finite (an infinite CRS) is listed here too: it is no claim.",
                     frame=rows[COLUMNS].reset_index(drop=True))
