"""The answer at C* past the data (science §10.2): the ``decision`` table's rows from the forecast, the report's first
line with the backtest beside it, and the section "with 2x, 4x, 8x more compute".

A small study on a known surface (tests/test_forecast.py's curves, 2 seeds of keys n = 2 to 16 to C_max = 40,000)
is fitted as the fit stage fits it (per-run decision, forecast, backtest) at C* = 4 x C_max, where §9 reads no key.
"""

from __future__ import annotations

import io
import math
import re

import numpy as np
import pandas as pd
import pytest

from rollscale.core.fit.analysis import run_evals
from rollscale.core.fit.decision_table import DECISION_COLUMNS, decision_table, with_forecast
from rollscale.core.fit.forecast import ForecastSettings
from rollscale.core.fit.horizon import forecast_budgets, horizon_tables
from rollscale.report import build_charts, study_answer
from rollscale.report.charts.horizon import chart_more_compute, more_compute_rows
from rollscale.report.decision_text import key_label
from rollscale.report.horizon import backtest_sentence
from tests.test_forecast import _on_surface

C_MAX, B_PROBLEM, ETA, EPS, K = 40_000, 16, 1.41, 0.02, 16
# the decision and report plumbing on science §10.1's surface (the study below lies on one: sigmoids that bend
# inside the data); the default form is scored in tests/test_forecast_forms.py and tests/test_long_grid.py
SETTINGS = ForecastSettings(resamples=30, eval_draws=1600, form="surface")


def _study(seed: int = 3, bend: bool = False, noise: float = 0.015) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(runs, evals)`` of the surface's study, its runs ending at C_max; ``bend``: n = 16 stops rising past
    C_max / 2 (A4 broken, the backtest fails; tests/test_forecast.py)."""
    ev, _ = _on_surface(seeds=2, noise=noise, seed=seed)
    ev["c"] *= C_MAX / ev["c"].max()
    if bend:
        late = (ev["n"] == 16) & (ev["c"] > C_MAX / 2)
        at_bend = ev.loc[(ev["n"] == 16) & (ev["c"] <= C_MAX / 2)].groupby("seed")["avg_at_k"].last()
        ev.loc[late, "avg_at_k"] = ev.loc[late, "seed"].map(at_bend) + np.random.default_rng(1).normal(
            0, 0.01, late.sum())
    runs = ev.drop_duplicates("run_id")[["run_id", "n", "seed"]].assign(
        bucket="easy", rule="uniform", b_problem=B_PROBLEM, c_max=C_MAX, status="finished")
    evals = ev.assign(step=(ev["c"] / (B_PROBLEM * ev["n"])).round().astype(int), k=K, n_problems=100,
                      avg_at_k_se=0.01, best_at_k=(ev["avg_at_k"] + 0.2).clip(upper=1),
                      worst_at_k=(ev["avg_at_k"] - 0.2).clip(lower=0))
    return runs, evals.drop(columns=["n", "seed"])


def _fit(runs: pd.DataFrame, evals: pd.DataFrame, c_star: float) -> dict[str, pd.DataFrame]:
    """The fit stage's decision, forecast and backtest tables (flows/fit.py's steps, few refits)."""
    ev = run_evals(runs, evals, None)
    ahead = horizon_tables(ev, c_star, forecast_budgets(c_star, C_MAX), SETTINGS)
    per_run = decision_table(ev, c_star, EPS, ETA, 50, 0)
    return {"runs": runs, "evals": evals, "per_run": per_run, "forecast": ahead.forecast,
            "backtest": ahead.backtest, "decision": with_forecast(per_run, ahead.forecast, SETTINGS.max_width)}


@pytest.fixture(scope="module")
def past() -> dict[str, pd.DataFrame]:
    return _fit(*_study(), 4 * C_MAX)


@pytest.fixture(scope="module")
def bent() -> dict[str, pd.DataFrame]:
    # read at 2 x C_max: the backtest then cuts at C_max / 2 (science §11.4), where n = 16 bends
    return _fit(*_study(6, bend=True, noise=0.01), 2 * C_MAX)


def _tables(fitted: dict[str, pd.DataFrame], **changed: pd.DataFrame) -> dict[str, pd.DataFrame]:
    return {k: v for k, v in {**fitted, **changed}.items() if k != "per_run"}


def test_past_the_data_the_decision_rows_are_the_forecasts(past):
    per_run, d = past["per_run"], past["decision"]
    assert per_run["unknown"].all() and (per_run["status"] == "unknown").all()  # §9 reads no key at 4 x C_max
    assert list(d.columns) == DECISION_COLUMNS and (d["source"] == "forecast").all()
    fc = past["forecast"]
    at = fc[fc["target"] & fc["trained"]].set_index("key")
    d = d.set_index("key")
    assert list(d.index) == [2, 4, 8, 16]  # the trained keys only: keys the forecast adds stay in its table
    for col in ("reward", "reward_lo", "reward_hi", "d", "d_lo", "d_hi"):
        np.testing.assert_allclose(d[col].astype(float), at.loc[d.index, col].astype(float))
    lead = int(at["leader"].iloc[0])
    assert (d["leader"] == lead).all() and d.loc[lead, "status"] == "leader"
    # §9.4's rules on the forecast's intervals: settled when D's upper bound <= epsilon, decided when all are
    others = d.drop(index=lead)
    assert (others["settled"] == (others["d_hi"] <= EPS)).all() and (others["settled_by"] == "forecast").all()
    assert d["decided"].all() and (d["to_decide"] == "").all()
    # what the export needs stays: n, B_problem, M = C* / B
    assert (d["n"] == d.index).all() and (d["steps"] == np.ceil(4 * C_MAX / (d["n"] * B_PROBLEM))).all()


def _open_rival(past: dict[str, pd.DataFrame]) -> tuple[pd.DataFrame, int]:
    """The forecast with its first non-leading trained key's D upper bound set to 0.05 (open), and that row."""
    fc = past["forecast"].copy()
    at = fc["target"] & fc["trained"]
    lead = int(fc.loc[at, "leader"].iloc[0])
    rival = fc.index[at & (fc["key"] != lead)][0]
    fc.loc[rival, "d_hi"] = 0.05
    return fc, rival


