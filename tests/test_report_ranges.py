"""Every number the report shows is possible: no interval outside its quantity's range (rewards in [0, 1], budgets
> 0), no estimate on the edge of its interval, no number in scientific notation (issue 41).

Scans every table of the report (the decision, the claims, the observations and every summary table) as the page
prints it, and the Vega-Lite data inside every chart spec, of the small studies of tests/test_report.py.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator

import pandas as pd
import pytest

from rollscale.report import build_charts, study_answer, summary_tables
from rollscale.report.base import TableSpec
from tests.test_report import _decision, _study_tables, decided

PARAMS = {"bucket": {"easy": [0.3, 0.6], "hard": [0.0, 0.0625]}}
_SUP = str.maketrans("⁻⁰¹²³⁴⁵⁶⁷⁸⁹", "-0123456789")
NUMBER = r"[−-]?\d[\d,]*(?:\.\d+)?(?:×10[⁻⁰¹²³⁴⁵⁶⁷⁸⁹]+)?"
INTERVAL = re.compile(rf"(?<![\w.])({NUMBER}) \[({NUMBER}), ({NUMBER})\]")
SCIENTIFIC = re.compile(r"\d(?:\.\d+)?e[+-]?\d+", re.IGNORECASE)
# table columns (as the page heads them) and chart fields by the quantity they hold
REWARD_COLUMN = re.compile(r"reward|avg@k|avg_at_k|best_at_k|worst_at_k|^r0$|^a$|frontier_reward", re.IGNORECASE)
BUDGET_COLUMN = re.compile(r"^c$|^c_max$|^c_mid$|^seen to$|^C at peak|^c_seen$|^c_star$|^e$", re.IGNORECASE)


def number(text: str) -> float:
    text = text.replace(",", "").replace("−", "-")
    if "×10" in text:
        mantissa, exponent = text.split("×10")
        return float(mantissa) * 10 ** int(exponent.translate(_SUP))
    return float(text)


def _studies() -> dict[str, dict[str, pd.DataFrame]]:
    study = _study_tables()
    two = decided(study)
    return {"one seed": study, "three seeds": two,
            "decision": {**two, "evals": two["evals"].assign(k=4), "decision": _decision(True)},
            "not decided": {**two, "decision": _decision(False)}}


def _past_the_data() -> dict[str, pd.DataFrame]:
    """A study answered at 4 x its runs' budget by the forecast (science §10.2), with its 2x, 4x, 8x chart."""
    from tests.test_forecast_answer import C_MAX, _fit, _study, _tables

    return _tables(_fit(*_study(), 4 * C_MAX))


def _tables(tables: dict[str, pd.DataFrame]) -> Iterator[TableSpec]:
    answer = study_answer(tables, PARAMS)
    yield from (s for s in (answer.decision, answer.claims, answer.observations) if s is not None)
    yield from summary_tables(tables)


def _chart_records(spec: dict) -> Iterator[dict]:
    for rows in spec.get("datasets", {}).values():
        yield from rows
    stack = [spec]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            values = node.get("data", {}).get("values") if isinstance(node.get("data"), dict) else None
            yield from values or []
            stack += [v for k, v in node.items() if k not in ("datasets", "data")]
        elif isinstance(node, list):
            stack += node


def table_problems(spec: TableSpec) -> list[str]:
    """Impossible or edge-of-interval values in one table, as the page prints it."""
    if spec.frame is None:
        return []
    out = []
    for col in spec.frame.columns:
        for cell in spec.frame[col].astype(str):
            where = f"{spec.name}[{col}] {cell!r}"
            if SCIENTIFIC.search(cell) and not re.search(r"[a-z_]e\d", cell):
                out.append(f"{where}: scientific notation")
            for v, lo, hi in ((number(a), number(b), number(c)) for a, b, c in INTERVAL.findall(cell)):
                if not lo <= hi:
                    out.append(f"{where}: interval upside down")
                elif lo < hi and not lo < v < hi:
                    out.append(f"{where}: estimate on or outside the edge of its interval")
                if REWARD_COLUMN.search(str(col)) and not 0 <= lo <= hi <= 1:
                    out.append(f"{where}: a reward's interval outside [0, 1]")
            plain = [number(x) for x in re.findall(rf"(?<![\w.\[])({NUMBER})(?![\w\]])", cell)]
            if REWARD_COLUMN.search(str(col)) and "=" not in str(col) and any(not 0 <= x <= 1 for x in plain):
                out.append(f"{where}: a reward outside [0, 1]")
            if BUDGET_COLUMN.search(str(col)) and any(x <= 0 for x in plain):
                out.append(f"{where}: a budget <= 0")
    return out


