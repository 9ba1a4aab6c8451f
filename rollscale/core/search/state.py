"""A sweep's search, whatever its method: settings, groups, rungs, and the state its decisions imply (science §9.4).

The search is a pure function of its settings, its groups and the table of
decisions made so far (the ``search`` table): which keys are in play, which
were stopped where, which seeds each key has, and which rung comes next all
follow from those rows (:func:`group_state`), so a rerun that replays the same
decisions resumes exactly where the last one stopped. :func:`run_budgets`
says how far every run must have trained before the next decision, and
:func:`plan` which runs still have to move. The decisions themselves are made
by the method (:mod:`rollscale.core.search.methods`) through
:func:`rollscale.core.search.decisions.decide`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, Literal

import numpy as np
import pandas as pd

from rollscale.config import DecisionParams, SearchParams
from rollscale.core.fit.bracket import bracket_limits
from rollscale.core.fit.columns import require
from rollscale.tables import SEARCH_COLUMNS

__all__ = [
    "ACTIONS",
    "AXES",
    "DECISION_COLUMNS",
    "GroupState",
    "SearchGroup",
    "SearchSettings",
    "bracket_limits",
    "empty_decisions",
    "group_state",
    "leg_budget",
    "plan",
    "rung_budgets",
    "run_budgets",
    "states",
    "truncate",
]

Axis = Literal["rollout", "prompt", "iso_batch", "rule"]
AXES: tuple[str, ...] = ("rollout", "prompt", "iso_batch", "rule")
# continue: train on to the next rung; stop: no further (the method's rule says why); add: a new key
# (bracket); seed: a new seed of a key (undecided); finish: the run reached C_max at the last rung; resume: a
# stopped key trained on again from its checkpoint (science §11.3)
ACTIONS: tuple[str, ...] = ("continue", "stop", "add", "seed", "finish", "resume")
# the last four: the decision at C* behind a row: C*, the key's median reward there over refits, and the
# one-sided 1 - alpha bounds of its difference to the leader D_k (docs/tables.md)
DECISION_COLUMNS = list(SEARCH_COLUMNS)


@dataclass(frozen=True)
class SearchSettings:
    """The search's settings: the validated ``sweep.search`` section itself (:class:`~rollscale.config.SearchParams`:
    ``method``, ``eta``, ``alpha``, ``first_rung``, ``extra_seeds``, ``seeds_max``, ``bin_width``, the bootstrap),
    the decision's C* and epsilon (``study``: :class:`~rollscale.config.DecisionParams`), and what the sweep adds.

    Each setting has its default in one place, the pydantic section; the properties read them. ``eval_every``:
    the sweep's evaluation interval in steps: a run's leg ends at its first evaluation at or past the rung's
    budget, so the search reads exactly the evaluations a grid run has there (None: at the budget; on the
    shared budget schedule of science §9.1 a run evaluates at the first step past each rung's budget).
    ``sweep_seeds``: the sweep's seeds, the most a key may reach where ``sweep.search.seeds_max`` is null
    (None: the group's seeds plus ``extra_seeds``). ``eval_draws``: the 0/1 samples behind one evaluation
    (validation problems x eval_k), whose noise the forecast's refits redraw (science §10.2; None: not redrawn).
    """

    search: SearchParams = field(default_factory=SearchParams)
    study: DecisionParams = field(default_factory=DecisionParams)
    eval_every: int | None = None
    sweep_seeds: int | None = None
    eval_draws: int | None = None

    def __post_init__(self) -> None:
        for name, value in (("eval_every", self.eval_every), ("sweep_seeds", self.sweep_seeds),
                            ("eval_draws", self.eval_draws)):
            if value is not None and not value >= 1:
                raise ValueError(f"search settings: {name} must be >= 1 or None, got {value!r}")

    method = property(lambda self: self.search.method, doc="``sweep.search.method``")
    eta = property(lambda self: self.search.eta, doc="rung factor; a fit is trusted eta times past its data (A3)")
    alpha = property(lambda self: self.search.alpha, doc="bounds are one-sided 1 - alpha bootstrap bounds")
    first_rung = property(lambda self: self.search.first_rung, doc="<= 1 a fraction of C_max, > 1 rollouts")
    extra_seeds = property(lambda self: self.search.extra_seeds, doc="seeds a key may gain where undecided")
    bin_width = property(lambda self: self.search.bin_width, doc="record bins of the search's own fits")
    resamples = property(lambda self: self.search.bootstrap_resamples, doc="bootstrap refits")
    bootstrap_seed = property(lambda self: self.search.bootstrap_seed, doc="seed of the bootstrap's draws")
    target_budget = property(lambda self: self.study.target_budget, doc="C* (None: each group's C_max)")
    tolerance = property(lambda self: self.study.tolerance, doc="epsilon")

    @property
    def seeds_max(self) -> int | None:
        """The seeds a key may reach where the decision hangs: ``sweep.search.seeds_max``, else the sweep's."""
        return self.search.seeds_max if self.search.seeds_max is not None else self.sweep_seeds

    def identity(self) -> dict[str, Any]:
        """Every value the decisions depend on, flat (what a stored ``search`` table was made with): every field of
        the two sections and of these settings, so a new setting is in it with no edit here; ``sweep_seeds`` counts
        through ``seeds_max``, the cap it sets."""
        own = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("search", "study", "sweep_seeds")}
        return {**self.search.model_dump(), **self.study.model_dump(), **own, "seeds_max": self.seeds_max}


@dataclass(frozen=True)
class SearchGroup:
    """One set of runs the search chooses a key in: one family and what it holds fixed.

    ``axis``: ``rollout`` (key n at fixed B_problem), ``prompt`` (key
    B_problem at fixed n), ``iso_batch`` (key n at fixed total batch B) or
    ``rule`` (key: the allocation rule at fixed n and B_problem). ``keys``
    are the grid's keys (int, or str for rules), ``seeds`` its seeds;
    ``fixed`` what the axis holds fixed (B_problem, n, or B; None for rules).
    ``key_min`` / ``key_max`` bound what the bracket may add (None: nothing
    that side; :func:`bracket_limits` gives the defaults).
    """

    group: str
    axis: Axis
    keys: tuple
    seeds: tuple[int, ...]
    c_max: float
    fixed: int | None = None
    key_min: int | None = None
    key_max: int | None = None
    typed: type = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.axis not in AXES:
            raise ValueError(f"search group {self.group!r}: axis must be one of {list(AXES)}, got {self.axis!r}")
        if not self.keys or not self.seeds:
            raise ValueError(f"search group {self.group!r}: needs at least one key and one seed")
        if not (math.isfinite(self.c_max) and self.c_max > 0):
            raise ValueError(f"search group {self.group!r}: c_max must be positive, got {self.c_max!r}")
        object.__setattr__(self, "typed", str if self.axis == "rule" else int)
        object.__setattr__(self, "keys", tuple(sorted(self.typed(k) for k in self.keys)))
        object.__setattr__(self, "seeds", tuple(sorted(int(s) for s in self.seeds)))

    def key_of(self, text: object) -> object:
        """A key as the group types it (the ``search`` table holds keys as text)."""
        return self.typed(text)

    def step_rollouts(self, key: object) -> int | None:
        """Rollouts one step of ``key``'s runs generates (uniform rule), or None where it is not known."""
        if self.fixed is None or self.axis == "rule":
            return None
        return self.fixed if self.axis == "iso_batch" else int(key) * self.fixed  # type: ignore[call-overload]

    def allows(self, key: int) -> bool:
        """Whether the bracket may add ``key``: within the limits (iso-batch: n divides B)."""
        return (self.key_min is not None and self.key_max is not None and self.key_min <= key <= self.key_max
                and (self.axis != "iso_batch" or (self.fixed or 0) % key == 0))


def rung_budgets(c_max: float, eta: float, first_rung: float) -> tuple[int, ...]:
    """``c_1 < ... < c_R = C_max``: C_max / eta^j for j = R - 1, ..., 0, none below the first rung (science §9.4).

    ``first_rung`` <= 1 is a fraction of C_max, above 1 a number of rollouts.
    Budgets are whole rollouts (rounded up).
    """
    first = first_rung * c_max if first_rung <= 1 else first_rung
    steps = max(0, math.floor(math.log(c_max / first) / math.log(eta) + 1e-9)) if first < c_max else 0
    return tuple(int(math.ceil(c_max / eta**j - 1e-9)) for j in range(steps, -1, -1))


@dataclass(frozen=True)
class GroupState:
    """What the decisions so far imply for one group (:func:`group_state`)."""

    keys: tuple  # in play: the grid's and those the bracket added
    stopped: dict  # key -> the budget it stopped at
    seeds: dict  # key -> its seeds
    added_seeds: frozenset  # (key, seed) the undecided rule added: trained even where the key was stopped
    rung: int | None  # 1-based rung of the next decision; None when the search is done
    decision: int  # decisions made so far (the next one's number)
    budgets: tuple[int, ...]


def empty_decisions() -> pd.DataFrame:
    """The ``search`` table with no rows."""
    return pd.DataFrame(columns=DECISION_COLUMNS)


def group_state(group: SearchGroup, decisions: pd.DataFrame, settings: SearchSettings) -> GroupState:
    """Keys in play, stopped keys, seeds and the next rung, from ``decisions`` (the ``search`` table)."""
    return states([group], decisions, settings)[0]


def states(groups: list[SearchGroup], decisions: pd.DataFrame, settings: SearchSettings) -> list[GroupState]:
    """:func:`group_state` of every group (the table read once)."""
    require(decisions, "decisions", DECISION_COLUMNS)
    cols = {c: decisions[c].to_numpy() for c in ("group", "decision", "rung", "key", "seed", "action", "c_train")}
    order = np.argsort(cols["group"].astype(str), kind="stable")
    names = cols["group"][order].astype(str)
    out = []
    for g in groups:
        a, b = np.searchsorted(names, g.group, "left"), np.searchsorted(names, g.group, "right")
        out.append(_state(g, {c: v[order[a:b]] for c, v in cols.items()}, settings))
    return out


def _state(group: SearchGroup, rows: dict[str, np.ndarray], settings: SearchSettings) -> GroupState:
    budgets = rung_budgets(group.c_max, settings.eta, settings.first_rung)
    action, key_text = rows["action"], rows["key"]
    keys = set(group.keys) | {group.key_of(k) for k in key_text[action == "add"]}
    stopped: dict = {}
    for k, a, c in zip(key_text, action, rows["c_train"], strict=True):  # in order: a resume ends a stop
        if a == "stop":
            stopped[group.key_of(k)] = float(c)
        elif a == "resume":
            stopped.pop(group.key_of(k), None)
    seeds = {k: set(group.seeds) for k in keys}
    extra = action == "seed"
    added = frozenset((group.key_of(k), int(s)) for k, s in zip(key_text[extra], rows["seed"][extra], strict=True))
    for k, s in added:
        seeds[k].add(s)
    if not len(action):
        rung: int | None = 1
        count = 0
    else:
        numbers = rows["decision"].astype(int)
        count = int(numbers.max()) + 1
        last = numbers == count - 1
        rung = int(rows["rung"][last][0])
        if rung < len(budgets):
            rung += 1
        elif not np.isin(action[last], ["add", "seed", "resume"]).any():
            rung = None  # the last rung decided without adding or resuming anything: done
        if rung is not None and keys <= stopped.keys() and not np.isin(action[last], ["add", "seed", "resume"]).any():
            rung = None  # every key stopped (science §9.4: decided, the leader stops too): done
    return GroupState(tuple(sorted(keys)), stopped, {k: tuple(sorted(v)) for k, v in seeds.items()}, added, rung,
                      count, budgets)


def leg_budget(group: SearchGroup, key: object, c: float, settings: SearchSettings) -> float:
    """The budget a run of ``key`` trains to for rung budget ``c``: with ``settings.eval_every``, its first
    evaluation at or past ``c`` (at most C_max, where every run ends and evaluates)."""
    b = group.step_rollouts(key)
    if settings.eval_every is None or b is None or c >= group.c_max:
        return float(min(c, group.c_max))
    every = settings.eval_every * b
    return float(min(group.c_max, math.ceil(c / every - 1e-9) * every))


def run_budgets(groups: list[SearchGroup], decisions: pd.DataFrame, settings: SearchSettings) -> pd.DataFrame:
    """Every run in play with the budget it must have reached for the next decision.

    Columns ``group, rung, key, seed, c, stopped``: a stopped key's runs stay
    at the budget they stopped at (a seed added to it later trains to there);
    the others (and keys and seeds just added) go to the next rung's budget
    (:func:`leg_budget`). A group whose search is
    done has no rows.
    """
    rows = []
    for g, st in zip(groups, states(groups, decisions, settings), strict=True):
        if st.rung is None:
            continue
        for key in st.keys:
            stop = st.stopped.get(key)
            for seed in st.seeds[key]:
                c = stop if stop is not None else leg_budget(g, key, st.budgets[st.rung - 1], settings)
                # a seed added to a stopped key still has to reach the budget the key stopped at
                rows.append({"group": g.group, "rung": st.rung, "key": key, "seed": seed, "c": c,
                             "stopped": stop is not None and (key, seed) not in st.added_seeds})
    return pd.DataFrame(rows, columns=["group", "rung", "key", "seed", "c", "stopped"])


def plan(groups: list[SearchGroup], decisions: pd.DataFrame, settings: SearchSettings) -> pd.DataFrame:
    """The runs to train before the next decision, each to budget ``c`` (empty when every group is done).

    Columns ``group, rung, key, seed, c``. A run already at ``c`` (a rerun)
    has nothing to do; stopped runs are not listed (seeds added to a stopped
    key are, with its stop budget).
    """
    todo = run_budgets(groups, decisions, settings)
    return todo[~todo["stopped"].astype(bool)].drop(columns="stopped").reset_index(drop=True)


def truncate(points: pd.DataFrame, budgets: pd.DataFrame) -> pd.DataFrame:
    """Each run's evaluations as far as the search had trained it: up to its budget ``c`` (science §9.4).

    ``budgets`` has ``group, key, seed, c`` (:func:`run_budgets`). A run
    trained to budget c stops at the first step with C >= c and evaluates
    there, so rows up to c are kept and the first row past c too when it lies
    within one step's rollouts (``points.b``, the run's B = n · B_problem);
    without a ``b`` column the first row past c is kept wherever it lies.
    Runs without a budget are dropped.
    """
    require(budgets, "budgets", ["group", "key", "seed", "c"])
    merged = points.merge(budgets[["group", "key", "seed", "c"]].rename(columns={"c": "budget"}),
                          on=["group", "key", "seed"], how="inner")
    merged = merged.sort_values(["group", "run_id", "c"], kind="stable")
    past = merged["c"] > merged["budget"] * (1 + 1e-12)
    first_past = past & ~past.groupby([merged["group"], merged["run_id"]]).shift(1, fill_value=False)
    if "b" in merged.columns:
        first_past &= (merged["c"] - merged["budget"]) < merged["b"]
    keep = ~past | first_past
    return merged[keep].drop(columns="budget").reset_index(drop=True)

