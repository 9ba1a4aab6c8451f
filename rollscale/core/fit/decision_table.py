"""The ``decision`` table (science §9): one row per design group and key at the target budget C*.

Groups are the frontier's (:func:`rollscale.core.fit.tables.design_groups`: per bucket and rule, the n
design, B_problem at each fixed n, n at each fixed total batch B); every group is decided at C* in rollouts
by :func:`rollscale.core.fit.decision.decide`, all runs fitted in one batch. Rows carry what the headline
needs: the key's B_problem and n, its steps M = C* / B, and for a group not decided, what would decide it.
A group whose C* lies past what its runs' own fits read (science §9.3: beyond eta x its data) takes its rows from
the forecast over the keys instead (science §10.2, :func:`with_forecast`; ``source`` says which).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from rollscale.core.fit.columns import EVAL_COLUMNS, require
from rollscale.core.fit.decision import decide, fit_groups
from rollscale.core.fit.tables import DESIGNS, REWARD_MAX, design_groups

__all__ = ["DECISION_COLUMNS", "SOURCES", "SearchVerdict", "decision_table", "decisions_at", "past_the_data",
           "search_verdicts", "to_decide", "with_forecast", "with_search"]

DECISION_COLUMNS = [
    "design", "bucket", "rule", "fixed", "key", "c_star", "tolerance", "status", "leader", "decided",
    "reward", "reward_lo", "reward_hi", "d", "d_lo", "d_hi", "settled", "settled_by", "within_tolerance",
    "extrapolated", "unknown", "seeds", "c_seen", "n", "b_problem", "steps", "leader_share", "r0", "df",
    "to_decide", "settled_at", "source",
]
SOURCES = ("per-run", "forecast")  # where a group's rows come from: §9's per-run fits, or §10.2's surface
# the fit's design -> what the sweep's search group holds fixed beside bucket and rule (its group names,
# rollscale.core.search.replay.DESIGNS: "n:bucket=.../rule=.../b_problem=16")
_SEARCH_HELD = {"n": "b_problem", "b_problem": "n", "iso_batch": "b"}
_SETTLING = ("epsilon", "a2", "forecast", "cap")  # the search's rules that settle a key (science §9.4, §10.5)
_GROUP = ["design", "bucket", "rule", "fixed"]


@dataclass(frozen=True)
class SearchVerdict:
    """What the sweep's search (``sweep.search.method: decision``) concluded for one group: the key it named
    (the one it decided on, else the leader of its last decision) and, per key it settled, the budget and the
    bounds it was settled at."""

    leader: int | None
    settled: dict  # key -> (rule, C of the rung, d_lo, d_hi)


def search_verdicts(search: pd.DataFrame | None, c_star: float | None = None) -> dict[str, SearchVerdict]:
    """The search table's verdicts by group (science §9.4); none for a table without C* (the retired search of §8), nor for
    one made at another C* than ``c_star`` (the target changed after the sweep: its verdicts do not apply)."""
    if search is None or search.empty or "c_star" not in search.columns:
        return {}
    at = pd.to_numeric(search["c_star"], errors="coerce")
    keep = at.notna() if c_star is None else (at - c_star).abs() <= 1e-9 * c_star
    out = {}
    for name, rows in search[keep].groupby("group", sort=False):
        stops = rows[rows["action"] == "stop"].drop_duplicates("key", keep="last")
        last = rows[rows["decision"] == rows["decision"].max()]
        # the search's answer: the key it decided on, else the leader of its last decision (not decided)
        lead = last.loc[(last["action"] == "stop") & (last["rule"] == "decided"), "key"]
        lead = lead if len(lead) else last["leader"].dropna()
        # a key seeded or trained on after its stop (the undecided rule) is no longer settled by that stop
        later = rows.drop_duplicates("key", keep="last").set_index("key")["decision"]
        settled = {_as_key(k): (r, float(c), float(lo), float(hi))
                   for k, r, c, lo, hi, d in zip(stops["key"], stops["rule"], stops["c"], stops["d_lo"], stops["d_hi"],
                                                stops["decision"], strict=True) if r in _SETTLING and later[k] == d}
        out[str(name)] = SearchVerdict(_as_key(lead.iloc[0]) if len(lead) else None, settled)
    return out


def _as_key(key: object) -> object:
    return int(key) if str(key).lstrip("-").isdigit() else key


def _search_group(design: str, g: object) -> str:
    """The name the sweep's search gives ``g``'s runs ("" when they hold more than one value fixed)."""
    held = _SEARCH_HELD[design]
    rows = g.rows  # type: ignore[attr-defined]
    if held not in rows.columns or rows[held].nunique() != 1:
        return ""
    return f"{design}:bucket={g.bucket}/rule={g.rule}/{held}={int(rows[held].iloc[0])}"  # type: ignore[attr-defined]


def with_search(rows: pd.DataFrame, verdict: SearchVerdict | None, tolerance: float) -> pd.DataFrame:
    """``decide``'s rows with the search's verdicts: a key it settled at a rung is settled here too, with the
    budget (``settled_at``) and the bounds of D it was settled on, although its runs stop short of C* / eta;
    ``decided`` and the statuses follow."""
    rows = rows.assign(settled_at=math.nan)
    if verdict is None:
        return rows
    if verdict.leader is not None and verdict.leader in set(rows["key"]):
        # the key the search named, also where C* lies beyond eta x its data (decided on A2 at a rung): its reward
        # there is bounds only, the answer is still the search's
        rows["leader"] = verdict.leader
        mine = rows["key"] == verdict.leader
        rows.loc[mine, ["d", "d_lo", "d_hi", "settled", "settled_by"]] = 0.0, 0.0, 0.0, False, ""
    lead = rows["leader"].iloc[0]
    for pos in rows.index:
        k = int(rows.at[pos, "key"])
        if k not in verdict.settled or k == lead:
            continue
        rule, c, lo, hi = verdict.settled[k]
        rows.loc[pos, ["settled", "settled_by", "settled_at"]] = True, f"search: {rule}", c
        d = float(rows.at[pos, "d"])
        # the search's bounds stand beside this table's D only where they hold it: from another estimator (the
        # forecast at a rung) they can exclude it (D = 0.27 shown as [0.00, 0.00]); then this table's
        # own bounds are shown, and the search's verdict stays in settled_by
        if math.isfinite(hi) and (not math.isfinite(d) or lo - 1e-9 <= d <= hi + 1e-9):
            rows.loc[pos, ["d_lo", "d_hi"]] = lo, hi
            rows.at[pos, "within_tolerance"] = bool(lo >= -tolerance)
    others = (rows["key"] != lead).to_numpy()
    rows["decided"] = bool(lead is not None and lead == lead and rows.loc[others, "settled"].all())
    rows["status"] = np.select([~others, rows["within_tolerance"] & ~rows["unknown"], rows["settled"], rows["unknown"]],
                               ["leader", "within tolerance", "settled", "unknown"], "open")
    return rows


def to_decide(rows: pd.DataFrame, c_star: float, eta: float) -> str:
    """What would settle an undecided group (science §9.4): budget for unknown keys, else seeds.

    Seeds: the key still open with the largest upper bound of D needs its interval's half-width to fall to
    ``tolerance - d`` (half-widths fall as 1 / sqrt(seeds) for it and the leader alike); "" when decided.
    """
    if rows["decided"].all():
        return ""
    if rows["r0"].isna().all():
        return "no run has a step-0 evaluation, so the curves have no shared R0 (science §9.2): rerun the sweep"
    open_rows = rows[(rows["status"] != "leader") & ~rows["settled"]]
    if open_rows["unknown"].any():
        need = math.ceil(c_star / eta)
        unknown = open_rows[open_rows["unknown"]]
        if float(rows["c_seen"].max()) >= need * (1 - 1e-9):  # the budget reaches: those keys' runs stopped short
            short = ", ".join(f"{int(k)} (its runs reached C = {c:,.0f})"
                              for k, c in zip(unknown["key"], unknown["c_seen"], strict=True))
            return (f"train key {short} on to C >= {need:,} (C* / eta): a search stopped it before C* was within "
                    "reach (sweep.search.method: decision trains every key the decision at C* needs)")
        return f"sweep.c_max >= {need:,} (C* / eta) for every key, so that C* is within reach"
    if not open_rows["d_hi"].notna().any():
        return "no interval with one seed per key: at least 2 seeds for every key (sweep.seeds)"
    worst = open_rows.loc[open_rows["d_hi"].idxmax()]
    gap = float(worst["tolerance"] - worst["d"])
    half = float(worst["d_hi"] - worst["d"])
    if not (gap > 0 and half > 0):
        return f"key {int(worst['key'])} may be the better one: more seeds for it and the leader (sweep.seeds)"
    seeds = int(math.ceil(max(worst["seeds"], rows.loc[rows["status"] == "leader", "seeds"].max()) * (half / gap) ** 2))
    return (f"about {seeds} seeds each for the leader and key {int(worst['key'])} (sweep.seeds), or "
            f"study.tolerance {math.ceil(100 * float(worst['d_hi'])) / 100:.2f}")


def _fitted_groups(evals: pd.DataFrame, designs: tuple[str, ...]) -> tuple[list[tuple[str, str, object]], dict]:
    """Every design group of ``designs`` labelled, and its evaluations keyed for one batched fit."""
    frames, labelled = [], []
    for design in designs:
        for g in design_groups(evals, design)[0]:
            label = f"{design}|{g.bucket}|{g.rule}|{g.fixed}"
            labelled.append((label, design, g))
            frames.append(g.rows.assign(_group=label, _key=g.rows[g.key_col]))
    return labelled, frames


def _group_rows(rows: pd.DataFrame, design: str, g: object, c_star: float, tolerance: float, eta: float,
                r0: float) -> pd.DataFrame:
    """``decide``'s rows of one group with what the table adds: the key's n and B_problem, M, what would decide."""
    per_key = g.rows.groupby(g.key_col)  # type: ignore[attr-defined]
    for col in ("n", "b_problem"):
        rows[col] = rows["key"].map(per_key[col].agg(lambda v: int(v.iloc[0]) if v.nunique() == 1 else np.nan))
    rows["steps"] = [math.ceil(c_star / b) if np.isfinite(b) else np.nan
                     for b in rows["n"].astype(float) * rows["b_problem"].astype(float)]
    rows = rows.assign(design=design, bucket=g.bucket, rule=g.rule, fixed=g.fixed,  # type: ignore[attr-defined]
                       c_star=float(c_star), tolerance=float(tolerance), r0=r0, source=SOURCES[0])
    rows["to_decide"] = to_decide(rows, c_star, eta)
    return rows[DECISION_COLUMNS]


def _typed(table: pd.DataFrame) -> pd.DataFrame:
    for col in ("leader", "n", "b_problem", "steps"):
        table[col] = pd.array([None if pd.isna(v) else int(v) for v in table[col]], dtype="Int64")
    return table


def decision_table(evals: pd.DataFrame, c_star: float, tolerance: float, eta: float,
                   resamples: int = 200, seed: int = 0, reward_max: float | None = REWARD_MAX,
                   search: pd.DataFrame | None = None) -> pd.DataFrame:
    """Every design group decided at ``c_star`` (``evals``: :func:`rollscale.core.fit.analysis.run_evals`'s table),
    with the verdicts of the sweep's search (``search``, its table; :func:`with_search`) where it made them."""
    require(evals, "evals", EVAL_COLUMNS)
    if not (math.isfinite(c_star) and c_star > 0):
        raise ValueError(f"c_star: expected a positive number of rollouts, got {c_star!r}")
    labelled, frames = _fitted_groups(evals, DESIGNS)
    if not frames:
        return pd.DataFrame(columns=DECISION_COLUMNS)
    curves = fit_groups(pd.concat(frames, ignore_index=True), "_key", "_group", reward_max)
    out, verdicts = [], search_verdicts(search, c_star)
    for label, design, g in labelled:
        verdict = verdicts.get(_search_group(design, g))
        rows = decide(curves[label], c_star, tolerance, eta, rollout_axis=g.key_col == "n" and design != "iso_batch",
                      reward_max=reward_max, resamples=resamples, seed=seed,
                      leader=verdict.leader if verdict is not None else None)
        rows = with_search(rows, verdict, tolerance)
        out.append(_group_rows(rows, design, g, c_star, tolerance, eta, curves[label].r0))
    return _typed(pd.concat(out, ignore_index=True))


def decisions_at(evals: pd.DataFrame, budgets: list[float], tolerance: float, eta: float, resamples: int = 200,
                 seed: int = 0, reward_max: float | None = REWARD_MAX, designs: tuple[str, ...] = DESIGNS
                 ) -> pd.DataFrame:
    """The decision of science §9.3-9.4 at each of ``budgets`` (rows of :data:`DECISION_COLUMNS`, ``c_star`` the
    budget): every run fitted once, each budget read with the same pooled seed spread, so the report's claims at
    other budgets than C* rest on the intervals its first line rests on (no search verdicts: they are at C*)."""
    require(evals, "evals", EVAL_COLUMNS)
    labelled, frames = _fitted_groups(evals, designs)
    budgets = [float(c) for c in budgets if math.isfinite(float(c)) and float(c) > 0]
    if not frames or not budgets:
        return pd.DataFrame(columns=DECISION_COLUMNS)
    curves = fit_groups(pd.concat(frames, ignore_index=True), "_key", "_group", reward_max)
    out = []
    for c in budgets:
        for label, design, g in labelled:
            rows = decide(curves[label], c, tolerance, eta, rollout_axis=g.key_col == "n" and design != "iso_batch",
                          reward_max=reward_max, resamples=resamples, seed=seed).assign(settled_at=math.nan)
            out.append(_group_rows(rows, design, g, c, tolerance, eta, curves[label].r0))
    return _typed(pd.concat(out, ignore_index=True))


def past_the_data(rows: pd.DataFrame) -> bool:
    """Whether §9 cannot answer a group at C*: no key leads, or the leader is ``unknown`` (C* beyond eta x its
    data, science §9.3)."""
    lead = rows[rows["status"] == "leader"]
    return bool(lead.empty or lead["unknown"].astype(bool).any())


def with_forecast(decision: pd.DataFrame, forecast: pd.DataFrame | None, max_width: float) -> pd.DataFrame:
    """The ``decision`` table with every group §9 cannot answer at C* (:func:`past_the_data`) decided by the
    forecast instead (science §10.2; ``forecast``: the fit stage's ``forecast`` table, its rows at the target,
    ``max_width``: the widest interval that is still an answer). Such a group's trained keys take the surface's
    reward and D with their intervals; the leader is the forecast's (the trained key with the largest median over
    refits); a key is settled when D's upper bound is <= the tolerance, within tolerance when its lower bound is
    >= minus it and its reward is known; ``unknown`` is the forecast's (its interval wider than ``max_width``); the
    group is decided when every other key is settled and the leader is known. ``source`` says which rows are the
    forecast's. Groups within the data, and groups with no forecast (a rule, iso-batch, too few keys), keep §9's
    rows."""
    decision = decision.assign(source=decision["source"].fillna(SOURCES[0])) if "source" in decision.columns \
        else decision.assign(source=SOURCES[0])
    if decision.empty or forecast is None or forecast.empty:
        return decision
    ahead = forecast[forecast["target"].astype(bool) & forecast["trained"].astype(bool)]
    label = ahead[_GROUP].astype(str).agg("|".join, axis=1)
    out = []
    for _, rows in decision.groupby(decision[_GROUP].astype(str).agg("|".join, axis=1), sort=False):
        mine = ahead[label == "|".join(rows[_GROUP].astype(str).iloc[0])]
        answers = past_the_data(rows) and mine["leader"].notna().any()
        out.append(_forecast_rows(rows, mine, max_width) if answers else rows)
    return _typed(pd.concat(out, ignore_index=True)[DECISION_COLUMNS])


def _forecast_rows(rows: pd.DataFrame, ahead: pd.DataFrame, max_width: float) -> pd.DataFrame:
    """One group's rows from its forecast at C* (:func:`with_forecast`); keys the forecast lacks keep §9's row."""
    tol = float(rows["tolerance"].iloc[0])
    f = ahead.assign(key=ahead["key"].astype(int)).set_index("key")
    have = rows["key"].astype(int).isin(f.index).to_numpy()
    new = rows[have].copy()
    at = f.loc[new["key"].astype(int)]
    for col in ("reward", "reward_lo", "reward_hi", "d", "d_lo", "d_hi", "c_seen"):
        new[col] = at[col].astype(float).to_numpy()
    new["unknown"] = at["unknown"].astype(bool).to_numpy()
    new["extrapolated"] = at["extrapolated"].astype(bool).to_numpy()
    new["seeds"] = at["seeds"].astype(int).to_numpy()
    lead = int(f["leader"].dropna().iloc[0])
    is_lead = (new["key"].astype(int) == lead).to_numpy()
    # a key the sweep's search settled at a rung (with_search: "search: <rule>", its budget and bounds) stays settled
    # with them: the search stopped its runs on that verdict (science §9.4, §10.5), and the answer agrees with it
    searched = (rows.loc[have, "settled_by"].astype(str).str.startswith("search:").to_numpy()
                & ~is_lead if "settled_by" in rows.columns else np.zeros(len(new), bool))
    kept = rows[have].loc[searched, ["d_lo", "d_hi", "settled_by", "settled_at"]]
    new["leader"], new["leader_share"], new["settled_at"], new["source"] = lead, math.nan, math.nan, SOURCES[1]
    new["settled"] = ~is_lead & ((new["d_hi"] <= tol).to_numpy() | searched)
    new["settled_by"] = np.where(new["settled"], "forecast", "")
    new.loc[kept.index, ["d_lo", "d_hi", "settled_by", "settled_at"]] = kept
    new["within_tolerance"] = ~is_lead & ~new["unknown"].to_numpy() & (new["d_lo"] >= -tol).to_numpy()
    lead_known = not bool(new.loc[is_lead, "unknown"].any()) and bool(is_lead.any())
    out = pd.concat([new, rows[~have]], ignore_index=True).sort_values("key", ignore_index=True)
    others = (out["key"].astype(int) != lead).to_numpy()
    out["decided"] = bool(lead_known and out.loc[others, "settled"].astype(bool).all())
    within, settled, unknown = (out[c].astype(bool).to_numpy() for c in ("within_tolerance", "settled", "unknown"))
    out["status"] = np.select([~others, within & ~unknown, settled, unknown],
                              ["leader", "within tolerance", "settled", "unknown"], "open")
    out["to_decide"] = _forecast_to_decide(out, max_width)
    return out


def _forecast_to_decide(rows: pd.DataFrame, max_width: float) -> str:
    """What would decide a group the forecast answers (science §10.2): a leader whose interval is too wide, else the
    open key with the largest upper bound of D; "" when decided."""
    if rows["decided"].all():
        return ""
    lead = rows[rows["status"] == "leader"]
    closer = "or sweep.c_max closer to C* (the forecast's intervals widen with the distance past the data)"
    if lead.empty or lead["unknown"].astype(bool).any():
        width = float((lead["reward_hi"] - lead["reward_lo"]).max()) if len(lead) else math.nan
        return (f"the forecast's interval of the leader at C* is {width:.3f} wide, wider than its widest answer "
                f"{max_width:g} (science §10.2): more seeds (sweep.seeds), {closer}")
    open_rows = rows[(rows["status"] != "leader") & ~rows["settled"].astype(bool)]
    if open_rows.empty:
        return ""
    worst = open_rows.loc[open_rows["d_hi"].idxmax()] if open_rows["d_hi"].notna().any() else open_rows.iloc[0]
    return (f"key {int(worst['key'])} may still beat the leader by more than {float(worst['tolerance']):g} at C* "
            f"(the forecast's upper bound of D is {float(worst['d_hi']):.2f}): more seeds for it and the leader "
            f"(sweep.seeds), {closer}")
