"""A search axis's bracket: the smallest and largest key the recipe can train (science §9.4, §11.6); read by the
fit's verdict (:func:`rollscale.core.fit.verdict.trainable`) and the search (:mod:`rollscale.core.search.state`)."""

from __future__ import annotations


def bracket_limits(axis: str, fixed: int | None, b_max: int, key_min: int | None = None,
                   key_max: int | None = None) -> tuple[int | None, int | None]:
    """The bracket's (smallest, largest) key: params win; else n >= 2 up to b_max / B_problem (rollout axis,
    ``fixed`` = B_problem), B_problem >= 1 up to b_max / n (prompt axis, ``fixed`` = n), n >= 2 up to B
    (iso-batch, ``fixed`` = B); rules have no bracket."""
    if axis == "rule":
        return None, None
    if fixed is None or fixed < 1:
        raise ValueError(f"bracket_limits: axis {axis!r} needs the fixed value, got {fixed!r}")
    low = {"rollout": 2, "prompt": 1, "iso_batch": 2}[axis]
    high = fixed if axis == "iso_batch" else b_max // fixed
    return (key_min if key_min is not None else low), (key_max if key_max is not None else high)
