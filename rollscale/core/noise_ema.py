"""EMA smoothing of the noise-scale numerators and denominator over steps (science §6.2).

McCandlish et al. advise averaging the noise power and ``|G|^2_hat`` over
steps before dividing, because the ratio of noisy pieces is unstable; the
per-step values are reported beside the smoothed ones.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["EmaNoiseScale"]


class EmaNoiseScale:
    """Bias-corrected EMAs of the §6.2 pieces, smoothed apart, and their ratios.

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
        self._prompt = math.nan  # prompt-axis noise power s_P_hat
        self._rollout = math.nan  # rollout-axis noise power mean_p w_p
        self._weight = 0.0  # 1 - decay**steps
        self.steps = 0

    def _fold(self, old: float, new: float, a: float) -> float:
        return float(new) if (a == 1.0 or not math.isfinite(old)) else old + a * (float(new) - old)

    def update(
        self, trace_sigma: float, g_norm2: float,
        prompt_noise_power: float | None = None, rollout_noise_power: float | None = None,
    ) -> float:
        """Fold in one step's pieces; return the smoothed B_simple.

        The axis noise powers are optional (the smoothed axis ratios stay NaN
        until they are given).
        """
        pieces = [trace_sigma, g_norm2, *(v for v in (prompt_noise_power, rollout_noise_power) if v is not None)]
        if not all(math.isfinite(v) for v in pieces):
            raise ValueError("trace_sigma, g_norm2, noise powers: expected finite numbers")
        d = self.decay
        self._weight = d * self._weight + (1.0 - d)
        a = (1.0 - d) / self._weight
        self._num = self._fold(self._num, trace_sigma, a)
        self._den = self._fold(self._den, g_norm2, a)
        if prompt_noise_power is not None:
            self._prompt = self._fold(self._prompt, prompt_noise_power, a)
        if rollout_noise_power is not None:
            self._rollout = self._fold(self._rollout, rollout_noise_power, a)
        self.steps += 1
        return self.value

    def update_decomposition(self, dec: Any) -> dict[str, float]:
        """Fold in a :class:`~rollscale.core.noise.NoiseDecomposition`; the smoothed ratios by column name."""
        self.update(dec.trace_sigma, dec.g_norm2, dec.prompt_noise_power, dec.rollout_noise_power)
        return {"b_simple_ema": self.value, "prompt_noise_ema": self.prompt_noise, "rollout_noise_ema": self.rollout_noise}

    def update_gram(self, gram: np.ndarray, groups: np.ndarray) -> float:
        """:meth:`update` with the pieces estimated from one step's Gram matrix and prompt labels."""
        from rollscale.core.noise import decompose, g_norm2, trace_sigma  # noise imports this module

        if len(np.unique(groups)) >= 2 and np.min(np.unique(groups, return_counts=True)[1]) >= 2:
            self.update_decomposition(decompose(gram, groups))
            return self.value
        return self.update(trace_sigma(gram, groups), g_norm2(gram, groups))

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
        return self._smoothed(self._num)

    @property
    def prompt_noise(self) -> float:
        """Smoothed prompt-axis B_noise (NaN until a prompt noise power is given)."""
        return self._smoothed(self._prompt)

    @property
    def rollout_noise(self) -> float:
        """Smoothed rollout-axis noise scale (NaN until a rollout noise power is given)."""
        return self._smoothed(self._rollout)

    def _smoothed(self, num: float) -> float:
        if not self.steps or math.isnan(num):
            return math.nan
        return math.inf if self._den <= 0.0 else num / self._den
