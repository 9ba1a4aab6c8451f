"""One seed derivation for the engines, the trainer and the data order (rollscale.core.seeds)."""

from __future__ import annotations

import numpy as np
import pytest

from rollscale.core.seeds import derive_seed, seeded_rng


@pytest.mark.parametrize("parts", [(0,), (1, 2, 3, 4), (7, 0, 0, 0), (123456789, 1, 99, 5), (2**63 + 5, 3)])
def test_derive_seed_keeps_the_numbers_of_earlier_studies(parts):
    # the engines' per-request seeds: the 64-bit hash word, halved into int64's range
    assert derive_seed(*parts) == int(np.random.SeedSequence(list(parts)).generate_state(1, np.uint64)[0] >> 1)
    # the trainer's step and call seeds: the first 32-bit word of the same hash
    assert derive_seed(*parts, bits=32) == int(np.random.SeedSequence(list(parts)).generate_state(1)[0])
    assert 0 <= derive_seed(*parts) < 2**63 and 0 <= derive_seed(*parts, bits=32) < 2**32


def test_seeded_rng_is_the_data_orders_generator():
    expected = np.random.default_rng(np.random.SeedSequence([3, 0, 2])).permutation(50)
    assert np.array_equal(seeded_rng(3, 0, 2).permutation(50), expected)
    assert not np.array_equal(seeded_rng(3, 0, 3).permutation(50), expected)  # the next epoch reshuffles


def test_derive_seed_refuses_other_widths():
    with pytest.raises(ValueError, match="bits: expected 32 or 63"):
        derive_seed(1, 2, bits=16)
