"""The verdict at C* (science §11.5): one group's standing, computed in one place and read by the search, the fit
stage, the report, ``export`` and ``track``.

A group's keys at C*, each with its reward and interval and ``D_k = R_k(C*) - R_L(C*)`` to the leader L with its
bounds, give one :class:`Verdict`:

* **answered** ("use n = X") when every key but the leader is settled: it cannot beat the leader by more than
  epsilon (the upper bound of its D <= epsilon, or a settling rule of the search checked against this leader). The
  reward at C* and its interval are what the practitioner expects; the answer is marked **uncertain** where that
  interval is wider than :data:`ANSWER_WIDTH` (or has no finite ends), never withheld for it;
* **not decided** only while some key is **open** (it could still beat the leader by more than epsilon): the open
  key with the largest upper bound of D is named as the rival, with what would decide it.

Settling is read against this leader only, never transitively (§11.3). Where the sweep's search chose the group's
key, its verdict is the group's (:func:`search_verdict`): the search's leader, the keys it settled, and nothing
settled that it left open, so the report's first line and the search never disagree.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from rollscale.core.fit.forecast import ForecastSettings

__all__ = ["ANSWER_WIDTH", "DEGENERATE_WIDTH", "INTERVAL_NOTE", "SETTLING_RULES", "Verdict", "forecast_settings",
           "group_verdict", "honest_intervals", "interval_faults", "interval_triples", "search_verdict",
           "table_verdict", "trainable"]

# the widest 95 % interval of the reward at C* that is an answer without "uncertain" (science §11.5)
ANSWER_WIDTH = ForecastSettings().max_width
# the search's rules whose stop settles a key (science §9.4, §10.5, §11.3): the rest end a key for other reasons
SETTLING_RULES = ("epsilon", "a2", "forecast", "cap")


def forecast_settings(resamples: int, seed: int, eval_draws: int | None, level: float = 0.95,
                      a_max: float | None = 1.0, *, form: str) -> ForecastSettings:
    """The forecast's settings as the study's config gives them (``*.bootstrap_resamples``, ``*.bootstrap_seed``,
    validation problems x ``sweep.eval_k``, ``form`` its ``study.forecast_form``): the one place the search, the
    fit stage and track build them, each from the study's params."""
    return ForecastSettings(resamples=max(int(resamples), 2), eval_draws=eval_draws, level=level, seed=int(seed),
                            a_max=a_max, form=form)


@dataclass(frozen=True)
class Verdict:
    """One group's standing at C*: the leader, its reward with interval, and each other key settled or open."""

    c_star: float
    tolerance: float
    leader: Any | None
    reward: float = math.nan
    reward_lo: float = math.nan
    reward_hi: float = math.nan
    settled: Mapping[Any, str] = field(default_factory=dict)  # key -> what settled it
    open: tuple = ()  # keys that could still beat the leader by more than epsilon, the rival first
    rival_d: tuple[float, float, float] = (math.nan, math.nan, math.nan)  # the rival's D, its bounds
    max_width: float = ANSWER_WIDTH

    @property
    def answered(self) -> bool:
        """"Use the leader": every other key settled against it."""
        return self.leader is not None and not self.open

    @property
    def width(self) -> float:
        return float(self.reward_hi - self.reward_lo)

    @property
    def uncertain(self) -> bool:
        """The answer's reward interval is wider than :data:`ANSWER_WIDTH` or has no finite ends."""
        return not (math.isfinite(self.width) and self.width <= self.max_width + 1e-12)

    @property
    def rival(self) -> Any | None:
        return self.open[0] if self.open else None

    def status(self, key: Any) -> str:
        """``leader``, ``settled`` or ``open``."""
        if self.leader is not None and key == self.leader:
            return "leader"
        return "settled" if key in self.settled else "open"


def _settles(d_hi: float, tolerance: float) -> bool:
    return math.isfinite(d_hi) and d_hi <= tolerance + 1e-12


