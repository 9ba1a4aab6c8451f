"""The report's first line: the decision at the target budget C* (science §9.4), from the ``decision`` table.

Each group's verdict (science §11.5, :func:`rollscale.core.fit.verdict.table_verdict`): answered, "Use n = 4 (B_problem
16, M = 625 steps) at C* = 40,000 rollouts: validation avg@4 0.53 [0.51, 0.56]; n = 8 is within 0.02; n = 2 and 16
are worse", the reward marked "uncertain" where its interval is wider than 0.15; not decided only while a key is
open: "Not decided at C* = 40,000 rollouts: n = 8 could still beat n = 4 by more than 0.02 (D = 0.01 [-0.03,
0.05]); n = 4 leads with ...; to decide: ...". A group read from the forecast past the data (science §10.2,
``source`` "forecast") says so: "... at C* = 160,000 rollouts (4x the runs' budget, forecast past the data)".
Budgets print as whole rollouts with thousands separators.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from rollscale.core.fit.verdict import table_verdict
from rollscale.report.base import TableSpec, fmt_interval, fmt_value

__all__ = ["decision_headline", "decision_spec", "first_design", "fmt_budget", "from_forecast", "key_label"]

_DESIGN_ORDER = {"n": 0, "b_problem": 1, "iso_batch": 2}
_KEY_NAME = {"n": "n", "b_problem": "B_problem", "iso_batch": "n"}


def fmt_budget(c: Any) -> str:
    """Rollouts as ``40,000`` (never ``3.968e+04``); ``—`` when missing."""
    return fmt_value(float(pd.to_numeric(c, errors="coerce")), decimals=0)


def key_label(design: str, keys: list[int]) -> str:
    """``n = 4``, ``n = 2 and 16``, ``B_problem = 8, 16 and 32``."""
    ks = [str(int(k)) for k in sorted(keys)]
    listed = ks[0] if len(ks) == 1 else ", ".join(ks[:-1]) + " and " + ks[-1]
    return f"{_KEY_NAME.get(design, 'key')} = {listed}"


def first_design(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows of the first design a table has (n, then B_problem, then iso-batch): the groups the first line
    speaks of, and the answer chart and the forecast's sections with it."""
    if frame.empty or "design" not in frame.columns:
        return frame
    order = frame["design"].astype(str).map(_DESIGN_ORDER).fillna(len(_DESIGN_ORDER))
    return frame[order == order.min()]


def from_forecast(rows: pd.DataFrame) -> bool:
    """Whether decision rows come from the forecast past the data (science §10.2) rather than the per-run fits."""
    return "source" in rows.columns and bool((rows["source"].astype(str) == "forecast").any())


def _at_c_star(g: pd.DataFrame) -> str:
    """"C* = 40,000 rollouts", with "(4x the runs' budget, forecast past the data)" for the forecast's groups."""
    text = f"C* = {fmt_budget(g['c_star'].iloc[0])} rollouts"
    seen = float(pd.to_numeric(g["c_seen"], errors="coerce").max())
    if from_forecast(g) and seen > 0:
        text += f" ({float(g['c_star'].iloc[0]) / seen:.2g}x the runs' budget, forecast past the data)"
    return text


def _r(v: Any) -> str:
    return fmt_value(float(v), decimals=2)


def _interval(v: Any, lo: Any, hi: Any) -> str:
    return fmt_interval(v, lo, hi, decimals=2)


def _group_sentence(g: pd.DataFrame, metric: str) -> tuple[str, bool, str]:
    """(sentence, answered, to_decide) of one design group, from its verdict (science §11.5)."""
    design = str(g["design"].iloc[0])
    c_star, eps = fmt_budget(g["c_star"].iloc[0]), float(g["tolerance"].iloc[0])
    v = table_verdict(g)
    fix = str(g["to_decide"].iloc[0]) if "to_decide" in g.columns else ""
    if v.leader is None:
        seen = fmt_budget(g["c_seen"].max())
        return (f"Not decided at C* = {c_star}: no key was trained close enough to it (runs reach {seen} rollouts); "
                f"to decide: {fix}", False, fix)
    lead = g[g["key"] == v.leader].iloc[0]
    name = key_label(design, [lead["key"]])
    held = "n" if design == "b_problem" else "b_problem"
    detail = [f"{'n' if design == 'b_problem' else 'B_problem'} {int(lead[held])}" if not pd.isna(lead[held]) else "",
              f"M = {int(lead['steps']):,} steps" if not pd.isna(lead["steps"]) else ""]
    detail = [d for d in detail if d]
    who = name + (f" ({', '.join(detail)})" if detail else "")
    reward = _interval(v.reward, v.reward_lo, v.reward_hi) if pd.notna(v.reward) else \
        f"unknown, in [{_r(v.reward_lo)}, {_r(v.reward_hi)}]"  # bounds only (science §9.3)
    if v.uncertain:  # the n is the answer; what it reaches is known only roughly (science §11.5)
        width = f"{v.width:.2f} wide" if pd.notna(v.width) else "without finite ends"
        reward += f", uncertain (its 95 % interval is {width}, wider than {v.max_width:g})"
    elif bool(lead["extrapolated"]) and not from_forecast(g):
        reward += f", extrapolated from {fmt_budget(lead['c_seen'])}"
    if v.answered:
        parts = [f"Use {who} at {_at_c_star(g)}: validation {metric} {reward}"]
        within = g[g["status"] == "within tolerance"]["key"].tolist()
        settled = g[g["status"] == "settled"]
        # settled = cannot beat the leader by more than eps; "worse" only where D's upper bound is below 0 or the
        # key was settled on A2 (beaten at a rung, it will not overtake)
        behind = (settled["d_hi"] < 0) | settled["settled_by"].astype(str).str.endswith("a2")
        worse, no_better = settled[behind]["key"].tolist(), settled[~behind]["key"].tolist()
        if within:
            parts.append(f"{key_label(design, within)} {'is' if len(within) == 1 else 'are'} within {eps:g}")
        if no_better:
            text = f"{key_label(design, no_better)} cannot beat it by more than {eps:g}"
            # the search settles at its one-sided 1 - alpha bound (science §9.4); where the table's 95 % bound of D
            # reaches past epsilon, say how far, so the line and the table agree
            loose = pd.to_numeric(settled.loc[~behind, "d_hi"], errors="coerce")
            if (loose > eps).any():
                text += (f" (as the search settled {'it' if len(no_better) == 1 else 'them'}, at its one-sided "
                         f"bound; at 95 % D reaches {float(loose.max()):+.2f})")
            parts.append(text)
        if worse:
            parts.append(f"{key_label(design, worse)} {'is' if len(worse) == 1 else 'are'} worse")
        return "; ".join(parts), True, ""
    rival = g[g["key"] == v.rival].iloc[0]
    d_lo, d_hi = v.rival_d[1], v.rival_d[2]
    bound = (f" (D = {_interval(*v.rival_d)})" if pd.notna(d_lo) and pd.notna(d_hi) else
             f" (D = {_r(v.rival_d[0])}, no interval yet)" if pd.notna(v.rival_d[0]) else "")
    others = [k for k in v.open if k != v.rival]
    also = f", and so could {key_label(design, others)}" if others else ""
    sentence = (f"Not decided at {_at_c_star(g)}: {key_label(design, [rival['key']])} could still beat {name} by more "
                f"than {eps:g}{bound}{also}; {name} leads with validation {metric} {reward}; to decide: {fix}")
    return sentence, False, fix


