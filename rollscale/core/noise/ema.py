"""EMA smoothing of the noise-scale numerators and denominator over steps (science §6.2).

McCandlish et al. advise averaging the noise power and ``|G|^2_hat`` over
steps before dividing, because the ratio of noisy pieces is unstable; the
per-step values are reported beside the smoothed ones.
"""

from __future__ import annotations

import math

__all__ = ["EmaNoiseScale"]


class EmaNoiseScale:
    """Bias-corrected EMAs of the two pieces of B_simple (science §6.2), smoothed apart, and their ratio.

    Each piece is kept in the incremental form ``x_t = x_{t-1} + a_t (v_t -
    x_{t-1})`` with ``a_t = (1 - d) / (1 - d^t)``: the Adam-style bias-corrected
    EMA, which after one step is exactly that step's value (``a_1 = 1``), so
    the smoothed B_simple of step one equals the step's own. Plain float
    attributes, so ``vars()`` of it is a checkpointable state.

    >>> ema = EmaNoiseScale(decay=0.9)
    >>> ema.update(trace_sigma=4.0, g_norm2=2.0)
    2.0
    """

    def __init__(self, decay: float) -> None:
        if not (0.0 <= decay < 1.0):
            raise ValueError(f"decay: expected a number in [0, 1), got {decay!r}")
        self.decay = float(decay)
        self._num = 0.0  # per-rollout noise power s_hat
        self._den = 0.0  # between-prompt |G|^2_hat
        self._weight = 0.0  # 1 - decay**steps
        self.steps = 0

    @staticmethod
    def _fold(old: float, new: float, a: float) -> float:
        return float(new) if a == 1.0 else old + a * (float(new) - old)

    def update(self, trace_sigma: float, g_norm2: float) -> float:
        """Fold in one step's pieces; return the smoothed B_simple."""
        if not (math.isfinite(trace_sigma) and math.isfinite(g_norm2)):
            raise ValueError("trace_sigma, g_norm2: expected finite numbers")
        d = self.decay
        self._weight = d * self._weight + (1.0 - d)
        a = (1.0 - d) / self._weight
        self._num = self._fold(self._num, trace_sigma, a)
        self._den = self._fold(self._den, g_norm2, a)
        self.steps += 1
        return self.value

    @property
    def trace_sigma(self) -> float:
        """Smoothed per-rollout noise power (NaN before the first update)."""
        return self._num if self.steps else math.nan

    @property
    def g_norm2(self) -> float:
        """Smoothed between-prompt |G|^2 (NaN before the first update)."""
        return self._den if self.steps else math.nan

    @property
    def value(self) -> float:
        """Smoothed B_simple; NaN before the first update, inf if |G|^2 <= 0."""
        if not self.steps:
            return math.nan
        return math.inf if self._den <= 0.0 else self._num / self._den