def test_a_key_that_could_still_beat_the_leader_is_named_with_what_would_decide_it(past):
    """Science §11.5: "not decided" names the open key and what would decide it: more seeds, within
    sweep.search.spend_max x C* (a study whose search stopped adding seeds at its cap says so here too)."""
    fc, rival = _open_rival(past)
    d = with_forecast(past["per_run"], fc, 0.15)
    assert not d["decided"].any()
    assert (d["to_decide"] == (f"key {int(fc.loc[rival, 'key'])} may still beat the leader by more than {EPS:g} at C* "
                               "(the forecast's upper bound of D is 0.05): more seeds for it and the leader "
                               "(sweep.search.seeds_max, within sweep.search.spend_max x C*), or sweep.c_max closer "
                               "to C* (the forecast's intervals widen with the distance past the data)")).all()


def test_a_key_open_on_its_own_continuation_is_told_to_train_further_not_to_seed(past):
    """Science §11.3: where the open key's upper bound is its own rise continued past its data (a key still
    accelerating where its data end), what decides it is training it further: more seeds narrow its noise only."""
    fc, rival = _open_rival(past)
    fc.loc[rival, "continued_hi"] = fc.loc[rival, "reward_hi"]
    d = with_forecast(past["per_run"], fc, 0.15)
    assert not d["decided"].any()
    fix = d["to_decide"].iloc[0]
    assert fix.startswith(f"key {int(fc.loc[rival, 'key'])} may still beat the leader") and "its own rise continued" \
        in fix and "train it further, sweep.c_max closer to C*" in fix, fix
    assert "sweep.search.seeds_max" not in fix


def test_within_the_data_the_per_run_decision_is_unchanged():
    fitted = _fit(*_study(), C_MAX)
    assert (fitted["per_run"]["source"] == "per-run").all() and not fitted["per_run"]["unknown"].any()
    pd.testing.assert_frame_equal(fitted["decision"], fitted["per_run"])
    # and no forecast, or none for the group, changes nothing either
    assert with_forecast(fitted["per_run"], None, 0.15).equals(fitted["per_run"])


def test_a_group_without_a_forecast_keeps_its_per_run_rows(past):
    other = past["forecast"].assign(bucket="hard")
    kept = with_forecast(past["per_run"], other, 0.15)
    assert (kept["source"] == "per-run").all() and (kept["status"] == "unknown").all()
    assert kept["to_decide"].str.contains("sweep.c_max >= ").all()


