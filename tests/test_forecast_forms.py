"""The forecast's forms, degenerate data and the intervals' invariants (science §11.2-11.4; issue 56 part 3).

No fit in the forecast (its forms, the surface, the backtest, the per-key fits, the cap) raises on degenerate
data: 1-3 evaluations a run, constant rewards, rewards all 0 or all 1, a flat curve, validation solved at step 0.
Each gives a reason a caller can show. Every forecast row's estimate lies in its interval, never a single value.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from rollscale.core.fit.analysis import run_evals
from rollscale.core.fit.backtest import backtest, calibration, cuttable_multiple, untested_factor
from rollscale.core.fit.climb import (GROWTH_MAX, Acceleration, accelerating_rise, acceleration, climb_caps,
                                      group_accelerating)
from rollscale.core.fit.decision import fit_runs
from rollscale.core.fit.forecast import ForecastSettings, forecast_group, forecast_table
from rollscale.core.fit.forms import DEFAULT_FORM, FORMS
from rollscale.core.fit.horizon import horizon_tables
from rollscale.core.fit.passk import pass_at_k

QUICK = ForecastSettings(resamples=8, eval_draws=1600)


def _evals(points: int, reward, keys=(2, 4), seeds=2) -> pd.DataFrame:
    """Runs of ``keys`` x ``seeds`` evaluated at step 0 and ``points`` budgets a quarter doubling apart from
    2,000; ``reward(n, seed, i)`` the i-th evaluation's value (i = 0: step 0)."""
    rows = []
    for n in keys:
        for s in range(seeds):
            for i, c in enumerate([0.0, *(2000 * 2 ** (j / 4) for j in range(points))]):
                rows.append({"run_id": f"n{n}_s{s}", "n": n, "seed": s, "c": c, "avg_at_k": reward(n, s, i),
                             "group": "g"})
    return pd.DataFrame(rows)


DEGENERATE = {
    "one evaluation a run": (_evals(1, lambda n, s, i: 0.3 + 0.05 * i), "not enough evaluations"),
    "constant rewards": (_evals(8, lambda n, s, i: 0.4), "flat curve"),
    "rewards all 0": (_evals(8, lambda n, s, i: 0.0), "no run learned"),
    "rewards all 1": (_evals(8, lambda n, s, i: 1.0), "validation solved at step 0"),
    "solved at step 0": (_evals(8, lambda n, s, i: 1.0 if i == 0 else 0.96 + 0.01 * s), "solved at step 0"),
}


@pytest.mark.parametrize("name", list(DEGENERATE))
def test_degenerate_data_give_a_reason_never_an_error(name):
    evals, why = DEGENERATE[name]
    table = forecast_table(evals, "n", "group", 160_000, settings=QUICK)
    assert table["reason"].str.contains(why).all(), table["reason"].unique()
    assert table["reward"].isna().all() and table["leader"].isna().all()
    bt = backtest(evals, "n", QUICK, multiple=4.0)
    assert bt.failed and bt.note.startswith("no backtest"), bt.note
    fit_runs(evals, "n")  # the per-key fits: NaN where nothing fits, no error
    climb_caps(evals, "n", 160_000, 0.02)
    runs = evals.drop_duplicates("run_id")[["run_id", "n", "seed"]].assign(b_problem=16)
    steps = evals.assign(step=(evals["c"] / (16 * evals["n"])).round().astype(int))
    out = horizon_tables(run_evals(runs, steps[["run_id", "step", "c", "avg_at_k"]], None), 160_000,
                         [160_000.0], QUICK)
    assert out.backtest["failed"].all() and out.backtest["note"].str.contains(why).all(), out.backtest["note"]


@pytest.mark.parametrize("points", [2, 3])
def test_two_or_three_evaluations_a_run_forecast_or_say_why(points):
    evals = _evals(points, lambda n, s, i: 0.3 + 0.04 * i + 0.005 * s + 0.01 * math.log2(n))
    for form in (DEFAULT_FORM, "surface"):
        table = forecast_table(evals, "n", "group", 160_000, settings=ForecastSettings(resamples=8,
                                                                                       eval_draws=1600, form=form))
        trained = table[table["trained"]]
        assert (trained["reason"] == "").all() and trained["reward"].notna().all()
    bt = backtest(evals, "n", QUICK, multiple=4.0)
    assert bt.failed and "not enough evaluations to cut" in bt.note


