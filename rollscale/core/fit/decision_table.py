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
from rollscale.core.fit.verdict import ANSWER_WIDTH, Verdict, group_verdict, search_verdict

__all__ = ["DECISION_COLUMNS", "SOURCES", "SearchVerdict", "apply_verdict", "decision_table", "decisions_at",
           "past_the_data", "search_verdicts", "to_decide", "with_forecast", "with_search"]

DECISION_COLUMNS = [
    "design", "bucket", "rule", "fixed", "key", "c_star", "tolerance", "status", "leader", "decided",
    "reward", "reward_lo", "reward_hi", "d", "d_lo", "d_hi", "settled", "settled_by", "within_tolerance",
    "extrapolated", "unknown", "seeds", "c_seen", "n", "b_problem", "steps", "leader_share", "r0", "df",
    "to_decide", "settled_at", "source", "by_search",
]
SOURCES = ("per-run", "forecast")  # where a group's rows come from: §9's per-run fits, or §10.2's surface
# the fit's design -> what the sweep's search group holds fixed beside bucket and rule (its group names,
# rollscale.core.search.replay.DESIGNS: "n:bucket=.../rule=.../b_problem=16")
_SEARCH_HELD = {"n": "b_problem", "b_problem": "n", "iso_batch": "b"}
_GROUP = ["design", "bucket", "rule", "fixed"]


@dataclass(frozen=True)
class SearchVerdict:
    """What the sweep's search concluded for one group (:func:`rollscale.core.fit.verdict.search_verdict`): the key
    it named (the one it decided on, else the leader of its last decision), per key it settled (against that
    leader, science §11.3) the rule, budget and bounds it was settled at, and whether it decided."""

    leader: int | None
    settled: dict  # key -> (rule, C of the rung, d_lo, d_hi)
    decided: bool = False


def search_verdicts(search: pd.DataFrame | None, c_star: float | None = None) -> dict[str, SearchVerdict]:
    """The search table's verdicts by group (science §9.4, §11.5); none for a table without C* (the retired search of
    §8), nor for one made at another C* than ``c_star`` (the target changed after the sweep: its verdicts do not
    apply)."""
    if search is None or search.empty or "c_star" not in search.columns:
        return {}
    at = pd.to_numeric(search["c_star"], errors="coerce")
    keep = at.notna() if c_star is None else (at - c_star).abs() <= 1e-9 * c_star
    out = {}
    for name, rows in search[keep].groupby("group", sort=False):
        lead, settled, decided = search_verdict(rows)
        stops = rows[rows["action"] == "stop"].drop_duplicates("key", keep="last").set_index("key")
        out[str(name)] = SearchVerdict(
            _as_key(lead) if lead is not None else None,
            {_as_key(k): (rule, float(stops.at[k, "c"]), float(stops.at[k, "d_lo"]), float(stops.at[k, "d_hi"]))
             for k, rule in settled.items()}, decided)
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