# fields whose name does not say their quantity: the chart's (estimate, lo, hi) of a reward
CHART_BANDS = {"reward_vs_compute": ("avg_at_k", "lo", "hi"), "answer": ("reward", "lo", "hi"),
               "more_compute": ("reward", "lo", "hi")}
CHART_REWARDS = {"reward_vs_compute": ("lo", "hi"), "best_worst_at_k": ("value",), "answer": ("lo", "hi"),
                 "more_compute": ("lo", "hi")}


def chart_problems(name: str, spec: dict) -> list[str]:
    """Impossible values and edge-of-interval estimates in one chart's Vega-Lite data."""
    out = []
    for rec in _chart_records(spec):
        if name in CHART_BANDS and all(isinstance(rec.get(f), (int, float)) for f in CHART_BANDS[name]):
            v, lo, hi = (rec[f] for f in CHART_BANDS[name])
            if lo < hi and not lo < v < hi:
                out.append(f"{name}: {v} [{lo}, {hi}]: estimate on or outside the edge of its interval")
        for field, value in rec.items():
            if field in CHART_REWARDS.get(name, ()) and isinstance(value, (int, float)) and not 0 <= value <= 1:
                out.append(f"{name}.{field} = {value}: a reward outside [0, 1]")
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value is None:
                continue
            if not math.isfinite(value):
                out.append(f"{name}.{field} = {value}: not finite in the data")
            elif REWARD_COLUMN.search(field) and not 0 <= value <= 1:
                out.append(f"{name}.{field} = {value}: a reward outside [0, 1]")
            elif BUDGET_COLUMN.search(field) and value <= 0:
                out.append(f"{name}.{field} = {value}: a budget <= 0")
        for base in {f.removesuffix("_lo") for f in rec if f.endswith("_lo")}:
            v, lo, hi = rec.get(base), rec.get(f"{base}_lo"), rec.get(f"{base}_hi")
            if all(isinstance(x, (int, float)) for x in (v, lo, hi)) and lo < hi and not lo < v < hi:
                out.append(f"{name}.{base} = {v} [{lo}, {hi}]: estimate on or outside the edge of its interval")
    return out


@pytest.mark.parametrize("kind", ["one seed", "three seeds", "decision", "not decided", "past the data"])
def test_no_table_or_chart_of_the_report_shows_an_impossible_value(kind):
    tables = _past_the_data() if kind == "past the data" else _studies()[kind]
    problems = [p for spec in _tables(tables) for p in table_problems(spec)]
    problems += [p for c in build_charts(tables, PARAMS) if c.chart is not None
                 for p in chart_problems(c.name, c.chart.to_dict())]
    assert problems == []


def test_the_scan_finds_what_issue_41_saw():
    """The fits table of a fresh clone's default study before issue 41: each of these is caught."""
    bad = TableSpec("fits_sigmoid_n", "Fit: sigmoid_n", "", frame=pd.DataFrame({
        "key": ["4", "2"], "r0": ["0.3756 [-1.919, 0.3756]", "0.386 [0.3675, 0.386]"],
        "c_mid": ["1.241e+04 [0.64, 9.802e+04]", "1,586 [0.64, 3,000]"]}))
    found = table_problems(bad)
    assert any("outside [0, 1]" in p and "-1.919" in p for p in found)
    assert sum("edge of its interval" in p for p in found) == 2
    assert any("scientific notation" in p for p in found)
    chart = {"datasets": {"d": [{"reward": 0.5, "reward_lo": 0.5, "reward_hi": 0.6, "c": 0.0}]}}
    assert len(chart_problems("answer", chart)) == 2