def _slope(n: int) -> float:
    return 0.05 + 0.005 * math.log2(n)


def _rising(keys=(2, 4, 8, 16), seeds=2, stop: dict | None = None, seed=0) -> pd.DataFrame:
    """Curves flat at R0 = 0.35 to 4,000, then rising 0.05 + 0.005 log2 n a doubling, avg@16 noise; ``stop``:
    key -> the budget its runs end at (else 40,000)."""
    rng = np.random.default_rng(seed)
    rows = []
    cs = [0.0, *(1000 * 2 ** (j / 4) for j in range(22))]
    for n in keys:
        for s in range(seeds):
            for c in cs:
                if c > (stop or {}).get(n, 40_000) * (1 + 1e-9):
                    continue
                p = 0.35 + (_slope(n) * max(math.log2(c / 4000), 0) if c else 0.0)
                rows.append({"run_id": f"n{n}_s{s}", "n": n, "seed": s, "c": c,
                             "avg_at_k": rng.binomial(1600, p) / 1600, "group": "g"})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("form", sorted({DEFAULT_FORM, "surface", *FORMS}))
def test_every_row_holds_its_estimate_inside_a_proper_interval(form):
    evals = _rising(stop={8: 20_000})
    table = forecast_table(evals, "n", "group", 160_000,
                           settings=ForecastSettings(resamples=20, eval_draws=1600, form=form))
    assert (table["reward_lo"] <= table["reward"]).all() and (table["reward"] <= table["reward_hi"]).all()
    assert (table["reward_hi"] - table["reward_lo"] > 1e-6).all()
    assert (table["d_lo"] <= table["d"]).all() and (table["d"] <= table["d_hi"]).all()
    others = table[table["key"] != table["leader"]]
    assert (others["d_hi"] - others["d_lo"] > 1e-6).all()


def test_a_stopped_key_keeps_its_future():
    # n = 8 stopped at 20,000: its upper bound at C* holds its own level continued at the group's steepest rise
    # past 20,000 (0.05 a doubling here), never its stopping value
    evals = _rising(stop={8: 20_000}, seed=1)
    rows = forecast_group(evals, "n", 160_000, settings=QUICK).set_index("key")
    at_stop = 0.35 + _slope(8) * math.log2(20_000 / 4000)
    assert rows.loc[8, "continued_hi"] >= at_stop + 0.8 * _slope(8) * 3
    assert rows.loc[8, "reward_hi"] >= rows.loc[8, "continued_hi"] - 1e-12
    assert rows.loc[8, "reward_hi"] >= 0.35 + _slope(8) * math.log2(160_000 / 4000)
    assert rows.loc[8, "d_hi"] >= rows.loc[8, "continued_hi"] - rows.loc[rows["leader"].iloc[0], "reward_lo"] - 1e-9
    assert math.isnan(rows.loc[16, "continued_hi"])  # a key trained furthest has nothing beyond its data


def _convex(c: float) -> float:
    """A curve still accelerating in log C: flat to 4,000, then its rise per doubling doubling each doubling."""
    return 0.35 + 0.02 * max(c / 4000 - 1, 0.0)


def test_acceleration_reads_a_growing_rise_and_none_on_a_straight_one():
    cs = [0.0, *(1000 * 2 ** (j / 4) for j in range(22))]
    convex = pd.DataFrame({"c": cs, "avg_at_k": [_convex(c) for c in cs]})
    acc = acceleration(convex, 40_000)
    assert acc is not None and acc.accelerating and acc.last == pytest.approx(2 * acc.before, rel=0.15)
    straight = convex.assign(avg_at_k=[0.35 + 0.05 * max(math.log2(c / 4000), 0) if c else 0.35 for c in cs])
    flat = acceleration(straight, 40_000)
    assert flat is not None and not flat.accelerating and flat.last == pytest.approx(0.05)
    assert acceleration(convex, 1_500) is None  # too few budgets in its last two doublings
    # the bound: each doubling's rise the last one's times the growth, capped at GROWTH_MAX
    assert accelerating_rise(Acceleration(0.02, 0.04, 0.004), 2) == pytest.approx(0.04 * 3 / math.log(2))
    assert accelerating_rise(Acceleration(0.04, 0.04, 0.0), 2) == pytest.approx(0.08)
    assert accelerating_rise(Acceleration(0.01, 0.04, 0.006), 2) == pytest.approx(
        0.04 * (GROWTH_MAX**2 - 1) / math.log(GROWTH_MAX))