def with_search(rows: pd.DataFrame, verdict: SearchVerdict | None, tolerance: float,
                c_star: float = math.nan) -> pd.DataFrame:
    """``decide``'s rows with the search's verdict, the group's (science §11.5): the key it named leads; the keys it
    settled against that leader are settled here (with the budget, ``settled_at``, and, where they hold this table's
    D, the bounds it was settled on), although their runs stop short of C*; a key it left open stays open. Without a
    search verdict the rows' own settling stands. ``decided`` and the statuses are the verdict's."""
    rows = rows.assign(settled_at=math.nan, by_search=verdict is not None)
    if verdict is None:
        own = {k: b for k, b, s in zip(rows["key"], rows["settled_by"], rows["settled"], strict=True) if bool(s)}
        lead = rows["leader"].dropna()
        return apply_verdict(rows, group_verdict(rows, tolerance, c_star, lead.iloc[0] if len(lead) else None,
                                                 own, only=True))
    if verdict.leader is not None and verdict.leader in set(rows["key"]):
        # the key the search named, also where C* lies beyond eta x its data (decided on A2 at a rung): its reward
        # there is bounds only, the answer is still the search's
        rows["leader"] = verdict.leader
        mine = rows["key"] == verdict.leader
        rows.loc[mine, ["d", "d_lo", "d_hi"]] = 0.0, 0.0, 0.0
    lead = rows["leader"].iloc[0]
    for pos in rows.index:
        k = int(rows.at[pos, "key"])
        if k not in verdict.settled or k == lead:
            continue
        rule, c, lo, hi = verdict.settled[k]
        rows.loc[pos, ["settled_by", "settled_at"]] = f"search: {rule}", c
        d = float(rows.at[pos, "d"])
        # the search's bounds stand beside this table's D only where they hold it: from another estimator (the
        # forecast at a rung) they can exclude it (D = 0.27 shown as [0.00, 0.00]); then this table's own bounds
        # are shown, and the search's verdict stays in settled_by
        if math.isfinite(hi) and math.isfinite(lo) and hi > lo and math.isfinite(d) and lo - 1e-9 <= d <= hi + 1e-9:
            rows.loc[pos, ["d_lo", "d_hi"]] = lo, hi
            rows.at[pos, "within_tolerance"] = bool(lo >= -tolerance)
    settled = {k: str(rows.loc[rows["key"] == k, "settled_by"].iloc[0]) for k in verdict.settled if k != lead}
    return apply_verdict(rows, group_verdict(rows, tolerance, c_star, lead if lead == lead else None,
                                             settled, only=True))


def apply_verdict(rows: pd.DataFrame, verdict: Verdict) -> pd.DataFrame:
    """One group's rows with the verdict's standing: ``leader``, ``settled`` (with ``settled_by``, "" where not),
    ``decided`` (answered), ``status`` (leader, within tolerance, settled, unknown, open)."""
    keys = rows["key"].astype(object).to_numpy()
    lead = np.array([verdict.leader is not None and k == verdict.leader for k in keys], bool)
    settled = np.array([k in verdict.settled for k in keys], bool)
    rows = rows.assign(leader=verdict.leader, settled=settled, decided=verdict.answered)
    rows["settled_by"] = [str(verdict.settled[k]) if k in verdict.settled else "" for k in keys]
    rows.loc[lead, ["d", "d_lo", "d_hi"]] = 0.0, 0.0, 0.0
    within = rows["within_tolerance"].astype(bool).to_numpy() & ~lead
    unknown = rows["unknown"].astype(bool).to_numpy()
    rows["within_tolerance"] = within
    rows["status"] = np.select([lead, within & ~unknown, settled, unknown],
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
        rows = with_search(rows, verdict, tolerance, c_star)
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
                          reward_max=reward_max, resamples=resamples, seed=seed).assign(settled_at=math.nan,
                                                                                        by_search=False)
            out.append(_group_rows(rows, design, g, c, tolerance, eta, curves[label].r0))
    return _typed(pd.concat(out, ignore_index=True))


def past_the_data(rows: pd.DataFrame) -> bool:
    """Whether §9 cannot answer a group at C*: no key leads, or the leader is ``unknown`` (C* beyond eta x its
    data, science §9.3)."""
    lead = rows[rows["status"] == "leader"]
    return bool(lead.empty or lead["unknown"].astype(bool).any())