def test_the_first_line_states_the_forecast_with_its_interval_and_the_backtest(past):
    answer = study_answer(_tables(past))
    d = past["decision"].set_index("key")
    lead = int(d["leader"].iloc[0])
    r = d.loc[lead]
    interval = f"{r['reward']:.2f} [{r['reward_lo']:.2f}, {r['reward_hi']:.2f}]"
    others = d.drop(index=lead)
    assert answer.answered and d["decided"].all()
    # every other key is settled on the forecast; those whose D's upper bound is below 0 are worse (§9.4's words)
    worse = [int(k) for k in others.index if others.loc[k, "d_hi"] < 0]
    no_better = [int(k) for k in others.index if 0 <= others.loc[k, "d_hi"] <= EPS]
    assert worse and len(worse) + len(no_better) == len(others)
    words = [f"{key_label('n', no_better)} cannot beat it by more than 0.02"] if no_better else []
    words += [f"{key_label('n', worse)} {'is' if len(worse) == 1 else 'are'} worse"]
    assert answer.headline.startswith(
        f"Use n = {lead} (B_problem 16, M = {math.ceil(160_000 / (16 * lead)):,} steps) at C* = 160,000 rollouts (4x "
        f"the runs' budget, forecast past the data): validation avg@16 {interval}; {'; '.join(words)}. "
    ), answer.headline
    bt = past["backtest"]
    assert not bt["failed"].any()
    assert f"Forecast past the data (science §10): {bt['note'].iloc[0]}." in answer.headline
    assert answer.headline.index("validation avg@16") < answer.headline.index("Forecast past the data")
    # a key beyond the grid the forecast puts above the leader (D's lower bound > 0): the bracket says add it
    fc = past["forecast"]
    above = fc[fc["target"] & ~fc["trained"] & (fc["d_lo"] > 0)]
    assert above["key"].tolist() == [32] and lead == 16
    assert [f for f in answer.fixes if "not trained" in f] == [
        f"n = 32, not trained, is forecast above the leader (n = 16) at C* = 160,000: D = "
        f"{above['d'].iloc[0]:.2f} [{above['d_lo'].iloc[0]:.2f}, {above['d_hi'].iloc[0]:.2f}] (science §10.2); add "
        "it to sweep.n so that runs decide"]
    # the decision table below says where its numbers come from
    assert "decided by the forecast (science §10.2)" in answer.decision.caption
    assert answer.decision.frame.set_index("key").loc[f"n = {lead}", "reward at C*"] == interval


def test_a_failed_backtest_says_the_forecast_is_not_to_be_trusted_and_why(bent):
    bt = bent["backtest"]
    assert bt["failed"].all() and (bent["decision"]["source"] == "forecast").all()
    answer = study_answer(_tables(bent))
    assert re.match(r"Use n = \d+ \(B_problem 16, M = [\d,]+ steps\) at C\* = 80,000 rollouts \(2x the runs' "
                    r"budget, forecast past the data\)", answer.headline) or \
        answer.headline.startswith("Not decided at C* = 80,000 rollouts (2x the runs' budget, forecast past the data)")
    assert re.search(r"Forecast past the data \(science §10\): .*not to be trusted past the data \(.+\)\.",
                     answer.headline), answer.headline
    assert "A4 contradicted: key 16" in answer.headline
    assert not answer.answered  # an answer its own backtest does not trust is no answer
    assert answer.fixes[0].startswith("sweep.c_max closer to study.target_budget")
    # a backtest that could not be made says so too, in the same words
    failed = bt.assign(note="no backtest: too few points", failed=True)
    assert backtest_sentence({"backtest": failed}) == ("Forecast past the data (science §10): no backtest: too few "
                                                       "points; not to be trusted past the data.")


