"""The report's first line: the decision at the target budget C* (science §9.4), from the ``decision`` table.

Decided: "At C* = 40,000 rollouts: n = 4 (B_problem 16, M = 625 steps), validation avg@4 0.53 [0.51, 0.56];
n = 8 is within 0.02; n = 2 and 16 are worse". Not decided: "Not decided at C* = 40,000 between n = 4 and
n = 8 (D = 0.01 [-0.03, 0.05]); to decide: ...". A group decided by the forecast past the data (science §10.2,
``source`` "forecast") says so: "At C* = 160,000 rollouts (4x the runs' budget, forecast from the surface): ...".
Budgets print as whole rollouts with thousands separators.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

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
    """"C* = 40,000 rollouts", with "(4x the runs' budget, forecast from the surface)" for the forecast's groups."""
    text = f"C* = {fmt_budget(g['c_star'].iloc[0])} rollouts"
    seen = float(pd.to_numeric(g["c_seen"], errors="coerce").max())
    if from_forecast(g) and seen > 0:
        text += f" ({float(g['c_star'].iloc[0]) / seen:.2g}x the runs' budget, forecast from the surface)"
    return text


def _r(v: Any) -> str:
    return fmt_value(float(v), decimals=2)


def _interval(v: Any, lo: Any, hi: Any) -> str:
    return fmt_interval(v, lo, hi, decimals=2)


def _group_sentence(g: pd.DataFrame, metric: str) -> tuple[str, bool, str]:
    """(sentence, decided, to_decide) of one design group."""
    design = str(g["design"].iloc[0])
    c_star, eps = fmt_budget(g["c_star"].iloc[0]), float(g["tolerance"].iloc[0])
    lead_rows = g[g["status"] == "leader"]
    if lead_rows.empty:
        seen = fmt_budget(g["c_seen"].max())
        return (f"Not decided at C* = {c_star}: no key was trained close enough to it (runs reach {seen} rollouts); "
                f"to decide: {g['to_decide'].iloc[0]}", False, str(g["to_decide"].iloc[0]))
    lead = lead_rows.iloc[0]
    name = key_label(design, [lead["key"]])
    detail = [f"{'n' if design == 'b_problem' else 'B_problem'} {int(lead['n' if design == 'b_problem' else 'b_problem'])}"
              if not pd.isna(lead["n" if design == "b_problem" else "b_problem"]) else "",
              f"M = {int(lead['steps']):,} steps" if not pd.isna(lead["steps"]) else ""]
    detail = [d for d in detail if d]
    who = name + (f" ({', '.join(detail)})" if detail else "")
    reward = _interval(lead["reward"], lead["reward_lo"], lead["reward_hi"])
    if bool(lead["unknown"]):  # the forecast's leader whose interval is too wide to be an answer (science §10.2)
        reward = f"unknown, in [{_r(lead['reward_lo'])}, {_r(lead['reward_hi'])}]"
    elif bool(lead["extrapolated"]) and not from_forecast(g):
        reward += f", extrapolated from {fmt_budget(lead['c_seen'])}"
    if bool(g["decided"].iloc[0]):
        parts = [f"At {_at_c_star(g)}: {who}, validation {metric} {reward}"]
        within = g[g["status"] == "within tolerance"]["key"].tolist()
        settled = g[g["status"] == "settled"]
        # science §9.4: settled = cannot beat the leader by more than eps; "worse" only where D's upper bound
        # is below 0 or the key was settled on A2 (beaten at a rung, it will not overtake)
        behind = (settled["d_hi"] < 0) | settled["settled_by"].astype(str).str.endswith("a2")
        worse, no_better = settled[behind]["key"].tolist(), settled[~behind]["key"].tolist()
        if within:
            parts.append(f"{key_label(design, within)} {'is' if len(within) == 1 else 'are'} within {eps:g}")
        if no_better:
            parts.append(f"{key_label(design, no_better)} cannot beat it by more than {eps:g}")
        if worse:
            parts.append(f"{key_label(design, worse)} {'is' if len(worse) == 1 else 'are'} worse")
        return "; ".join(parts), True, ""
    open_rows = g[(g["status"] != "leader") & ~g["settled"].astype(bool)]
    where = f"C* = {c_star}" if not from_forecast(g) else _at_c_star(g)
    if open_rows.empty:  # every other key settled: the leader's own reward is what is not known (science §10.2)
        return (f"Not decided at {where}: {name} leads, every other key settled, but its validation {metric} is "
                f"{reward}; to decide: {lead['to_decide']}", False, str(lead["to_decide"]))
    rival = open_rows.loc[open_rows["d_hi"].idxmax()] if open_rows["d_hi"].notna().any() else open_rows.iloc[0]
    between = key_label(design, [lead["key"], *open_rows["key"].tolist()]).replace(f"{_KEY_NAME.get(design)} = ", "")
    d = "" if pd.isna(rival["d"]) else f" (D = {_interval(rival['d'], rival['d_lo'], rival['d_hi'])} for " \
        f"{key_label(design, [rival['key']])})"
    sentence = (f"Not decided at {where} between {_KEY_NAME.get(design, 'key')} = {between}{d}; "
                f"{name} leads with validation {metric} {reward}; to decide: {lead['to_decide']}")
    return sentence, False, str(lead["to_decide"])


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