def test_a_key_still_accelerating_where_its_data_end_is_not_settled_by_its_last_rise():
    """Science §11.2-11.3: n = 8's rise per doubling doubles each doubling to 40,000 (its level there below the
    others'); continued at its last rise it would be settled at 4x, but its upper bound keeps the growth, so it
    stays open against the leader; the keys rising straight get no such bound."""
    evals = _rising(keys=(2, 4), seed=3)
    rng = np.random.default_rng(4)
    for s in range(2):
        cs = [0.0, *(1000 * 2 ** (j / 4) for j in range(22))]
        evals = pd.concat([evals, pd.DataFrame({"run_id": f"n8_s{s}", "n": 8, "seed": s, "c": cs, "group": "g",
                                                "avg_at_k": [rng.binomial(1600, _convex(c)) / 1600 for c in cs]})])
    rows = forecast_group(evals, "n", 160_000, settings=QUICK).set_index("key")
    lead = int(rows["leader"].iloc[0])
    assert lead in (2, 4)
    grown = 0.35 + 0.02 * 9 + 0.02 * 9 / 2 * 3 / math.log(2) * 0.8  # its level, and about 4.3 x its last rise
    assert rows.loc[8, "continued_hi"] >= grown and rows.loc[8, "reward_hi"] >= rows.loc[8, "continued_hi"] - 1e-12
    assert rows.loc[8, "d_hi"] > 0.02
    assert rows.loc[[2, 4], "continued_hi"].isna().all()


def _mild(c: float, n: int) -> float:
    """A curve whose rise per doubling grows 1.8 x each doubling past 4,000, from 0.01 (a little more for larger n)."""
    d = max(math.log2(c / 4000), 0.0) if c else 0.0
    return 0.35 + 0.01 * (1 + 0.1 * math.log2(n)) * (1.8**d - 1) / math.log(1.8)


def test_keys_that_accelerate_together_keep_their_growth_where_none_reads_it_alone():
    """Science §11.2-11.3 on simulated `rising` (every key convex in log C at C_max): one key's test, on two seeds'
    five budgets a doubling, read 0-2 of 4 keys accelerating per study, so the others were settled on their last
    rise and the search answered n = 2 or 4 where n = 8 wins at C*. Pooled over the group's keys the growth reads
    beyond noise; each key whose rise grows then keeps its growth in its upper bound."""
    # pooled: four keys growing 0.02 a doubling, each at z 1.7, together at z 3.3; keys that bend do not pool up
    growing = [Acceleration(0.02, 0.04, 0.012)] * 4
    assert not any(a.accelerating for a in growing) and group_accelerating(growing)
    assert not group_accelerating([Acceleration(0.04, 0.02, 0.012)] * 3 + [Acceleration(0.02, 0.04, 0.012)])
    assert not group_accelerating([None, None]) and not group_accelerating([])
    rng = np.random.default_rng(23)
    cs = [0.0, *(1000 * 2 ** (j / 4) for j in range(22))]
    evals = pd.DataFrame([{"run_id": f"n{n}_s{s}", "n": n, "seed": s, "c": c, "group": "g",
                           "avg_at_k": rng.binomial(1600, _mild(c, n)) / 1600}
                          for n in (2, 4, 8, 16) for s in range(2) for c in cs])
    accs = [acceleration(evals[evals["n"] == n], max(cs)) for n in (2, 4, 8, 16)]
    assert not any(a.accelerating for a in accs) and group_accelerating(accs)  # no key alone, the group does
    rows = forecast_group(evals, "n", 160_000, settings=QUICK).set_index("key")
    for n, acc in zip((2, 4, 8, 16), accs, strict=True):
        assert acc.last > acc.before > 0
        grown = accelerating_rise(acc, math.log2(160_000 / max(cs)))
        assert grown > acc.last * math.log2(160_000 / max(cs))  # more than its last rise continued
        assert rows.loc[n, "continued_hi"] >= grown + 0.35 and rows.loc[n, "reward_hi"] >= rows.loc[n, "continued_hi"]