def test_a_leader_too_wide_is_the_answer_marked_uncertain_and_an_open_key_is_named(past):
    """Science §11.5: the n is what the practitioner acts on; a reward interval wider than 0.15 marks it "uncertain",
    it does not withhold it. "Not decided" only while a key could still beat the leader by more than epsilon."""
    fc = past["forecast"].copy()
    lead = int(fc["leader"].iloc[0])
    fc.loc[fc["key"] == lead, "unknown"] = True
    fc.loc[fc["key"] == lead, ["reward_lo", "reward_hi"]] = [0.40, 0.70]
    d = with_forecast(past["per_run"], fc, 0.15)
    assert d["decided"].all() and (d["status"] == "leader").sum() == 1 and (d["to_decide"] == "").all()
    answer = study_answer(_tables(past, decision=d))
    assert answer.answered
    assert answer.headline.startswith(f"Use n = {lead} (B_problem 16, "), answer.headline
    assert "uncertain (its 95 % interval is 0.30 wide, wider than 0.15)" in answer.headline
    # with a key still open, the first line names it and what would decide it
    fc.loc[fc["key"] == 8, "d_hi"] = 0.05
    d = with_forecast(past["per_run"], fc, 0.15)
    assert not d["decided"].any()
    assert d["to_decide"].iloc[0].startswith("key 8 may still beat the leader by more than 0.02 at C*")
    answer = study_answer(_tables(past, decision=d))
    assert not answer.answered
    assert answer.headline.startswith("Not decided at C* = 160,000 rollouts (4x the runs' budget, forecast past the "
                                      f"data): n = 8 could still beat n = {lead} by more than 0.02 (D = "), \
        answer.headline
    assert f"n = {lead} leads with validation avg@16 " in answer.headline and ", uncertain (" in answer.headline
    assert "Forecast past the data (science §10): " in answer.headline  # beside an undecided forecast too


def test_a_key_the_search_settled_stays_settled_on_its_verdict(past):
    """The default study at C* = 160,000 (2026-11-27): the forecast search stopped n = 4-32 at 20,120 rollouts (D's
    upper bound below -0.016 at its one-sided 70 %), and the fit's 95 % forecast then called them open: the search's
    stops are its verdicts, as §9.4's are (with_search), and the answer keeps them with their budget. The bounds
    shown are the forecast's own, so that D lies within them (science §11.5)."""
    fc = past["forecast"].copy()
    lead = int(fc["leader"].iloc[0])
    key = next(k for k in (2, 4, 8, 16) if k != lead)
    fc.loc[fc["key"] == key, "d_hi"] = 0.05  # the final forecast alone would leave it open
    per_run = past["per_run"].copy()
    mine = per_run["key"] == key
    per_run.loc[mine, ["settled", "settled_by", "settled_at", "d_lo", "d_hi"]] = True, "search: forecast", 20_120.0, \
        -0.1, -0.05
    per_run["by_search"], per_run["leader"] = True, lead
    d = with_forecast(per_run, fc, 0.15).set_index("key")
    assert d.loc[key, "settled"] and d.loc[key, "status"] == "settled", d.loc[key]
    assert d.loc[key, "settled_by"] == "search: forecast" and d.loc[key, "settled_at"] == 20_120.0
    row = fc[fc["target"] & (fc["key"] == key)].iloc[0]
    assert (d.loc[key, "d_lo"], d.loc[key, "d_hi"]) == (row["d_lo"], 0.05)
    assert d.loc[key, "d_lo"] <= d.loc[key, "d"] <= d.loc[key, "d_hi"]
    unsearched = with_forecast(past["per_run"], fc, 0.15).set_index("key")
    assert not unsearched.loc[key, "settled"] and unsearched.loc[key, "status"] != "settled"


def test_the_export_reads_the_forecasts_leader(past):
    from rollscale.config import parse_params
    from rollscale.integrations.export.plan import production_run

    params = parse_params({"sweep": {"bucket": "easy", "n": [2, 4, 8, 16], "b_problem": [B_PROBLEM], "c_max": C_MAX},
                           "study": {"target_budget": 4 * C_MAX}})
    run = production_run(params, past["decision"])
    row = past["decision"].set_index("key").loc[run.key]
    assert run.status == "leader" and run.c_star == 160_000 and run.steps == math.ceil(160_000 / (16 * run.n))
    assert (run.reward, run.reward_lo, run.reward_hi) == (row["reward"], row["reward_lo"], row["reward_hi"])


