"""The forecast's form chosen leave-one-grid-out (science §11.1): rollscale.core.fit.form_choice."""

from __future__ import annotations

import pandas as pd
import pytest

from rollscale.core.fit.form_choice import choose_form, form_scores, leave_one_grid_out


def _rows(source: str, form: str, error: float, covered: int, width: float, keys: int = 5,
          family: str = "grid") -> list[dict]:
    """``keys`` score rows a multiple (4x, 8x): every key off by ``error``, the first ``covered`` covered."""
    return [{"form": form, "source": source, "family": family, "multiple": m, "key": 2 ** (i + 1),
             "error": error if i % 2 == 0 else -error, "covered": i < covered, "width": width}
            for m in (4.0, 8.0) for i in range(keys)]


def _bed(g3_good: str) -> pd.DataFrame:
    """Grids g1, g2 where ``good`` covers and ``poor`` does not; grid g3 where ``g3_good`` is the better one."""
    rows = []
    for g in ("g1", "g2"):
        rows += _rows(g, "good", 0.01, 5, 0.10) + _rows(g, "poor", 0.05, 2, 0.10)
    g3_poor = "poor" if g3_good == "good" else "good"
    rows += _rows("g3", g3_good, 0.005, 5, 0.08) + _rows("g3", g3_poor, 0.09, 1, 0.12)
    return pd.DataFrame(rows)


def test_the_held_out_grid_takes_no_part_in_its_choice():
    """g3's own rows favour ``poor``, yet g3 held out gets ``good`` (the choice on g1 and g2); flipping which form is
    better on g3 changes g3's score, never its choice."""
    for g3_good in ("good", "poor"):
        table = leave_one_grid_out(_bed(g3_good)).set_index(["held_out", "multiple"])
        assert table.loc[("g3", 4.0), "form"] == "good"
        assert table.loc[("g3", 4.0), "chosen_on"] == "g1, g2"
    favoured = leave_one_grid_out(_bed("poor")).set_index(["held_out", "multiple"])
    assert favoured.loc[("g3", 4.0), "mean_abs_error"] == pytest.approx(0.09)
    assert favoured.loc[("g3", 4.0), "coverage"] == pytest.approx(0.2)
    assert favoured.loc[("g3", 8.0), "median_width"] == pytest.approx(0.12)
    # g1 held out: chosen on g2 and g3 pooled, where ``poor`` covers 7 of 10 keys a multiple and ``good`` 6
    assert favoured.loc[("g1", 4.0), "form"] == "poor"
    assert favoured.loc[("g1", 4.0), "chosen_on"] == "g2, g3"


def test_a_grid_held_out_is_scored_with_the_others_choice_when_they_disagree_with_it():
    """Two grids: each is scored with the form the other one prefers."""
    rows = pd.DataFrame(_rows("a", "x", 0.01, 5, 0.1) + _rows("a", "y", 0.04, 3, 0.1)
                        + _rows("b", "x", 0.04, 3, 0.1) + _rows("b", "y", 0.01, 5, 0.1))
    table = leave_one_grid_out(rows).set_index(["held_out", "multiple"])
    assert table.loc[("a", 4.0), "form"] == "y" and table.loc[("b", 4.0), "form"] == "x"
    every = table.loc[("all", 4.0)]
    assert every["keys"] == 10 and every["mean_abs_error"] == pytest.approx(0.04)
    assert every["coverage"] == pytest.approx(0.6)


def test_the_criterion_answers_first_then_covers_then_errs_least():
    wide = _rows("a", "wide", 0.2, 5, 0.7)  # covers every key by being no answer
    narrow_miss = _rows("a", "narrow_miss", 0.001, 3, 0.05)  # smallest error, covers 3 of 5
    narrow_cover = _rows("a", "narrow_cover", 0.03, 5, 0.12)
    scores = form_scores(pd.DataFrame(wide + narrow_miss + narrow_cover))
    assert scores["form"].tolist() == ["narrow_cover", "narrow_miss", "wide"]
    assert scores["coverage_shortfall"].tolist() == pytest.approx([0.0, 0.6, 0.0])
    # only the error tells two forms that answer and cover apart
    assert choose_form(pd.DataFrame(_rows("a", "p", 0.03, 5, 0.1) + _rows("a", "q", 0.02, 5, 0.1))) == "q"


def test_simulated_rows_and_a_single_grid_are_not_held_out():
    rows = pd.DataFrame(_rows("a", "x", 0.01, 5, 0.1) + _rows("s-0", "x", 0.01, 5, 0.1, family="rising"))
    with pytest.raises(ValueError, match="at least two grids, got 1"):
        leave_one_grid_out(rows)
    with pytest.raises(ValueError, match="missing columns"):
        leave_one_grid_out(rows.drop(columns="covered"))