def test_the_default_form_follows_a_curve_still_rising_past_its_data():
    evals = _rising(seed=2)
    rows = forecast_group(evals, "n", 160_000, settings=ForecastSettings(resamples=40, eval_draws=1600))
    rows = rows[rows["trained"]].set_index("key")
    truth = pd.Series({n: 0.35 + _slope(n) * math.log2(40) for n in rows.index})
    assert (rows["reward"] - truth).abs().max() < 0.03, (rows["reward"] - truth).to_dict()
    assert ((rows["reward_lo"] <= truth) & (truth <= rows["reward_hi"])).mean() >= 0.75
    assert int(rows["leader"].iloc[0]) == 16


def test_the_ceiling_bounds_every_forecast():
    evals = _rising(seed=3)
    rows = forecast_group(evals, "n", 160_000, settings=ForecastSettings(resamples=10, eval_draws=1600,
                                                                         ceiling=0.55))
    assert (rows["reward_hi"] <= 0.55 + 1e-12).all() and (rows["reward"] <= 0.55 + 1e-12).all()


def test_the_backtest_reads_the_answers_multiple_or_the_largest_it_can():
    evals = _rising(seed=4)  # evaluations from 1,000 to 40,000: 5.3 doublings
    assert cuttable_multiple(evals, "n", 4.0) == 4.0
    assert cuttable_multiple(evals, "n", 64.0) < 64.0
    bt = backtest(evals, "n", QUICK, multiple=64.0)
    assert bt.multiple < 64.0 and "cannot be cut at 1/64" in bt.note
    # the doublings no backtest reached widen the answer's interval further, by 6 over the doublings tested
    untested = untested_factor(64.0, bt.multiple)
    assert untested == pytest.approx(6.0 / math.log2(bt.multiple)) and untested > 1.0
    plain = calibration(bt.keys["error"].to_numpy(float), np.where(
        bt.keys["reached"] >= bt.keys["forecast"], bt.keys["forecast_hi"] - bt.keys["forecast"],
        bt.keys["forecast"] - bt.keys["forecast_lo"]), QUICK.level)
    assert bt.widen == pytest.approx(plain * untested)
    assert f"{untested:.2f}x more for the doublings past" in bt.note, bt.note
    bt4 = backtest(evals, "n", QUICK, multiple=4.0)
    assert bt4.multiple == 4.0 and (bt4.keys["c_cut"] <= 10_000 * (1 + 1e-9)).all()
    assert math.isfinite(bt4.rmse) and bt4.widen >= 1.0
    assert untested_factor(4.0, bt4.multiple) == 1.0 and "no backtest reached" not in bt4.note


def test_calibration_widens_until_the_backtests_errors_are_covered():
    assert calibration(np.array([0.01, -0.02]), np.array([0.05, 0.05]), 0.95) == 1.0  # covered: never narrows
    # five keys: the conformal rank ceil(6 x 0.95) = 6 > 5 takes the largest ratio
    assert calibration(np.array([0.01, 0.02, -0.03, 0.1, 0.0]), np.full(5, 0.05), 0.95) == pytest.approx(2.0)
    assert calibration(np.array([math.nan]), np.array([0.05]), 0.95) == 1.0


