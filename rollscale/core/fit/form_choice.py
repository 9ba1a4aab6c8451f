"""The forecast's form chosen leave-one-grid-out (science §11.1-11.2).

Input: score rows, one per form, source (a long grid, or a simulated study), multiple and key, holding the point's
signed ``error`` against the source's own value at C*, whether the interval ``covered`` it and the interval's
``width`` (:data:`SCORE_COLUMNS`; ``benchmarks/long_grid.py --score`` makes them). Rows of ``family`` ``grid`` are
long grids; each is held out in turn, the form is chosen on the other grids' rows alone, and the held-out grid's
rows of that form are its score: the grid it is scored on took no part in choosing it.

The criterion, on the choosing grids' keys pooled, in this order (the first difference decides):

1. **An answer**: the interval's median width at the smallest multiple scored (4x) at most ``max_width`` (0.15,
   science §11's target and the widest interval that is an answer, §10.2). A form whose interval covers by
   being no answer (§10.1's surface on the long grid: 0.73 wide at 4x) comes after every form that answers.
2. **Coverage**: the shortfall below ``coverage`` (90 %, §11's target), summed over the multiples.
3. **Error**: the mean absolute error of the point, averaged over the multiples.

Ties keep the forms' order as given.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

__all__ = ["CHOICE_COLUMNS", "SCORE_COLUMNS", "choose_form", "form_scores", "held_out_scores",
           "leave_one_grid_out"]

SCORE_COLUMNS = ["form", "source", "family", "multiple", "key", "error", "covered", "width"]
CHOICE_COLUMNS = ["held_out", "form", "multiple", "keys", "mean_error", "mean_abs_error", "coverage",
                  "median_width", "chosen_on"]
GRID = "grid"  # the family of a long grid's rows
MAX_WIDTH = 0.15
COVERAGE = 0.90


def _check(rows: pd.DataFrame) -> None:
    missing = [c for c in SCORE_COLUMNS if c not in rows.columns]
    if missing:
        raise ValueError(f"score rows: missing columns {missing} (has {list(rows.columns)})")


def held_out_scores(rows: pd.DataFrame) -> pd.DataFrame:
    """Per form and multiple (the rows' order kept): keys, mean signed error, mean absolute error, coverage and
    median width of ``rows`` pooled."""
    _check(rows)
    out = []
    for (form, m), t in rows.groupby(["form", "multiple"], sort=False):
        err = t["error"].astype(float)
        out.append({"form": form, "multiple": float(m), "keys": len(t), "mean_error": float(err.mean()),
                    "mean_abs_error": float(err.abs().mean()), "coverage": float(t["covered"].astype(bool).mean()),
                    "median_width": float(t["width"].median())})
    return pd.DataFrame(out, columns=["form", "multiple", "keys", "mean_error", "mean_abs_error", "coverage",
                                      "median_width"])


def form_scores(rows: pd.DataFrame, max_width: float = MAX_WIDTH, coverage: float = COVERAGE) -> pd.DataFrame:
    """Per form, the criterion's three terms on ``rows`` pooled (module docstring), best first: ``too_wide``
    (bool), ``coverage_shortfall``, ``mean_abs_error``."""
    scores = held_out_scores(rows)
    if scores.empty:
        raise ValueError("score rows: none to choose a form on")
    smallest = scores["multiple"].min()
    out = []
    for order, (form, t) in enumerate(scores.groupby("form", sort=False)):
        width = float(t.loc[t["multiple"] == smallest, "median_width"].iloc[0])
        out.append({"form": form, "too_wide": not width <= max_width,
                    "coverage_shortfall": float(np.clip(coverage - t["coverage"], 0.0, None).sum()),
                    "mean_abs_error": float(t["mean_abs_error"].mean()), "order": order})
    table = pd.DataFrame(out).sort_values(["too_wide", "coverage_shortfall", "mean_abs_error", "order"])
    return table.drop(columns="order").reset_index(drop=True)


def choose_form(rows: pd.DataFrame, max_width: float = MAX_WIDTH, coverage: float = COVERAGE) -> str:
    """The form the criterion (module docstring) puts first on ``rows``."""
    return str(form_scores(rows, max_width, coverage)["form"].iloc[0])


def leave_one_grid_out(rows: pd.DataFrame, max_width: float = MAX_WIDTH,
                       coverage: float = COVERAGE) -> pd.DataFrame:
    """Per long grid held out (``family == "grid"``, one per ``source``) and multiple: the form chosen on the
    other grids (:func:`choose_form`) and its score on the held-out grid (:data:`CHOICE_COLUMNS`); then the rows
    ``held_out == "all"``: every held-out grid's keys pooled, each scored with the form chosen without it.
    Needs at least two grids."""
    _check(rows)
    grids = rows[rows["family"] == GRID]
    sources = list(dict.fromkeys(grids["source"]))
    if len(sources) < 2:
        raise ValueError(f"leave-one-grid-out: needs at least two grids, got {len(sources)} "
                         f"({', '.join(map(str, sources)) or 'none'})")
    out, pooled = [], []
    for held in sources:
        others = grids[grids["source"] != held]
        form = choose_form(others, max_width, coverage)
        mine = grids[(grids["source"] == held) & (grids["form"] == form)]
        if mine.empty:
            raise ValueError(f"leave-one-grid-out: grid {held} has no rows of form {form!r}, chosen on the others")
        pooled.append(mine)
        chosen_on = ", ".join(str(s) for s in sources if s != held)
        out += [{"held_out": str(held), **r, "chosen_on": chosen_on}
                for r in held_out_scores(mine).to_dict(orient="records")]
    every = pd.concat(pooled, ignore_index=True).assign(form="(each grid's choice)")
    out += [{"held_out": "all", **r, "chosen_on": "the other grids"}
            for r in held_out_scores(every).to_dict(orient="records")]
    table = pd.DataFrame(out, columns=CHOICE_COLUMNS)
    table["keys"] = table["keys"].astype(int)
    return table