def with_forecast(decision: pd.DataFrame, forecast: pd.DataFrame | None, max_width: float = ANSWER_WIDTH
                  ) -> pd.DataFrame:
    """The ``decision`` table with every group §9 cannot answer at C* (:func:`past_the_data`) read from the forecast
    instead (science §10.2; ``forecast``: the fit stage's ``forecast`` table, its rows at the target;
    ``max_width``: the widest interval of an answer not marked uncertain). Such a group's trained keys take the
    surface's reward and D with their intervals; its verdict (science §11.5) is the sweep's search's where it chose
    the group's key (``by_search``, :func:`with_search`), else the forecast's: the leader is the trained key the surface puts
    first, a key is settled when D's upper bound is <= the tolerance. ``unknown`` is the forecast's (its interval
    wider than ``max_width``). ``source`` says which rows are the forecast's. Groups within the data, and groups
    with no forecast (a rule, iso-batch, too few keys), keep §9's rows."""
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
    tol, c_star = float(rows["tolerance"].iloc[0]), float(rows["c_star"].iloc[0])
    f = ahead.assign(key=ahead["key"].astype(int)).set_index("key")
    have = rows["key"].astype(int).isin(f.index).to_numpy()
    new = rows[have].copy()
    at = f.loc[new["key"].astype(int)]
    # a key the sweep's search settled (with_search: "search: <rule>") stays settled: the search checked it against
    # its final leader (science §11.3) and stopped its runs on it; its bounds are the forecast's own, so that D lies
    # in them (the search's were another estimator's, at another level)
    searched = {int(k): str(b) for k, b in zip(rows["key"], rows["settled_by"], strict=True)
                if str(b).startswith("search:")}
    search_lead = rows["leader"].dropna()
    by_search = bool(rows["by_search"].astype(bool).any()) if "by_search" in rows.columns else False
    for col in ("reward", "reward_lo", "reward_hi", "d", "d_lo", "d_hi", "c_seen"):
        new[col] = at[col].astype(float).to_numpy()
    new["unknown"] = at["unknown"].astype(bool).to_numpy()
    new["extrapolated"] = at["extrapolated"].astype(bool).to_numpy()
    new["seeds"] = at["seeds"].astype(int).to_numpy()
    lead = int(search_lead.iloc[0]) if by_search and len(search_lead) else int(f["leader"].dropna().iloc[0])
    if lead != int(f["leader"].dropna().iloc[0]) and lead in f.index:
        # the search's leader is not the forecast's: D is read against the search's leader, as the difference of
        # the two keys' D to the forecast's leader (its point; the bounds of a difference of bounds are not D's:
        # none shown)
        base = float(f.loc[lead, "d"])
        new["d"] = new["d"] - base
        new[["d_lo", "d_hi"]] = math.nan
    new["leader_share"], new["source"] = math.nan, SOURCES[1]
    new["within_tolerance"] = ~new["unknown"].to_numpy() & (new["d_lo"] >= -tol).to_numpy()
    out = pd.concat([new, rows[~have]], ignore_index=True).sort_values("key", ignore_index=True)
    out["key"] = out["key"].astype(int)
    verdict = group_verdict(out, tol, c_star, lead, searched if by_search else None, only=by_search,
                            max_width=max_width, settles_as="forecast")
    out = apply_verdict(out, verdict)
    # keys whose upper bound at C* is their own continuation past their data (science §11.3), not the refits'
    continued = set(at.index[(at["continued_hi"] >= at["reward_hi"] - 1e-9).to_numpy()].astype(int)) \
        if "continued_hi" in at.columns else set()
    out["to_decide"] = _forecast_to_decide(out, verdict, continued)
    return out


def _forecast_to_decide(rows: pd.DataFrame, verdict: Verdict, continued: set[int] = frozenset()) -> str:
    """What would decide a group the forecast answers (science §11.5): the open key with the largest upper bound of
    D; "" when answered. ``continued``: keys whose upper bound is their continuation past their data (a key still
    accelerating, or stopped below the group's steepest rise): training it further is what decides it."""
    if verdict.answered:
        return ""
    closer = "or sweep.c_max closer to C* (the forecast's intervals widen with the distance past the data)"
    if verdict.rival is None:
        return f"no key leads at C*: more seeds (sweep.search.seeds_max, within sweep.search.spend_max x C*), {closer}"
    worst = rows[rows["key"] == verdict.rival].iloc[0]
    hi = float(worst["d_hi"])
    bound = f"the forecast's upper bound of D is {hi:.2f}" if math.isfinite(hi) else "its D has no bound yet"
    open_key = f"key {int(worst['key'])} may still beat the leader by more than {float(worst['tolerance']):g} at C*"
    if int(worst["key"]) in continued:
        return (f"{open_key} ({bound}, its own rise continued past its data: where its data end its rise per doubling "
                "still grows, or is below the group's steepest): train it further, sweep.c_max closer to C* (more "
                "seeds narrow its noise, not its growth)")
    return (f"{open_key} ({bound}): more seeds for it and the leader (sweep.search.seeds_max, within "
            f"sweep.search.spend_max x C*), {closer}")
