"""A run's data order (science §1): a permutation of the D training problems seeded by
``(seed, epoch)`` and reshuffled every epoch, so a resumed run draws what the straight run would."""

from __future__ import annotations

import numpy as np

from rollscale.core.seeds import seeded_rng


class DataOrder:
    """Problem indices by position in the run's stream of drawn prompts."""

    def __init__(self, n_problems: int, seed: int, purpose: int) -> None:
        self.n_problems, self.seed, self.purpose = n_problems, seed, purpose
        self._epoch, self._perm = -1, np.empty(0, dtype=np.int64)

    def indices(self, position: int, k: int) -> list[int]:
        """Indices at positions ``position .. position + k - 1``."""
        out = []
        for pos in range(position, position + k):
            epoch, i = divmod(pos, self.n_problems)
            if epoch != self._epoch:
                rng = seeded_rng(self.seed, self.purpose, epoch)
                self._epoch, self._perm = epoch, rng.permutation(self.n_problems)
            out.append(int(self._perm[i]))
        return out