def test_d_is_calibrated_on_its_own_errors_a_shared_bend_widens_the_rewards_not_their_differences():
    """Three keys whose curves all bend up past the cut by the same amount: the backtest's reward errors are large
    and shared (widen ~4), D's errors small (widen_d 1); with one key bending alone, D's widen too."""
    rng = np.random.default_rng(0)
    noise = rng.normal(0, 0.004, (3, 2, 22))
    offset = {2: 0.0, 4: 0.03, 8: 0.015}

    def reward(bend: dict[int, float]):
        keys = list(offset)
        return lambda n, s, i: (0.3 + offset[n] + 0.008 * i + bend[n] * max(0, i - 11) ** 2
                                + noise[keys.index(n), s, i])

    # the split is the backtest's, whatever the form; with one rise for the group (`recent`) a shared bend's errors
    # are wholly shared (the default, `recent_floor`, keeps a steeper key's own rise: part of a shared bend reads as
    # its own)
    one_rise = replace(QUICK, form="recent")
    shared = backtest(_evals(21, reward({2: 8e-4, 4: 8e-4, 8: 8e-4}), keys=(2, 4, 8)), "n", one_rise, multiple=4.0)
    assert shared.widen > 2.0 and shared.widen_d < 1.5, (shared.widen, shared.widen_d)
    assert "D to the leader" in shared.note
    alone = backtest(_evals(21, reward({2: 8e-4, 4: 0.0, 8: 0.0}), keys=(2, 4, 8)), "n", one_rise, multiple=4.0)
    assert alone.widen_d > 1.5, (alone.widen, alone.widen_d)


def test_pass_at_k_is_chen_et_als_unbiased_estimator():
    # one problem, 4 samples, 1 correct: pass@1 = 1/4, pass@2 = 1 - C(3,2)/C(4,2) = 1/2, pass@4 = 1
    assert pass_at_k(np.array([4]), np.array([1]), 1) == pytest.approx(0.25)
    assert pass_at_k(np.array([4]), np.array([1]), 2) == pytest.approx(0.5)
    assert pass_at_k(np.array([4, 4]), np.array([1, 0]), 4) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="pass@k"):
        pass_at_k(np.array([4]), np.array([1]), 5)



LIFT = {2: 0.03, 4: 0.02, 8: 0.01, 16: 0.0}


def _steepening(seed: int, bend: float = 0.0, early: float = 0.02) -> pd.DataFrame:
    """Four keys leaving R0 = 0.35 at 2,500 slowly (``early`` a doubling to 10,000), then rising 0.06 a doubling
    (the long grids' shape, science §11.1); ``bend``: every rise falling by e^-bend a doubling from 2,500;
    levels 0.01 apart by key, avg@16 noise of 100 problems; runs to 40,000."""
    rng = np.random.default_rng(seed)
    rows = []
    for n, lift in LIFT.items():
        for s in range(2):
            for c in [0.0, *(2500 * 2 ** (j / 4) for j in range(17))]:
                rows.append({"run_id": f"n{n}_s{s}", "n": n, "seed": s, "c": c,
                             "avg_at_k": rng.binomial(1600, _steep(c, bend, early) + lift) / 1600, "group": "g"})
    return pd.DataFrame(rows)


def _steep(c: float, bend: float = 0.0, early: float = 0.02) -> float:
    t = math.log2(max(c, 2500) / 2500)
    rises = np.array([early, early, *[0.06] * 8]) * np.exp(-bend * np.arange(10))  # a doubling each, from 2,500
    whole = int(min(t, 10))
    return 0.35 + float(rises[:whole].sum()) + (t - whole) * float(rises[min(whole, 9)])


def _truth(bend: float = 0.0, early: float = 0.02) -> pd.Series:
    return pd.Series({n: _steep(160_000, bend, early) + lift for n, lift in LIFT.items()})


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_recent_reads_the_rise_where_the_data_end_and_decay_is_pulled_down_by_the_start(seed):
    """On curves whose rise per doubling grows as they leave their early regime, ``recent`` forecasts 4x past the
    data within 0.03 of the truth, every key inside its interval; the line through the whole shape (``decay``)
    is low."""
    evals, truth = _steepening(seed), _truth()
    errors = {}
    for form in ("recent", "decay"):
        rows = forecast_group(evals, "n", 160_000, settings=ForecastSettings(resamples=20, eval_draws=1600,
                                                                             form=form))
        rows = rows[rows["trained"]].set_index("key")
        errors[form] = rows["reward"] - truth
        if form == "recent":
            assert ((rows["reward_lo"] <= truth) & (truth <= rows["reward_hi"])).all(), rows
            assert int(rows["leader"].iloc[0]) == 2
    assert errors["recent"].abs().max() < 0.03, errors["recent"].to_dict()
    assert errors["decay"].mean() < -0.04, errors["decay"].to_dict()


