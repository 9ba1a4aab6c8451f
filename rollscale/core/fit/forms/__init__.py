"""The forecast's candidate shapes (science §11.2): a registry, one module a form.

A form is fitted on one design group's evaluations (:class:`rollscale.core.fit.surface.SurfaceData`) with its
bootstrap refits, and predicts any key's reward at any budget: :meth:`FittedForm.predict` returns the point and
the refits, from which :mod:`rollscale.core.fit.forecast` reads the interval. Adding a form is one module that
calls :func:`register` (the form's name is its module's: :data:`rollscale.registry.FORECAST_FORMS` reads the names
from this folder when params are validated). The study's form is ``study.forecast_form``, whose default,
:data:`DEFAULT_FORM`, is set there with its reason (the forms are scored on the test bed: ``benchmarks/long_grid.py
--score``; docs/benchmarks.md, "The search and the forecast, simulated").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from rollscale.config import DecisionParams
from rollscale.core.fit.surface import SurfaceData
from rollscale.registry import FORECAST_FORMS

__all__ = ["DEFAULT_FORM", "FORMS", "FittedForm", "FormSettings", "fit_form", "register"]


@dataclass(frozen=True)
class FormSettings:
    """What every form's fit reads: ``resamples`` refits, ``eval_draws`` the 0/1 samples behind one evaluation
    (None: no noise redrawn), ``seed``, and ``ceiling`` the reward no key can pass (the base's pass@k on the
    validation problems where the profile gives it, else the reward's cap)."""

    resamples: int
    eval_draws: int | None
    seed: int
    ceiling: float
    resample_runs: bool = True  # False: every run kept once (the backtest's refits of the same runs)
    multiple: float = 2.0  # the answer's multiple C* / c_max (science §11.4): a form that backtests itself cuts there


class FittedForm(Protocol):
    def predict(self, keys: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(point (n,), refits (resamples, n))``: the reward of ``keys[i]`` at ``c[i]``."""
        ...


FormFit = Callable[[SurfaceData, FormSettings], FittedForm]
FORMS: dict[str, FormFit] = {}
DEFAULT_FORM: str = DecisionParams.model_fields["forecast_form"].default  # its one place: the config field


def register(name: str) -> Callable[[FormFit], FormFit]:
    def add(fit: FormFit) -> FormFit:
        FORMS[name] = fit
        return FORECAST_FORMS.register(name)(fit)
    return add


def fit_form(name: str, data: SurfaceData, settings: FormSettings) -> FittedForm:
    """Fit the registered form ``name`` (a clear error naming the forms when it is not one)."""
    if name not in FORMS:
        raise ValueError(f"forecast form: unknown {name!r} (one of {', '.join(sorted(FORMS))})")
    return FORMS[name](data, settings)


from rollscale.core.fit.forms import decay as _decay  # noqa: E402,F401  (registers its form)
from rollscale.core.fit.forms import recent as _recent  # noqa: E402,F401  (registers its forms)
