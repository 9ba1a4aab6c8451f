"""``sweep.search.method: grid``: every run of the grid trains alone to C_max; no rungs, no decisions (the
``search`` table stays empty), the fit stage decides at C* from every run (science §9.3)."""

from __future__ import annotations

from rollscale.core.search.methods.base import SearchMethod
from rollscale.registry import SEARCH_METHODS


@SEARCH_METHODS.register("grid")
class Grid(SearchMethod):
    """Every run to C_max (module docstring)."""

    name = "grid"
    searches = False
    words = "grid"
