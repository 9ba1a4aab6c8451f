"""The decision search's reading of its groups (science §9.4, :mod:`rollscale.core.search.methods.decision`): every
group's decision at C*, at the rung's budget c_r and as far toward C* as the fits reach (:func:`standings`), and the
group's C* and seed cap. Kept outside the method folder, whose modules are the search methods."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from rollscale.core.fit.decision import RunCurves, decide, fit_groups
from rollscale.core.fit.tables import REWARD_MAX
from rollscale.core.search.state import GroupState, SearchGroup, SearchSettings

__all__ = ["RUN_FIELDS", "Standing", "c_star", "level", "seed_cap", "spend_budget", "spend_left", "standings"]


def level(settings: SearchSettings) -> float:
    """The two-sided level whose interval ends are one-sided 1 - alpha bounds."""
    return 1.0 - 2.0 * settings.alpha


def c_star(group: SearchGroup, settings: SearchSettings) -> float:
    """The target budget C* of ``group``: ``target_budget``, else its C_max."""
    return float(settings.target_budget) if settings.target_budget is not None else float(group.c_max)


def seed_cap(group: SearchGroup, settings: SearchSettings) -> int:
    """The most seeds a key may reach where the decision hangs (``seeds_max``)."""
    return settings.seeds_max if settings.seeds_max is not None else len(group.seeds) + settings.extra_seeds


def spend_budget(group: SearchGroup, settings: SearchSettings) -> float:
    """The most rollouts the search spends on ``group``: ``sweep.search.spend_max`` x C*; inf without a cap."""
    cap = settings.search.spend_max
    return math.inf if cap is None else cap * c_star(group, settings)


def spend_left(group: SearchGroup, st: GroupState, settings: SearchSettings) -> float:
    """Rollouts the search may still spend on ``group`` at its last rung: :func:`spend_budget` less what its runs
    have reached (a stopped key's at its stop, every other key's at C_max); inf without a cap."""
    spent = sum(len(st.seeds[key]) * st.stopped.get(key, group.c_max) for key in st.keys)
    return spend_budget(group, settings) - spent


RUN_FIELDS = ("run_id", "key", "reach", "theta", "r0_step0", "noise_floor")  # RunCurves' per-run arrays


def _trusted(rc: RunCurves, c: float) -> np.ndarray:
    """Runs whose key's curve may be read at ``c``: within its data, or beyond it where the key's runs have
    bent (every run's C_mid within its data): an unbent curve's extrapolation is its asymptote's guess, which the
    seeds' spread does not bound (simulated family ``unbent``: settled wrongly in 4 of 8 studies)."""
    out = np.ones(len(rc.key), bool)
    for k in np.unique(rc.key):
        mine = rc.key == k
        seen = float(rc.reach[mine].min())
        mids = 10.0 ** rc.theta[mine, 2]
        if c > seen * (1 + 1e-9) and not (mids <= seen).all():
            out[mine] = False
    return out


@dataclass(frozen=True)
class Standing:
    """One group's decision read at three budgets (tables of :func:`rollscale.core.fit.decision.decide`, one row
    per key, ``key`` as the group types it, ``evals`` the fewest evaluations past C = 0 of any of its runs)."""

    star: pd.DataFrame  # at C*: the leader, D_k and its bounds, settled by epsilon (science §9.4)
    rung: pd.DataFrame  # at c_r: the leader there, and the smaller n it beats (A2)
    reach: pd.DataFrame  # at min(C*, eta c_r), the farthest the fits reach toward C*: the bracket's edge
    rise: float  # the leader at c_r's reward there above the shared R0


def standings(points: pd.DataFrame, groups: list[SearchGroup], rungs: dict[str, float],
              settings: SearchSettings) -> dict[str, Standing]:
    """The decision of every group with evaluations (``rungs``: group -> its rung budget c_r). All groups'
    runs are fitted in one batch, each group at its own shared R0."""
    if points.empty:
        return {}
    by_name = {g.group: g for g in groups}
    pts = points[points["group"].isin(list(by_name))]
    # the decision's fits take integer keys: rules by their place among the group's keys (bracket keys too)
    index = {name: {k: (i if by_name[name].axis == "rule" else int(k)) for i, k in enumerate(sorted(set(keys)))}
             for name, keys in pts.groupby("group")["key"]}
    pts = pts.assign(key_ix=[index[g][k] for g, k in zip(pts["group"], pts["key"], strict=True)])
    curves = fit_groups(pts, "key_ix", "group", REWARD_MAX if pts["avg_at_k"].between(0, REWARD_MAX).all() else None)
    out = {}
    for name, rc in curves.items():
        g, back = by_name[name], {v: k for k, v in index[name].items()}
        mine = pts[(pts["group"] == name) & (pts["c"] > 0)]
        evals = mine.groupby(["key", "run_id"]).size().groupby(level=0).min()

        def at(c: float) -> pd.DataFrame:
            trusted = _trusted(rc, c)
            if not trusted.any():
                trusted[:] = True  # nothing to compare: the decision says every key is unknown
            table = decide(dataclasses.replace(rc, **{f: getattr(rc, f)[trusted] for f in RUN_FIELDS}), c,
                           settings.tolerance, settings.eta, rollout_axis=g.axis == "rollout",
                           level=level(settings), resamples=max(settings.resamples, 1), seed=settings.bootstrap_seed)
            table["key"] = [back[int(k)] for k in table["key"]]
            table["leader"] = [back[int(k)] if k is not None and k == k else None for k in table["leader"]]
            table["evals"] = table["key"].map(evals).fillna(0).astype(int)
            return table.set_index("key", drop=False)

        target, c_r = c_star(g, settings), rungs[name]
        star = at(target)
        reach = star if target <= settings.eta * c_r * (1 + 1e-9) else at(settings.eta * c_r)
        rung = at(c_r)
        lead_r = rung["leader"].iloc[0]
        rise = float(rung.loc[lead_r, "reward"] - rc.r0) if lead_r is not None else math.nan
        out[name] = Standing(star, rung, reach, rise)
    return out
