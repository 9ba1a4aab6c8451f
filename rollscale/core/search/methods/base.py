"""What every search method is (``sweep.search.method``): :class:`SearchMethod`, registered by name in
:data:`rollscale.registry.SEARCH_METHODS` (one module of this package each).

The loop is the same for every method (:class:`rollscale.sweep.rungs.SweepSearch`: plan, train each run to
its next budget, decide, repeat; :mod:`rollscale.core.search.state` keeps the rungs): a method says which
seeds a key starts with and makes the decisions after each rung, as rows of the ``search`` table
(:data:`rollscale.core.search.state.DECISION_COLUMNS`). A method that does not search (the grid) trains
every run alone to C_max and decides nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    import pandas as pd

    from rollscale.config import SearchParams
    from rollscale.core.search.state import GroupState, SearchGroup, SearchSettings

__all__ = ["SearchMethod"]


class SearchMethod:
    """One way the sweep spends its rollouts (science §9.4 for ``decision``).

    ``searches``: False for a method that trains every run to C_max with no rungs (then nothing below is
    asked); ``adds_seeds``: keys start with ``sweep.search.seeds_min`` seeds and gain seeds up to ``seeds_max``
    where the decision hangs (what ``rollscale check`` and ``init --hours`` count); ``words``: how the sweep's
    log and the report name it ("search to the decision at C* (science §9.4)").

    ``starts_with``: the ``sweep.search`` setting that says how many of the sweep's seeds each key starts with
    (None: all of them). Params validation asks it of the method's module without importing it
    (:meth:`rollscale.registry.Registry.declared`), so each method states it in its own class body.
    """

    name: ClassVar[str] = ""
    searches: ClassVar[bool] = True
    adds_seeds: ClassVar[bool] = False
    words: ClassVar[str] = ""
    starts_with: ClassVar[str | None] = None

    def start_seeds(self, seeds: tuple[int, ...], search: SearchParams) -> tuple[int, ...]:
        """The seeds each key of a group starts with, of the sweep's ``seeds`` (sorted): the first ``starts_with``
        of them, or all."""
        return seeds[:getattr(search, self.starts_with)] if self.starts_with else seeds

    def decide(self, points: pd.DataFrame, groups: list[SearchGroup], states: list[GroupState],
               settings: SearchSettings) -> list[dict]:
        """The next decision of every group in ``groups`` (each with its :class:`GroupState`, not done), from
        ``points``, the runs' evaluations as far as the decisions so far trained them: rows of the ``search``
        table."""
        raise NotImplementedError(f"search method {self.name!r} makes no decisions")

    def reach(self, search: SearchParams) -> float:
        """How many times ``sweep.c_max`` the study's C* may be (``rollscale check``, ``init``): ``eta``, as far as
        a fit is trusted past its data (science §9.3, A3)."""
        return search.eta

    def measured_spent(self, search: SearchParams, grid_seeds: int) -> float | None:
        """The share of the grid's rollouts (``grid_seeds`` seeds a key) the method spends, as measured on the
        default study (docs/benchmarks.md), for ``rollscale check``'s time estimate; None: not measured (the
        sweep is counted as the whole grid)."""
        return None

    def seeds_added(self, group: SearchGroup, settings: SearchSettings) -> int:
        """Runs the method may add to ``group`` beyond its keys' starting seeds where nothing is settled early
        (``rollscale check``'s count of a search that can settle no key)."""
        return 0