def group_verdict(rows: pd.DataFrame, tolerance: float, c_star: float, leader: Any | None = None,
                  settled: Mapping[Any, str] | None = None, only: bool = False,
                  max_width: float = ANSWER_WIDTH, settles_as: str = "tolerance") -> Verdict:
    """The verdict of one group from its keys at C* (``rows``: ``key``, ``reward``, ``reward_lo``, ``reward_hi``,
    ``d``, ``d_lo``, ``d_hi`` of D to ``leader``; ``leader`` None: the rows' ``leader`` column).

    ``settled``: keys settled by a rule of the search, checked against this leader (key -> rule); with ``only`` they
    are the only settled keys (the search's verdict: what it left open stays open), else a key is also settled where
    its D's upper bound is <= ``tolerance`` (recorded as ``settles_as``)."""
    keys = list(rows["key"])
    if leader is None and "leader" in rows.columns:
        named = rows["leader"].dropna()
        leader = named.iloc[0] if len(named) else None
    if leader is not None and leader not in keys:
        leader = None
    if leader is None:
        return Verdict(float(c_star), float(tolerance), None, open=tuple(keys), max_width=max_width)
    by_key = rows.set_index("key", drop=False)
    lead = by_key.loc[leader]
    out: dict[Any, str] = {}
    opened = []
    for key in keys:
        if key == leader:
            continue
        row = by_key.loc[key]
        if settled is not None and key in settled:
            out[key] = str(settled[key])
        elif not only and _settles(float(row.get("d_hi", math.nan)), tolerance):
            out[key] = settles_as
        else:
            opened.append(key)
    d_hi = {k: float(by_key.loc[k].get("d_hi", math.nan)) for k in opened}
    opened.sort(key=lambda k: -d_hi[k] if math.isfinite(d_hi[k]) else -math.inf)
    rival = by_key.loc[opened[0]] if opened else None
    def num(row: pd.Series | None, col: str) -> float:
        return float(row.get(col, math.nan)) if row is not None else math.nan

    return Verdict(float(c_star), float(tolerance), leader, num(lead, "reward"), num(lead, "reward_lo"),
                   num(lead, "reward_hi"), out, tuple(opened),
                   (num(rival, "d"), num(rival, "d_lo"), num(rival, "d_hi")), max_width)


def table_verdict(rows: pd.DataFrame, max_width: float = ANSWER_WIDTH) -> Verdict:
    """The verdict one group's rows of the fit stage's ``decision`` table hold (its ``status``, ``settled``,
    ``decided`` columns, written from :func:`group_verdict`): what the report, ``export`` and ``track`` read."""
    lead = rows.loc[rows["status"].astype(str) == "leader", "key"]
    settled = {k: str(b) for k, b, s in zip(rows["key"], rows["settled_by"], rows["settled"], strict=True)
               if bool(s)}
    c_star = float(rows["c_star"].iloc[0]) if len(rows) else math.nan
    tol = float(rows["tolerance"].iloc[0]) if len(rows) else math.nan
    return group_verdict(rows, tol, c_star, lead.iloc[0] if len(lead) else None, settled, only=True,
                         max_width=max_width)


def search_verdict(search: pd.DataFrame) -> tuple[Any | None, dict[Any, str], bool]:
    """The verdict one group's ``search`` rows (one C*) came to: (the key it named: the key it decided on, else
    the leader of its last decision; key -> the settling rule of every other key it settled and did not train
    again; whether it decided). Keys as the table holds them (text)."""
    last = search[search["decision"] == search["decision"].max()]
    decided = last.loc[(last["action"] == "stop") & (last["rule"] == "decided"), "key"]
    lead = decided.iloc[0] if len(decided) else (last["leader"].dropna().iloc[0] if last["leader"].notna().any()
                                                 else None)
    final = search.drop_duplicates("key", keep="last")
    settled = {k: str(r) for k, a, r in zip(final["key"], final["action"], final["rule"], strict=True)
               if a == "stop" and r in SETTLING_RULES and k != lead}
    return lead, settled, bool(len(decided))


# the design a fit-stage group has -> the search axis whose bracket bounds its keys, and what that axis holds fixed
_AXIS = {"n": ("rollout", "b_problem"), "b_problem": ("prompt", "n"), "iso_batch": ("iso_batch", None)}


def trainable(rows: pd.DataFrame, b_max: int, b_problems: list[int], ns: list[int], key_min: int | None = None,
              key_max: int | None = None) -> pd.Series:
    """Whether each row's key (``design``, ``key``, ``fixed``) is one the recipe can train (science §11.6): within the
    grid's bracket (:func:`rollscale.core.fit.bracket.bracket_limits`: n >= 2 where a group baseline gives a
    one-rollout group no advantage, up to ``b_max`` over what the design holds fixed; ``sweep.search.key_min`` /
    ``key_max`` where set). ``b_problems`` / ``ns``: the sweep's, the most permissive fixed value taken."""
    from rollscale.core.fit.bracket import bracket_limits

    out = []
    for design, key, fixed in zip(rows["design"].astype(str), rows["key"], rows["fixed"].astype(str), strict=True):
        axis, held = _AXIS.get(design, (None, None))
        if axis is None:
            out.append(True)
            continue
        if axis == "iso_batch":
            value = int(fixed.removeprefix("B=")) if fixed.startswith("B=") else b_max
        else:
            value = min(b_problems) if held == "b_problem" else min(ns)
        lo, hi = bracket_limits(axis, max(int(value), 1), b_max, key_min, key_max)
        out.append((lo is None or int(key) >= lo) and (hi is None or int(key) <= hi))
    return pd.Series(out, index=rows.index, dtype=bool)


