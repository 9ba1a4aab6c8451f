"""The rise per doubling where the data end, pooled over keys (science §11.2): the ``recent`` forms.

The model is :mod:`~rollscale.core.fit.forms.decay`'s, ``R_k(C) = L_k + s h(log2 C - u_k)``, read differently:

- **Where the data end.** Each key's level ``L_k`` and the rise per doubling ``s`` are read on its last
  :data:`WINDOW` doublings of evaluations only. The long grids' curves rise faster per doubling as they leave
  their early regime (the default base's n = 2: +0.03, +0.05, +0.04 from 5,000 to 40,000, then +0.07, +0.05), so
  a line through the whole shape, ``decay``'s, is pulled down by its flatter start: low by 0.04 at 4x on the
  long grids together, every key low on the second base.
- **One rise per doubling.** ``s`` is shared by the group's keys (each keeps its own level): one key's one
  doubling of two seeds does not pin its own slope (its own, ``rise="own"``, scattered 2-3x as
  wide on the long grids), and the grids' keys rise alike past 40,000 (+0.04 to +0.07 a doubling).
- **A bend only where the data show one.** ``lambda`` is read on each key's whole shape (past its early regime,
  decay's F test at 95 %) and applied to the continuation; 0 (the rise continued unchanged) unless the data bend
  beyond noise. A ceiling is never read from where the data stop; every prediction is capped by the base's
  pass@k where known.

``recent_short`` and ``recent_long`` read 1 and 2 doublings: the window is a candidate setting, chosen with the
form leave-one-grid-out (``benchmarks/long_grid.py --score``; docs/benchmarks.md, "The search and the forecast,
simulated").

``recent_floor``: the group's rise per doubling is a floor, not each key's rise. Each key keeps its own rise
where the data end when that is steeper, and its own bend (its own F test on its whole shape): a key that
overtakes late shows it as a steeper rise inside the data (simulated ``cross``: where the key leading at C_max
is not the best at C*, the best rose 1.5-2.1x as fast over the doubling before C_max), which one shared rise
erases; a key rising slower than the group is lifted to it (the second base's n = 16 and 32 rose at 0.016-0.019
a doubling at 20,000 against the others' 0.038-0.045, and at 0.045 and 0.032 by 160,000); a key whose own data
bend is not lifted (a curve near its ceiling). On the long grids no key's data bend, so there it reads as
``recent`` with the steeper keys' own rises.
"""

from __future__ import annotations

from rollscale.core.fit.forms import FormSettings, register
from rollscale.core.fit.forms.decay import LAMBDA_MAX, DecayForm, fit_shape
from rollscale.core.fit.surface import SurfaceData

__all__ = ["WINDOW", "fit_recent", "fit_recent_floor", "fit_recent_long", "fit_recent_short"]

WINDOW = 1.5  # doublings of each key's data its level and the rise per doubling are read on


@register("recent")
def fit_recent(data: SurfaceData, settings: FormSettings) -> DecayForm:
    """The ``recent`` form (module docstring)."""
    return fit_shape(data, settings, LAMBDA_MAX, window=WINDOW, rise="pooled")


@register("recent_short")
def fit_recent_short(data: SurfaceData, settings: FormSettings) -> DecayForm:
    """``recent`` on each key's last doubling."""
    return fit_shape(data, settings, LAMBDA_MAX, window=1.0, rise="pooled")


@register("recent_long")
def fit_recent_long(data: SurfaceData, settings: FormSettings) -> DecayForm:
    """``recent`` on each key's last two doublings."""
    return fit_shape(data, settings, LAMBDA_MAX, window=2.0, rise="pooled")


@register("recent_floor")
def fit_recent_floor(data: SurfaceData, settings: FormSettings) -> DecayForm:
    """``recent`` with the group's rise a floor and each key's own bend (module docstring)."""
    return fit_shape(data, settings, LAMBDA_MAX, per_key=True, window=WINDOW, rise="floor")
