"""The average of forms weighted by each one's backtest (science §11.2, §11.4): rollscale.core.fit.averaged."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from rollscale.core.fit.forecast import ForecastSettings, forecast_group
from rollscale.core.fit import averaged as averaged_form
from rollscale.core.fit.averaged import ERROR_FLOOR, backtest_weights
from rollscale.core.fit.forms import FormSettings, fit_form
from rollscale.core.fit.surface import evals_of, prepare

DECAY = 0.6  # the true curves' rise per doubling falls by e^-0.6 (to 55 %) each doubling
RISE = 0.08


def _bending(seed: int = 0, keys=(2, 4, 8, 16), seeds=2) -> pd.DataFrame:
    """Curves whose rise per doubling decays (the ``decay`` form's own shape, lambda = :data:`DECAY`) from 1,000
    to 40,000 rollouts, avg@16 over 100 problems: the ``linear`` form, its rise held, overshoots past the data."""
    rng = np.random.default_rng(seed)
    rows = []
    for n in keys:
        for s in range(seeds):
            for c in [0.0, *(1000 * 2 ** (j / 4) for j in range(22))]:
                t = math.log2(c / 1000) if c else 0.0
                p = 0.3 + RISE * (1 + 0.1 * math.log2(n)) * -math.expm1(-DECAY * t) / DECAY
                rows.append({"run_id": f"n{n}_s{s}", "n": n, "seed": s, "c": c,
                             "avg_at_k": rng.binomial(1600, p) / 1600})
    return pd.DataFrame(rows)


def _true(n: int, c: float) -> float:
    return 0.3 + RISE * (1 + 0.1 * math.log2(n)) * -math.expm1(-DECAY * math.log2(c / 1000)) / DECAY


def test_weights_are_inverse_mean_squared_error_floored_and_sum_to_one():
    assert backtest_weights(np.array([0.02, 0.04])) == pytest.approx([0.8, 0.2])  # 1/0.0004 : 1/0.0016
    # below the floor errors are not told apart
    assert backtest_weights(np.array([ERROR_FLOOR / 10, ERROR_FLOOR])) == pytest.approx([0.5, 0.5])
    assert backtest_weights(np.array([math.nan, 0.03])) == pytest.approx([0.0, 1.0])  # no backtest: no weight
    assert backtest_weights(np.array([math.nan, math.nan])) == pytest.approx([0.5, 0.5])


def test_the_evaluations_come_back_from_the_prepared_arrays():
    evals = _bending()
    data = prepare(evals, "n")
    again = prepare(evals_of(data, "n"), "n")
    for field in ("keys", "run_key", "slot", "reach", "step0"):
        assert np.allclose(getattr(again, field), getattr(data, field), equal_nan=True), field
    # the same points, in the runs' order (the original run ids, which ordered them, are not kept)
    order, order_again = (np.lexsort((d.log10_c, d.point_run)) for d in (data, again))
    for field in ("point_run", "log10_c", "y"):
        assert np.allclose(getattr(again, field)[order_again], getattr(data, field)[order]), field


def test_the_weights_favour_the_form_whose_backtest_errs_less(monkeypatch):
    """Curves that bend as ``decay`` says: its backtest (runs cut at a quarter, forecast 4x) errs less than
    ``linear``'s, so it takes most of the weight and the average follows it past the data."""
    monkeypatch.setattr(averaged_form, "CANDIDATES", ("decay", "linear"))
    evals = _bending(seed=1)
    data = prepare(evals, "n")
    settings = FormSettings(resamples=8, eval_draws=1600, seed=0, ceiling=1.0, multiple=4.0)
    form = fit_form("averaged", data, settings)
    assert form.names == ("decay", "linear")
    assert form.rmse[0] < form.rmse[1] / 2, form.rmse
    assert form.weights[0] > 0.8 and form.weights.sum() == pytest.approx(1.0), form.weights
    keys, c = data.keys, np.full(data.keys.size, 160_000.0)
    point, refits = form.predict(keys, c)
    decay, linear = (fit_form(name, data, settings).predict(keys, c)[0] for name in ("decay", "linear"))
    truth = np.array([_true(int(k), 160_000.0) for k in keys])
    assert np.abs(point - truth).mean() < np.abs(linear - truth).mean()
    assert np.abs(point - decay).max() < np.abs(point - linear).max()
    assert refits.shape == (8, keys.size)


def test_the_averaged_forecast_reads_an_interval_around_its_point():
    """The default candidates (the §10.1 surface among them): a forecast table at 4x whose every trained key's
    interval holds its point."""
    evals = _bending(seed=2, keys=(2, 4, 8))
    settings = ForecastSettings(resamples=10, eval_draws=1600, form="averaged").at_answer(evals, 160_000)
    assert settings.multiple == pytest.approx(160_000 / evals["c"].max())  # the runs end at 38,054
    rows = forecast_group(evals, "n", 160_000, settings=settings)
    trained = rows[rows["trained"]]
    assert (trained["reason"] == "").all() and trained["reward"].notna().all()
    assert ((trained["reward_lo"] <= trained["reward"]) & (trained["reward"] <= trained["reward_hi"])).all()
    assert (trained["form"] == "averaged").all()