def interval_triples(table: pd.DataFrame) -> list[tuple[str, str, str]]:
    """Every (estimate, low, high) column triple of a table: ``X`` with ``X_lo`` and ``X_hi``."""
    cols = set(table.columns)
    return [(c, f"{c}_lo", f"{c}_hi") for c in table.columns if f"{c}_lo" in cols and f"{c}_hi" in cols]


# an interval narrower than this share of its estimate's scale (at least 1) is degenerate: refits that collapsed to
# one value (two seeds give three distinct resamples), shown as n = 16's A "0.477 [0.476998, 0.476998]"
DEGENERATE_WIDTH = 1e-6
INTERVAL_NOTE = "interval"  # the column that says why a row's interval is not the refits' (the fits table's own)


def _faults(table: pd.DataFrame, est: str, lo: str, hi: str) -> tuple[pd.Series, pd.Series]:
    """(outside, degenerate) per row: the estimate outside its interval; both ends finite and (within
    :data:`DEGENERATE_WIDTH` of the estimate's scale) equal (a leader's D = 0 [0, 0] and a reward clipped at 0 or 1
    are exact, not degenerate)."""
    v, a, b = (pd.to_numeric(table[c], errors="coerce").astype(float) for c in (est, lo, hi))
    ends = a.notna() & b.notna()
    outside = ends & v.notna() & ((v < a - 1e-9) | (v > b + 1e-9))
    scale = v.abs().where(v.notna(), pd.concat([a.abs(), b.abs()], axis=1).max(axis=1)).clip(lower=1.0)
    flat = ends & (b - a).abs().le(DEGENERATE_WIDTH * scale) & ~(v.notna() & (v - a).abs().le(1e-12)
                                                                   & v.isin([0.0, 1.0]))
    return outside, flat


def interval_faults(table: pd.DataFrame, where: str, triples: list[tuple[str, str, str]] | None = None) -> list[str]:
    """Every row of ``table`` whose estimate lies outside its interval, or whose interval is degenerate, for each
    (estimate, low, high) column triple (default: :func:`interval_triples`): one line each (empty: none)."""
    out = []
    for est, lo, hi in triples if triples is not None else interval_triples(table):
        outside, flat = _faults(table, est, lo, hi)
        for pos in table.index[outside | flat]:
            out.append(f"{where} row {pos}: {est} {table.at[pos, est]} [{table.at[pos, lo]}, {table.at[pos, hi]}]"
                       + (" outside its interval" if outside[pos] else " on a degenerate interval"))
    return out


def honest_intervals(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` with no estimate outside its interval and no degenerate interval, each change said in its
    :data:`INTERVAL_NOTE` column (added, empty, where the table has none): a degenerate interval (the refits
    collapsed to one value: no spread to bound) is no interval (NaN ends); an estimate outside its percentile
    interval (a skewed bootstrap) widens it to hold the estimate."""
    out = table.copy()
    notes = (out[INTERVAL_NOTE].astype(object).where(out[INTERVAL_NOTE].notna(), "").astype(str)
             if INTERVAL_NOTE in out.columns else pd.Series("", index=out.index, dtype=object))
    for est, lo, hi in interval_triples(out):
        outside, flat = _faults(out, est, lo, hi)
        if not (outside.any() or flat.any()):
            continue
        v = pd.to_numeric(out[est], errors="coerce").astype(float)
        a, b = (pd.to_numeric(out[c], errors="coerce").astype(float) for c in (lo, hi))
        out[lo] = a.where(~outside, pd.concat([a, v], axis=1).min(axis=1)).where(~flat)
        out[hi] = b.where(~outside, pd.concat([b, v], axis=1).max(axis=1)).where(~flat)
        said = pd.Series("", index=out.index, dtype=object)
        said[flat] = f"{est}: its refits agree to one value, no spread to bound: no interval"
        said[outside & ~flat] = f"{est}: the interval widened to hold the estimate (a skewed bootstrap)"
        changed = flat | outside
        notes[changed] = [f"{n}; {s}" if n else s for n, s in zip(notes[changed], said[changed], strict=True)]
    out[INTERVAL_NOTE] = notes
    return out