def test_more_compute_chart_draws_n_star_and_its_reward_at_each_budget(past):
    rows = more_compute_rows(past["forecast"])
    assert rows["c"].tolist() == [80_000, 160_000, 320_000]  # 2x, 4x (C*) and 8x C_max
    assert rows["budget"].tolist() == ["80,000", "160,000 (C*)", "320,000"]
    assert rows[["reward", "lo", "hi"]].stack().between(0, 1).all()
    assert ((rows["lo"] <= rows["reward"]) & (rows["reward"] <= rows["hi"])).all()
    assert rows["label"].str.fullmatch(r"n = \d+").all()
    # intervals past [0, 1] (a forecast's percentiles moved out) are drawn clipped
    wide = past["forecast"].assign(reward_lo=-0.2, reward_hi=1.3)
    assert more_compute_rows(wide)[["lo", "hi"]].stack().between(0, 1).all()
    spec = chart_more_compute(_tables(past), {})
    assert spec.chart is not None and spec.caption.endswith(".")
    text = str(spec.chart.to_dict())
    assert "[rollouts]" in text and "[0-1]" in text and "log" in text
    svg = io.StringIO()
    spec.chart.save(svg, format="svg")  # vl-convert compiles and draws it
    assert svg.getvalue().startswith("<svg")
    assert [c.name for c in build_charts(_tables(past))][:2] == ["answer", "more_compute"]
    # no forecast table: missing, naming the stage; an empty one: says why
    assert "fit" in chart_more_compute({"forecast": None}, {}).missing
    assert "two ordered keys" in chart_more_compute({"forecast": past["forecast"].iloc[0:0]}, {}).missing


def test_the_page_has_the_section_with_its_chart_and_table(past, tmp_path):
    from rollscale.report import write_report

    paths = write_report(_tables(past), tmp_path)
    page, md = paths.html.read_text(), paths.summary.read_text()
    section = page[page.index('<section id="more-compute">'):]
    section = section[:section.index("</section>")]
    assert "<h2>With 2x, 4x, 8x more compute</h2>" in section
    assert 'id="chart-more_compute"' in section and 'id="table-more_compute"' in section
    assert page.count('id="table-more_compute"') == 1 and page.index('id="answer"') < page.index('id="more-compute"')
    assert (tmp_path / "charts" / "more_compute.png").exists()
    assert md.index("## With 2x, 4x, 8x more compute") < md.index("## With 2x, 4x, 8x more compute: the forecast")
    assert md.count("## With 2x, 4x, 8x more compute: the forecast") == 1


def test_track_reads_the_band_off_the_forecast_where_the_decision_is_the_forecasts(past):
    """``rollscale track``'s band (rollscale.integrations.track.band): at C* it is the decision's interval, read off
    the same surface with the fit stage's settings."""
    from rollscale.core.fit.verdict import forecast_settings
    from rollscale.integrations.track.band import forecast_band

    assert forecast_settings(30, 0, 1600, form="surface") == SETTINGS
    ev = run_evals(past["runs"], past["evals"], None)
    lead = past["decision"].query("status == 'leader'").iloc[0]
    band = forecast_band(ev, "n", "easy", "uniform", "all", int(lead["key"]), 4 * C_MAX, SETTINGS)
    reward, lo, hi = (float(v[0]) for v in band.at(np.array([4.0 * C_MAX])))
    assert (reward, lo, hi) == pytest.approx((lead["reward"], lead["reward_lo"], lead["reward_hi"]), abs=1e-9)
    assert np.all(np.diff(band.reward) > -1e-9) and (band.lo <= band.reward).all() and (band.hi <= 1).all()
    assert "forecast" in band.source and math.isnan(float(band.at(np.array([8.0 * C_MAX]))[0][0]))


def test_a_track_tick_past_the_data_expects_the_forecasts_reward_at_c_star(past):
    from rollscale.config import parse_params
    from rollscale.integrations.track.logs import RunLog
    from rollscale.integrations.track.tick import track_tick

    params = parse_params({"sweep": {"bucket": "easy", "n": [2, 4, 8, 16], "b_problem": [B_PROBLEM], "c_max": C_MAX,
                                     "eval_k": K},
                           "bucket": {"val_size": 100}, "fit": {"bootstrap_resamples": 30},
                           # the fit stage's form, as `past` was fitted
                           "study": {"target_budget": 4 * C_MAX, "forecast_form": SETTINGS.form},
                           "track": {"logs": "prod"}})
    lead = past["decision"].query("status == 'leader'").iloc[0]
    log = RunLog("prod", pd.DataFrame({"metric": "critic/score/mean", "step": range(1, 9), "value": 0.45,
                                       "order": range(8)}), {})
    done = track_tick(params, params.track, past["decision"], run_evals(past["runs"], past["evals"], None), log,
                      None, "prod", "verl-jsonl")
    expected = done.lines[1]
    assert expected.startswith(f"Expected at C* = 160,000 rollouts: validation avg@16 {lead['reward']:.3f} "
                               f"[{lead['reward_lo']:.3f}, {lead['reward_hi']:.3f}] (the study's forecast of key "
                               f"{int(lead['key'])} "), expected
