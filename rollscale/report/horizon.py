"""The forecast past the data in the report (science §10): the backtest beside the answer, and the table
"with 2x, 4x, 8x more compute" (n*(C) and the frontier's reward with their intervals)."""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from rollscale.report.base import TableSpec, absent, as_numeric, fmt_interval
from rollscale.report.decision_text import fmt_budget, key_label

__all__ = ["backtest_sentence", "table_more_compute"]


def _first_group(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows of the report's first design group (the n design first, as the first line)."""
    order = {"n": 0, "b_problem": 1}
    key = frame[["design", "bucket", "rule", "fixed"]].astype(str).agg("|".join, axis=1)
    first = min(key.unique(), key=lambda k: (order.get(k.split("|")[0], 9), k))
    return frame[key == first]


def backtest_sentence(t: Mapping[str, pd.DataFrame | None]) -> str | None:
    """"Forecast past the data: <the backtest's note>" for the first design group, or None without a backtest."""
    bt = t.get("backtest")
    if bt is None or bt.empty or "note" not in bt.columns:
        return None
    note = str(_first_group(bt)["note"].iloc[0])
    return f"Forecast past the data (science §10): {note}."


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
