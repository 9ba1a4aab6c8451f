"""An average of forms weighted by each one's backtest (science §11.2, §11.4): the ``averaged`` form.

Each candidate (:data:`CANDIDATES`: the rise per doubling that can only decay, and §10.1's sigmoid in log C) is
fitted on the group's evaluations with its refits, and backtested on the same evaluations at the answer's
multiple m (``FormSettings.multiple``): every run cut at 1 / m of its budget, the candidate fitted on what is
left and each key's reward forecast where its runs end (:func:`rollscale.core.fit.backtest.backtest`, which
tests the largest multiple the runs can cut where m is more). A candidate weighs ``1 / RMSE^2`` of its backtest
(inverse mean squared error, Bates & Granger 1969), its RMSE floored at :data:`ERROR_FLOOR`: a backtest of a few
keys does not tell apart errors below one evaluation's noise, and one lucky candidate would otherwise take all
the weight. A candidate whose fit or backtest fails weighs nothing; where no candidate has a backtest error the
weights are equal. The point is the weighted mean of the candidates' points, each refit the weighted mean of the
candidates' refits of the same index (the interval is read from these), the weights held over the refits.

A form of :mod:`rollscale.core.fit.forms`'s registry that sits above the forecast and its backtest (it fits them),
so it is not in that package (whose forms the forecast imports: an import cycle): it registers when imported. It
is a candidate scored on the test bed (``benchmarks/long_grid.py --score``), not a ``study.forecast_form`` a study
may name (the config reads the forms package's names), so the fit stage, the search and track do not import it:
an edit here reruns no stage.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from rollscale.core.fit.backtest import backtest
from rollscale.core.fit.forecast import ForecastSettings, SurfaceBootstrap, bootstrap_surface, predict, same_runs
from rollscale.core.fit.forms import FittedForm, FormSettings, fit_form, register
from rollscale.core.fit.surface import SurfaceData, evals_of

__all__ = ["CANDIDATES", "ERROR_FLOOR", "AveragedForm", "backtest_weights", "fit_averaged"]

CANDIDATES = ("decay", "surface")
ERROR_FLOOR = 0.0125  # one avg@16 evaluation's standard error over 100 problems at a reward of 0.5
_WEIGHT_RESAMPLES = 2  # the weights read the backtest's point errors only: its refits are not used
_KEY = "key"


@dataclass(frozen=True)
class AveragedForm:
    names: tuple[str, ...]
    fits: tuple[FittedForm, ...]
    weights: np.ndarray  # (len(fits),) summing to 1
    rmse: np.ndarray  # (len(fits),) each candidate's backtest RMSE (NaN: none)

    def predict(self, keys: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        parts = [fit.predict(keys, c) for fit in self.fits]
        point = sum(w * p for w, (p, _) in zip(self.weights, parts, strict=True))
        refits = sum(w * r for w, (_, r) in zip(self.weights, parts, strict=True))
        return np.asarray(point), np.asarray(refits)


def backtest_weights(rmse: np.ndarray) -> np.ndarray:
    """Inverse-MSE weights of the candidates' backtest RMSEs (module docstring), summing to 1."""
    rmse = np.asarray(rmse, float)
    known = np.isfinite(rmse)
    if not known.any():
        return np.full(rmse.size, 1.0 / rmse.size)
    w = np.where(known, 1.0 / np.maximum(np.where(known, rmse, 1.0), ERROR_FLOOR) ** 2, 0.0)
    return w / w.sum()


class _Boot:
    """A candidate fitted through the forecast's own bootstrap (§10.1's surface is not a registered form)."""

    def __init__(self, boot: SurfaceBootstrap) -> None:
        self.boot = boot

    def predict(self, keys: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return predict(self.boot, keys, c)


def _candidate(name: str, data: SurfaceData, settings: FormSettings, evals: pd.DataFrame
               ) -> tuple[FittedForm, float]:
    """``name`` fitted on ``data`` and its backtest's RMSE at ``settings.multiple`` (NaN: no error to read)."""
    top = settings.ceiling if math.isfinite(settings.ceiling) else None
    fs = ForecastSettings(resamples=settings.resamples, eval_draws=settings.eval_draws, seed=settings.seed,
                          a_max=top, form=name, multiple=settings.multiple)
    if name == "surface":
        boot = bootstrap_surface(evals, _KEY, fs)
        if boot.reason:
            raise ValueError(boot.reason)
        fit: FittedForm = _Boot(boot if settings.resample_runs else same_runs(boot))
    else:
        fit = fit_form(name, data, settings)
    bt = backtest(evals, _KEY, replace(fs, resamples=_WEIGHT_RESAMPLES), multiple=settings.multiple)
    return fit, bt.rmse


@register("averaged")
def fit_averaged(data: SurfaceData, settings: FormSettings) -> AveragedForm:
    """The ``averaged`` form (module docstring)."""
    evals = evals_of(data, _KEY)
    names, fits, rmse, why = [], [], [], []
    for name in CANDIDATES:
        try:
            fit, err = _candidate(name, data, settings, evals)
        except (ValueError, RuntimeError, np.linalg.LinAlgError) as e:
            why.append(f"{name}: {e}")
            continue
        names.append(name)
        fits.append(fit)
        rmse.append(err)
    if not fits:
        raise ValueError("averaged form: no candidate could be fitted (" + "; ".join(why) + ")")
    return AveragedForm(tuple(names), tuple(fits), backtest_weights(np.array(rmse)), np.array(rmse))
