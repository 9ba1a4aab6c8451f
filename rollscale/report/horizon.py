"""The forecast past the data in the report (science §10): the backtest beside the answer, and the table
"with 2x, 4x, 8x more compute" (n*(C) and the frontier's reward with their intervals; the chart of it is
:mod:`rollscale.report.charts.horizon`)."""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from rollscale.report.base import TableSpec, absent, as_numeric, fmt_interval
from rollscale.report.decision_text import first_design, fmt_budget, key_label

__all__ = ["backtest_failed", "backtest_sentence", "table_more_compute", "untrained_above"]

UNTRUSTED = "not to be trusted past the data"  # science §10.3's words for a failed backtest


def _first_groups(bt: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """The backtest's groups of its first design (the first line's), each with its "bucket / rule" name."""
    groups = list(first_design(bt).groupby(["bucket", "rule", "fixed"], sort=True))
    return [(f"{b} / {r}" + ("" if str(f) == "all" else f" / {f}"), g) for (b, r, f), g in groups]


def backtest_failed(t: Mapping[str, pd.DataFrame | None]) -> bool:
    """Whether the backtest of a group of the first line's design failed (science §10.3)."""
    bt = t.get("backtest")
    if bt is None or bt.empty or "failed" not in bt.columns:
        return False
    return any(bool(g["failed"].astype(bool).any()) for _, g in _first_groups(bt))


def backtest_sentence(t: Mapping[str, pd.DataFrame | None]) -> str | None:
    """"Forecast past the data (science §10): <the backtest's note>" for each group of the first design (prefixed
    with its bucket / rule when there are several), or None without a backtest. A failed backtest's sentence says
    the forecast is not to be trusted past the data, and why (its note)."""
    bt = t.get("backtest")
    if bt is None or bt.empty or "note" not in bt.columns:
        return None
    groups, notes = _first_groups(bt), []
    for where, g in groups:
        note = str(g["note"].iloc[0])
        if bool(g["failed"].astype(bool).any()) and UNTRUSTED not in note:
            note += f"; {UNTRUSTED}"
        notes.append(note if len(groups) == 1 else f"{where}: {note}")
    return f"Forecast past the data (science §10): {'; '.join(notes)}."


def untrained_above(t: Mapping[str, pd.DataFrame | None]) -> list[str]:
    """What to add where the forecast puts a key no run trained above the leader at C* (its D's lower bound above 0,
    science §10.2): the bracket of science §9.4, one line a key, naming the params key that adds it."""
    fc = t.get("forecast")
    if fc is None or fc.empty or not {"target", "trained", "d_lo"} <= set(fc.columns):
        return []
    at = first_design(fc)
    above = at[at["target"].astype(bool) & ~at["trained"].astype(bool) & (as_numeric(at["d_lo"]) > 0)]
    out = []
    for _, r in above.sort_values(["bucket", "rule", "fixed", "key"]).iterrows():
        design = str(r["design"])
        out.append(f"{key_label(design, [int(r['key'])])}, not trained, is forecast above the leader "
                   f"({key_label(design, [int(r['leader'])])}) at C* = {fmt_budget(r['c_star'])}: D = "
                   f"{fmt_interval(r['d'], r['d_lo'], r['d_hi'], decimals=2)} (science §10.2); add it to "
                   f"sweep.{'b_problem' if design == 'b_problem' else 'n'} so that runs decide")
    return out


def table_more_compute(t: Mapping[str, pd.DataFrame | None]) -> TableSpec:
    name, title = "more_compute", "With 2x, 4x, 8x more compute: the forecast past the data"
    caption = ("Per design group and budget C (the target C*, and 2, 4 and 8 times the runs' budget sweep.c_max): "
               "the key the forecast's surface puts first (n*(C): the trained key with the largest median over the "
               "bootstrap refits) and its reward with the 95 % interval; every key is in the `forecast` table. "
               "'unknown' where the interval is wider than the forecast's widest answer (science §10.2); the "
               "backtest beside the answer says whether to trust it past the data.")
    fc = t.get("forecast")
    if fc is None:
        return TableSpec(name, title, caption, missing=absent(t, "forecast", "forecast past the data"))
    if fc.empty:
        return TableSpec(name, title, caption, missing="no design group with two ordered keys to forecast over "
                         "(the backtest table says why)")
    lead = fc[as_numeric(fc["d"]).eq(0) & fc["trained"].astype(bool)]
    rows = []
    for _, r in lead.sort_values(["design", "bucket", "rule", "fixed", "c_star"]).iterrows():
        rows.append({
            "design": r["design"], "group": " / ".join(str(r[c]) for c in ("bucket", "rule", "fixed")),
            "C": fmt_budget(float(r["c_star"])) + (" (C*)" if bool(r["target"]) else ""),
            "best": key_label(str(r["design"]), [int(r["key"])]),
            "reward": ("unknown, " if bool(r["unknown"]) else "") + fmt_interval(r["reward"], r["reward_lo"],
                                                                                 r["reward_hi"], decimals=2),
            "trained to": fmt_budget(float(r["c_seen"])),
        })
    return TableSpec(name, title, caption, frame=pd.DataFrame(rows))
