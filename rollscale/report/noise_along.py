"""The noise along training in the report (science §6.4): each key's rows of the ``noise_along`` table, and the
claims it supports: the CRS along training against the decision's n at C*, and where the signal is not resolved.

A key's rows are its seeds pooled (``run_id`` empty), or its one run's. The CRS compared with the decision is the
leader key's, in its last compute window (the most training behind it): a claim only where its 95 % interval
excludes the decision's n; a window whose |G|^2 interval reaches 0 says "signal not resolved" with the steps that
would resolve it, and an infinite K_crit names §6.3's reading.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from rollscale.core.noise.along import MIN_STEPS
from rollscale.core.noise.pooled import RHO_S, UNRESOLVED
from rollscale.report.base import as_numeric, fmt_interval, fmt_value
from rollscale.report.decision_text import fmt_budget

PAST = 5000  # windows past this many rollouts: the curves have left the base reward (science §6.4)


def key_rows(noise_along: pd.DataFrame) -> pd.DataFrame:
    """Per config (bucket, rule, n, B_problem) and window: the seeds pooled, or the config's one run."""
    pooled = noise_along["run_id"].isna() | (noise_along["run_id"].astype(str) == "")
    configs = ["bucket", "rule", "n", "b_problem"]
    have = noise_along[pooled].set_index(configs).index.unique()
    single = noise_along[~pooled & ~noise_along.set_index(configs).index.isin(have)]
    out = pd.concat([noise_along[pooled], single], ignore_index=True)
    for c in ("n", "b_problem", "c_lo", "c_hi", "steps", *[c for c in out.columns if c.startswith(("g2", "b_simple",
                                                                                                    "k_crit", "crs"))]):
        out[c] = as_numeric(out[c])
    return out.sort_values([*configs, "c_lo"]).reset_index(drop=True)


def resolved_share(rows: pd.DataFrame, past: float = PAST) -> tuple[int, int]:
    """Windows past ``past`` rollouts with an interval, and those whose |G|^2 lower bound is above 0."""
    w = rows[(rows["c_lo"] >= past) & (rows["steps"] >= MIN_STEPS)]
    return int((as_numeric(w["g2_lo"]) > 0).sum()), len(w)


def _window(r: pd.Series) -> str:
    return f"C {fmt_budget(r['c_lo'])}-{fmt_budget(r['c_hi'])}"


def _crs_text(r: pd.Series) -> str:
    if r["reading"] == UNRESOLVED:
        return (f"signal not resolved (|G|² = {fmt_interval(r['g2'], r['g2_lo'], r['g2_hi'])}; about "
                f"{fmt_value(r['steps_to_resolve'])} steps would resolve it, {int(r['steps'])} here)")
    if not math.isfinite(float(r["crs"])):
        if r["reading"] == RHO_S:
            return "CRS ∞: rho s > |G|² (rollouts of a prompt share more noise than the signal: add prompts, not rollouts)"
        return "no CRS (no rho_icc measured)"
    return f"CRS {fmt_interval(r['crs'], r['crs_lo'], r['crs_hi'])}"


def along_claims(noise_along: pd.DataFrame | None, decision: pd.DataFrame | None, decided: str, overlap: str,
                 undecided: str, no_finite: str) -> list[dict[str, Any]]:
    """Headline rows (``basis`` one of the given claim kinds): per group of the rollout axis, the leader's CRS along
    training in its last window against the decision's n at C*; per key, its last window where the signal is not
    resolved there. Nothing without the table."""
    if noise_along is None or noise_along.empty:
        return []
    keys = key_rows(noise_along)
    rows: list[dict[str, Any]] = []
    for (bucket, rule, b_problem), g in keys.groupby(["bucket", "rule", "b_problem"], sort=True):
        where = f"{bucket} / {rule}"
        last = g[g["steps"] >= MIN_STEPS].sort_values("c_lo").groupby("n").tail(1)
        for _, r in last[last["reading"] == UNRESOLVED].iterrows():
            rows.append({"claim": "noise along training", "where": where, "at": f"n = {int(r['n'])}, {_window(r)}",
                         "finding": _crs_text(r), "basis": undecided})
        lead = _leader(decision, bucket, rule)
        if lead is None:
            continue
        n_star, c_star = lead
        mine = last[last["n"] == n_star]
        if mine.empty:
            continue
        r = mine.iloc[0]
        others = "; ".join(f"n = {int(o['n'])}: {fmt_value(o['crs'])}" for _, o in last.iterrows() if o["n"] != n_star)
        at = f"C* = {fmt_budget(c_star)}; CRS of n = {n_star}'s runs, {_window(r)}"
        crs, lo, hi = (float(r[c]) for c in ("crs", "crs_lo", "crs_hi"))
        if r["reading"] == UNRESOLVED or not math.isfinite(crs):
            rows.append({"claim": "CRS along training vs the decision's n", "where": where, "at": at,
                         "finding": f"{_crs_text(r)}; the decision's n = {n_star}", "basis":
                         undecided if r["reading"] == UNRESOLVED else no_finite})
            continue
        text = f"{_crs_text(r)} rollouts a prompt; the decision's n = {n_star}"
        if not (math.isfinite(lo) and math.isfinite(hi)):
            finding, basis = f"{text} (no interval)", undecided
        elif hi < n_star or lo > n_star:
            side = "below" if hi < n_star else "above"
            finding, basis = f"{text}: the CRS is {side} it, so it does not predict the best n here", decided
        else:
            finding, basis = f"{text}: within the CRS's interval (consistent, not a prediction tested apart)", overlap
        rows.append({"claim": "CRS along training vs the decision's n", "where": where, "at": at,
                     "finding": finding + (f" (other keys' CRS there: {others})" if others else ""), "basis": basis})
    return rows


def _leader(decision: pd.DataFrame | None, bucket: Any, rule: Any) -> tuple[int, float] | None:
    """The decision's leading n at C* on the rollout axis (design ``n``) of this bucket and rule."""
    if decision is None or not {"design", "status", "key", "c_star"} <= set(decision.columns):
        return None
    g = decision[(decision["design"] == "n") & (decision["bucket"].astype(str) == str(bucket))
                 & (decision["rule"].astype(str) == str(rule)) & (decision["status"] == "leader")]
    if g.empty:
        return None
    return int(g["key"].iloc[0]), float(g["c_star"].iloc[0])


def window_mid(rows: pd.DataFrame) -> np.ndarray:
    """Each window's geometric middle [rollouts], where the chart draws it."""
    return np.sqrt(rows["c_lo"].to_numpy(float) * rows["c_hi"].to_numpy(float))
