"""The decision at C* (science §9) on part of a grid's runs against the grid's own: the replays' comparison.

One replay cuts every run of a stored grid at a smaller budget
(:func:`truncated`) and decides at C* from what is left; the other
decides from what a search replayed on the grid would have kept
(:attr:`rollscale.core.search.replay.ReplayResult.evals`). Both are read by
:func:`decision_agreement` with the fit stage's own
:func:`rollscale.core.fit.decision_table.decision_table`, beside its decision on
every run of the grid. Pure, no files (benchmarks/replay_decision.py reads a
study and prints the tables). Not imported by the sweep stage.
"""

from __future__ import annotations

import math

import pandas as pd

from rollscale.core.fit.decision_table import decision_table
from rollscale.core.search.state import truncate

__all__ = ["AGREEMENT_COLUMNS", "decision_agreement", "truncated"]


def truncated(evals: pd.DataFrame, budget: float) -> pd.DataFrame:
    """A :func:`rollscale.core.fit.analysis.run_evals` table as if every run had been trained to ``budget``
    rollouts: its evaluations up to ``budget`` and the one that crosses it within one step (the run stops at the
    first step with C >= ``budget`` and evaluates there), by the search's own
    :func:`rollscale.core.search.state.truncate`."""
    if not (math.isfinite(budget) and budget > 0):
        raise ValueError(f"budget: expected a positive number of rollouts, got {budget!r}")
    runs = evals[["run_id", "seed"]].drop_duplicates("run_id")
    cut = pd.DataFrame({"group": "", "key": runs["run_id"].to_numpy(), "seed": runs["seed"].to_numpy(),
                        "c": float(budget)})
    kept = truncate(evals.assign(group="", key=evals["run_id"]), cut)
    return kept.drop(columns=["group", "key"])[list(evals.columns)]


# one row per design group of the decision table: the decision at C* on some runs beside the grid's on all of them
AGREEMENT_COLUMNS = ["design", "bucket", "rule", "fixed", "c_star", "c_seen", "leader", "decided", "within", "settled",
                     "open", "unknown", "reward", "reward_lo", "reward_hi", "extrapolated", "rewards", "grid_leader",
                     "grid_decided", "grid_within", "grid_reward", "same_leader", "within_grid", "grid_gap",
                     "gap_within", "covers_grid"]


def decision_agreement(grid: pd.DataFrame, evals: pd.DataFrame, c_star: float, tolerance: float, eta: float,
                       resamples: int = 200, seed: int = 0, search: pd.DataFrame | None = None) -> pd.DataFrame:
    """The decision at ``c_star`` on ``evals`` (a search's kept runs, or the grid :func:`truncated`) against the
    grid's on all its runs (``grid``), both by the fit stage's
    :func:`rollscale.core.fit.decision_table.decision_table` (science §9.3-9.4), one row per design group.

    ``within`` / ``settled`` / ``open`` / ``unknown``: the other keys by status (a settled key also within
    epsilon is listed as within); ``reward`` with its interval and ``extrapolated``: the leader's at C*;
    ``rewards``: every key's; ``same_leader``: the grid's leader; ``within_grid``: the leader is the grid's or
    within epsilon of it by the grid's decision (the lower bound of the grid's D_k >= -epsilon); ``grid_gap``: the
    grid's estimate of the leader's D_k (its reward at C* less the grid leader's); ``gap_within``: that gap is
    >= -epsilon (science §9.4's criterion, "a true reward within epsilon of the true best", with the grid's
    estimates standing for the truth); ``covers_grid``: the leader's interval holds the grid's estimate
    of that key's reward at C*. ``search``: the replayed search's decisions (its ``search`` table), passed on to
    the decision on ``evals`` as the fit stage passes the sweep's (only when given: a decision table that reads
    the search's verdicts takes it).
    """
    ids = ["design", "bucket", "rule", "fixed"]
    full = decision_table(grid, c_star, tolerance, eta, resamples, seed)
    given = {"search": search} if search is not None else {}
    part = decision_table(evals, c_star, tolerance, eta, resamples, seed, **given)
    rows = []
    for group, t in part.groupby(ids, sort=True, dropna=False):
        g = full.merge(pd.DataFrame([group], columns=ids), on=ids)
        lead, g_lead = _first(t["leader"]), _first(g["leader"])
        lead_row = t[t["key"] == lead].iloc[0] if lead is not None else None
        g_row = g.set_index("key").loc[lead] if lead is not None and lead in set(g["key"]) else None
        others = t[t["key"] != lead]
        rows.append({
            **dict(zip(ids, group, strict=True)), "c_star": float(c_star), "c_seen": float(t["c_seen"].max()),
            "leader": lead, "decided": bool(t["decided"].all()),
            "within": _keys(others[others["within_tolerance"]]),
            "settled": _keys(others[others["settled"] & ~others["within_tolerance"]]),
            "open": _keys(others[(others["status"] == "open")]), "unknown": _keys(others[others["unknown"]]),
            **{c: float(lead_row[c]) if lead_row is not None else math.nan for c in ("reward", "reward_lo", "reward_hi")},
            "extrapolated": bool(lead_row["extrapolated"]) if lead_row is not None else None,
            "rewards": "; ".join(f"{k}: " + ("unknown" if u else f"{r:.3f} [{lo:.3f}, {hi:.3f}]")
                                 for k, r, lo, hi, u in zip(t["key"], t["reward"], t["reward_lo"], t["reward_hi"],
                                                            t["unknown"], strict=True)),
            "grid_leader": g_lead, "grid_decided": bool(g["decided"].all()) if len(g) else False,
            "grid_within": _keys(g[g["within_tolerance"] & (g["key"] != g_lead)]),
            "grid_reward": float(g.loc[g["key"] == g_lead, "reward"].iloc[0]) if g_lead is not None else math.nan,
            "same_leader": lead is not None and lead == g_lead,
            "within_grid": lead is not None and (lead == g_lead or bool(g_row is not None and g_row["within_tolerance"])),
            "grid_gap": float(g_row["d"]) if g_row is not None else math.nan,
            "gap_within": bool(g_row is not None and g_row["d"] >= -tolerance),
            "covers_grid": bool(lead_row is not None and g_row is not None
                                and lead_row["reward_lo"] <= g_row["reward"] <= lead_row["reward_hi"]),
        })
    return pd.DataFrame(rows, columns=AGREEMENT_COLUMNS)


def _first(values: pd.Series) -> int | None:
    v = values.dropna()
    return int(v.iloc[0]) if len(v) else None


def _keys(rows: pd.DataFrame) -> str:
    return ", ".join(str(int(k)) for k in rows["key"])