@pytest.mark.parametrize("seed", [0, 1])
def test_recent_follows_a_bend_the_whole_shape_shows(seed):
    """Curves whose rise per doubling falls by e^-0.4 each doubling from their start: the bend is read on the
    whole shape, so ``recent`` is within 0.015 of the truth 4x past the data, where the last rise continued
    unchanged (the same window and pooling, the bend held at 0) is high by more than 0.015."""
    evals, truth = _steepening(seed, bend=0.4, early=0.06), _truth(bend=0.4, early=0.06)
    errors = {}
    for form, lam_max in (("recent", None), ("unbent", 0.0)):
        settings = ForecastSettings(resamples=20, eval_draws=1600, form="recent")
        if lam_max is None:
            rows = forecast_group(evals, "n", 160_000, settings=settings)
        else:  # the same window and pooling with the bend held at 0
            from rollscale.core.fit.forms import recent
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(recent, "LAMBDA_MAX", 0.0)
                rows = forecast_group(evals, "n", 160_000, settings=settings)
        rows = rows[rows["trained"]].set_index("key")
        errors[form] = rows["reward"] - truth
    assert errors["recent"].abs().max() < 0.015, errors["recent"].to_dict()
    assert errors["unbent"].mean() > 0.015, errors["unbent"].to_dict()


# per key, from R0 = 0.35 at 2,500: (where its rise starts, its rise a doubling there, its fall e^-fall a doubling):
# n = 2 bends toward a ceiling, n = 4 rises as the group, n = 8 slower, n = 16 starts late and steeper (a late
# winner: below n = 4 at 40,000, above it at 160,000)
FLOOR_KEYS = {2: (2500, 0.10, 0.9), 4: (2500, 0.04, 0.0), 8: (2500, 0.01, 0.0), 16: (10_000, 0.075, 0.0)}


def _floor_curve(n: int, c: float) -> float:
    start, rise, fall = FLOOR_KEYS[n]
    t = math.log2(max(c, start) / start)
    return 0.35 + rise * (t if fall == 0 else -math.expm1(-fall * t) / fall)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_recent_floor_keeps_a_steeper_keys_own_rise_lifts_a_slower_one_and_not_a_bending_one(seed):
    """``recent_floor`` (the default): the key rising faster than the group keeps its own rise (n = 16 within
    0.04 of the truth 4x past the data, its own rise read on 1.5 doublings of 2 seeds, and the leader, where one
    shared rise, ``recent``, leaves it low by more than 0.06); a key rising slower than the group is lifted towards
    the group's rise (n = 8 above its own line); a key whose own data bend keeps its own bend (n = 2 within 0.02)."""
    rng = np.random.default_rng(seed)
    rows = [{"run_id": f"n{n}_s{s}", "n": n, "seed": s, "c": c,
             "avg_at_k": rng.binomial(1600, _floor_curve(n, c)) / 1600}
            for n in FLOOR_KEYS for s in range(2) for c in [0.0, *(2500 * 2 ** (j / 4) for j in range(17))]]
    evals = pd.DataFrame(rows)
    forecast = {form: forecast_group(evals, "n", 160_000, settings=ForecastSettings(resamples=20, eval_draws=1600,
                                                                                    form=form))
                .query("trained").set_index("key") for form in ("recent_floor", "recent")}
    floor, shared = forecast["recent_floor"]["reward"], forecast["recent"]["reward"]
    truth = pd.Series({n: _floor_curve(n, 160_000) for n in FLOOR_KEYS})
    assert abs(floor[16] - truth[16]) < 0.04 and shared[16] < truth[16] - 0.06, (floor.to_dict(), shared.to_dict(),
                                                                                  truth.to_dict())
    assert int(forecast["recent_floor"]["leader"].iloc[0]) == 16
    assert floor[8] > truth[8] + 0.02, (floor.to_dict(), truth.to_dict())
    assert abs(floor[2] - truth[2]) < 0.02, (floor.to_dict(), truth.to_dict())