def decision_headline(decision: pd.DataFrame, eval_k: int | None = None) -> tuple[str, bool, list[str]]:
    """The first line from the ``decision`` table: every group of its first design (the n design when present),
    each prefixed with bucket / rule when there are several; whether all are decided; what would decide them."""
    metric = f"avg@{eval_k}" if eval_k else "avg@k"
    groups = list(first_design(decision).groupby(["bucket", "rule", "fixed"], sort=True))
    sentences, fixes, decided = [], [], True
    for (bucket, rule, fixed), g in groups:
        text, ok, fix = _group_sentence(g, metric)
        where = f"{bucket} / {rule}" + ("" if str(fixed) == "all" else f" / {fixed}")
        sentences.append(text if len(groups) == 1 else f"{where}: {text}")
        decided &= ok
        if fix:
            fixes.append(f"to decide{'' if len(groups) == 1 else ' ' + where}: {fix}")
    return ". ".join(sentences) + ".", decided, fixes


def decision_spec(decision: pd.DataFrame) -> TableSpec:
    """Every key of every group at C*: its reward with interval, D to the leader, status (science §9.4)."""
    c_star = fmt_budget(decision["c_star"].iloc[0])
    eps = float(decision["tolerance"].iloc[0])
    rows = pd.DataFrame({
        "group": decision["design"].astype(str) + ": " + decision["bucket"].astype(str) + " / "
                 + decision["rule"].astype(str) + " / " + decision["fixed"].astype(str),
        "key": [key_label(str(des), [k]) for des, k in zip(decision["design"], decision["key"], strict=True)],
        "status": decision["status"].astype(str),
        "reward at C*": [("unknown, in " + f"[{_r(lo)}, {_r(hi)}]" if u else _interval(v, lo, hi))
                         for v, lo, hi, u in zip(decision["reward"], decision["reward_lo"], decision["reward_hi"],
                                                 decision["unknown"], strict=True)],
        "D to leader": ["—" if pd.isna(v) or s == "leader" else _interval(v, lo, hi)
                        for v, lo, hi, s in zip(decision["d"], decision["d_lo"], decision["d_hi"], decision["status"],
                                                strict=True)],
        "seeds": decision["seeds"].astype(int),
        "seen to": [fmt_budget(c) + (" (extrapolated)" if e and not u else "") for c, e, u in
                    zip(decision["c_seen"], decision["extrapolated"], decision["unknown"], strict=True)],
    })
    caption = (f"Each key's validation reward at C* = {c_star} rollouts (study.target_budget) with its 95 % interval "
               "(the seed-to-seed spread pooled across keys, plus R0's evaluation noise; science §9.3; clipped to "
               "[0, 1], the range of a reward), and its "
               f"difference D to the leader. Settled: D's upper bound <= {eps:g} (study.tolerance), or an n below the "
               f"leader's beaten where both ran (A2); within tolerance: D's lower bound >= -{eps:g}; unknown: C* "
               "beyond sweep.search.eta times where its runs end.")
    if from_forecast(decision):
        caption += (" Groups whose C* lies past that are decided by the forecast (science §10.2): every run of the "
                    "group fitted at once on one surface over the keys, the reward and D with their bootstrap "
                    f"intervals read off it; settled there means D's upper bound <= {eps:g}, and unknown that the "
                    "reward's interval is wider than the forecast's widest answer.")
    return TableSpec("decision", f"The decision at C* = {c_star} rollouts", caption, frame=rows)
