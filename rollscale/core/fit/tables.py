"""The frontier tables of the fit stage: sigmoid per key, F(C), n*(C), epochs at transitions (science §7, §8).

:func:`frontier_analysis` (re-exported by :mod:`rollscale.core.fit.analysis`, whose
docstring describes designs, groups and ``fixed``) turns record points into
rows of the ``fits``, ``frontier`` and ``epoch_transitions`` tables.

What the fit saw (science §8, A3): a key's curve is used only up to
``reach_factor`` (eta) times the largest x its runs were evaluated at. Beyond
that the key stays in the frontier's max only where the upper bound of its
asymptote A could still beat the best curve within reach
(:func:`rollscale.core.fit.frontier.reach_mask`); the frontier marks such budgets
(``extrapolated``, ``extrapolated_keys``) and the n* fit row gives the lowest
(``extrapolated_from``). In a grid study every key is trained to C_max and
nothing is marked. For rewards in [0, 1] (validation avg@k of 0/1 rewards)
every sigmoid has A <= 1 (science §8, A1).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from rollscale.core.fit import curves as fit
from rollscale.core.fit import frontier
from rollscale.core.fit.bootstrap import LEVEL, Bootstrap, interval, interval_note, seeds_per_stratum, sigmoid_refits
from rollscale.core.fit.columns import CONFIG, EVAL_COLUMNS, FAMILY, families, fit_row, fits_frame, require
from rollscale.core.fit.frontier import (
    a2_check,
    asymptote_upper,
    pairwise_beats,
    reach_mask,
    refit_argmax,
    resolved_start,
)

__all__ = ["DESIGNS", "REWARD_MAX", "DesignGroup", "FrontierTables", "design_groups", "frontier_analysis"]

DESIGNS: tuple[str, ...] = ("n", "b_problem", "iso_batch")
REWARD_MAX = 1.0  # validation avg@k is a mean of 0/1 rewards (science §2, §5): A <= 1 (science §8, A1)

_FRONTIER_COLUMNS = ["design", "bucket", "rule", "fixed", "c", "m", "frontier_reward", "frontier_reward_lo",
                     "frontier_reward_hi", "best_key", "best_key_share", "best_key_lo", "best_key_hi", "n_seeds",
                     "n_star_fit", "extrapolated", "extrapolated_keys"]
_TRANSITION_COLUMNS = ["design", "bucket", "rule", "fixed", "c", "m", "from_key", "to_key", "epochs"]


@dataclass(frozen=True)
class FrontierTables:
    """One design's rows of the ``fits``, ``frontier`` and ``epoch_transitions`` tables."""

    fits: pd.DataFrame
    frontier: pd.DataFrame
    transitions: pd.DataFrame


@dataclass(frozen=True)
class DesignGroup:
    bucket: str
    rule: str
    fixed: str
    key_col: str
    x_col: str
    batch: int | None  # the fixed total batch B of an iso-batch group
    rows: pd.DataFrame


def _keys_text(values: Iterable[Any]) -> str:
    return ", ".join(str(int(v)) for v in sorted(set(values)))


def design_groups(df: pd.DataFrame, design: str) -> tuple[list[DesignGroup], list[dict[str, Any]]]:
    """The groups a design's frontier is fitted on, and status rows for families that have none."""
    groups: list[DesignGroup] = []
    missing: list[dict[str, Any]] = []
    for (bucket, rule), fam in families(df):
        found = []
        if design == "n":
            if fam["n"].nunique() >= 2:
                found.append(DesignGroup(bucket, rule, "all", "n", "c", None, fam))
            reason = f"only one n ({_keys_text(fam['n'])}): no frontier over n"
        elif design == "b_problem":
            for n_value, g in fam.groupby("n"):
                if g["b_problem"].nunique() >= 2:
                    found.append(DesignGroup(bucket, rule, f"n={int(n_value)}", "b_problem", "c", None, g))
            reason = "no two runs with the same n and different B_problem"
        else:
            for b_value, g in fam.groupby("b"):
                if g["n"].nunique() >= 2:
                    found.append(DesignGroup(bucket, rule, f"B={int(b_value)}", "n", "step", int(b_value), g))
            reason = "no two n share a total batch B = n·B_problem"
        groups += found
        if not found:
            missing.append({"bucket": bucket, "rule": rule, "fixed": None, "status": reason})
    return groups, missing


def _n_star_kind(design: str) -> str:
    # the report looks the n design's n* fit up as plain "n_star"
    return "n_star" if design == "n" else f"n_star_{design}"


def _epochs_lookup(group: DesignGroup) -> Any:
    """Epochs a key's runs had completed at x, averaged over its runs (seeds); NaN outside a run's range."""
    per_key: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
    for (_, key), g in group.rows.groupby(["run_id", group.key_col]):
        g = g.sort_values("step")
        per_key.setdefault(int(key), []).append((g[group.x_col].to_numpy(float), g["epochs"].to_numpy(float)))

    def lookup(key: Hashable, x: float) -> float:
        values = []
        for xs, epochs in per_key.get(int(key), []):  # type: ignore[arg-type]
            ok = np.isfinite(epochs)
            if ok.sum() >= 1 and xs[ok].min() <= x <= xs[ok].max():
                values.append(float(np.interp(x, xs[ok], epochs[ok])))
        return float(np.mean(values)) if values else math.nan

    return lookup


def _resolved_start(curves: dict[int, fit.SigmoidFit], x_lo: float, x_hi: float, min_gain: float) -> float | None:
    """The lowest x where F has risen by ``min_gain`` above F(x_lo); None if it never does."""
    if min_gain <= 0:
        return x_lo
    fine = frontier.log_grid(x_lo, x_hi, 400)
    return resolved_start(fine, frontier.frontier(curves, fine)["frontier_reward"].to_numpy(float), min_gain)


def _sigmoid_bootstrap(f: fit.SigmoidFit, pts: pd.DataFrame, x_col: str, weights: np.ndarray,
                       a_max: float | None) -> np.ndarray:
    """Refits ``(resamples, 4)`` as (R0, A - R0, log10 C_mid, beta); NaN where the full fit failed."""
    if not f.ok or weights.shape[0] == 0:
        return np.full((weights.shape[0], 4), np.nan)
    x = np.log10(pts[x_col].to_numpy(float))
    theta0 = [f.r0, f.a - f.r0, f.log10_c_mid, f.beta]
    lower, upper = fit.sigmoid_bounds(x)
    return sigmoid_refits(x, pts["avg_at_k"].to_numpy(float), weights, theta0, lower, upper, a_max=a_max)


def _sigmoid_intervals(refits: np.ndarray, seeds: int, resamples: int) -> dict[str, Any]:
    quantities = {"r0": refits[:, 0], "a": refits[:, 0] + refits[:, 1], "c_mid": 10.0 ** refits[:, 2],
                  "beta": refits[:, 3]}
    out: dict[str, Any] = {}
    for name, values in quantities.items():
        out[f"{name}_lo"], out[f"{name}_hi"] = (float(v) for v in interval(values, seeds))
    return {**out, "n_seeds": seeds, "interval": interval_note(seeds, resamples)}


def _refit_preds(refits: dict[int, np.ndarray], keys: list[int], x: np.ndarray) -> np.ndarray:
    """Every key's curve on the grid under each resample: keys x resamples x grid."""
    th = np.stack([refits[k] for k in keys])[..., None]  # (keys, resamples, 4, 1)
    return fit.sigmoid_model(np.moveaxis(th, 2, 0), np.log10(x))


def _frontier_intervals(preds: np.ndarray, keys: list[int], best: np.ndarray, seeds: int,
                        allowed: np.ndarray) -> dict[str, np.ndarray]:
    """Frontier reward and n* on the grid under each resample; share of resamples agreeing with the n* shown."""
    nan = np.full(len(best), np.nan)
    if seeds < 2 or not len(keys) or preds.shape[1] == 0:
        return {"frontier_reward_lo": nan, "frontier_reward_hi": nan, "best_key_share": nan,
                "best_key_lo": nan, "best_key_hi": nan}
    idx, reward = refit_argmax(preds, allowed)
    picked = np.where(idx >= 0, np.asarray(keys, float)[np.maximum(idx, 0)], np.nan)
    r_lo, r_hi = interval(reward, seeds)
    k_lo, k_hi = interval(picked, seeds)
    with np.errstate(invalid="ignore"):
        share = np.nanmean(np.where(idx < 0, np.nan, picked == best[None, :]), axis=0)
    return {"frontier_reward_lo": r_lo, "frontier_reward_hi": r_hi, "best_key_share": share,
            "best_key_lo": k_lo, "best_key_hi": k_hi}


def _a2_row(ids: tuple, c: np.ndarray, keys: list[int], best: np.ndarray, preds: np.ndarray,
            refit_preds: np.ndarray, allowed: np.ndarray, seeds: int) -> dict[str, Any]:
    """The ``a2_check`` fits row of a rollout-axis frontier (science §8, A2): pairwise shares under the refits,
    or the point fits' order with one seed."""
    one = seeds < 2 or refit_preds.shape[1] == 0
    beats = pairwise_beats(preds[:, None, :] if one else refit_preds, allowed)
    check = a2_check(c, keys, best, beats, note="1 seed: the point fits' order" if one else "")
    return fit_row("a2_check", *ids, None, n_points=len(c), a2_holds=check.holds, status=check.status)


def _frontier_for_group(group: DesignGroup, design: str, grid_points: int, min_gain: float,
                        boot: Bootstrap, reach_factor: float) -> FrontierTables:
    pts = group.rows[group.rows["is_record"] & (group.rows[group.x_col] > 0)]
    # A1: a mean of 0/1 rewards has A <= 1; other rewards are left unbounded
    a_max = REWARD_MAX if group.rows["avg_at_k"].between(0.0, REWARD_MAX).all() else None
    curves: dict[int, fit.SigmoidFit] = {}
    fit_rows = []
    ids = (design, group.bucket, group.rule, group.fixed)
    runs = group.rows.drop_duplicates("run_id")
    counts = boot.run_counts(runs[CONFIG].astype(str).agg("/".join, axis=1), salt=zlib.crc32(repr(ids).encode()))
    column = {run_id: i for i, run_id in enumerate(runs["run_id"])}
    refits: dict[int, np.ndarray] = {}
    seeds: dict[int, int] = {}
    for key in sorted(int(k) for k in group.rows[group.key_col].unique()):
        g = pts[pts[group.key_col] == key]
        f = fit.fit_sigmoid(g[group.x_col].to_numpy(float), g["avg_at_k"].to_numpy(float), a_max=a_max)
        curves[key] = f
        key_runs = runs[runs[group.key_col] == key]
        seeds[key] = seeds_per_stratum(key_runs[CONFIG].astype(str).agg("/".join, axis=1))
        refits[key] = _sigmoid_bootstrap(f, g, group.x_col, counts[:, [column[r] for r in g["run_id"]]], a_max)
        fit_rows.append(fit_row(f"sigmoid_{design}", *ids, key, **f.to_dict(),
                                **_sigmoid_intervals(refits[key], seeds[key], boot.resamples)))
    n_star_kind = _n_star_kind(design)
    no_frontier, no_transitions = pd.DataFrame(columns=_FRONTIER_COLUMNS), pd.DataFrame(columns=_TRANSITION_COLUMNS)
    usable = {k: f for k, f in curves.items() if f.ok}
    if not usable:
        why = "; ".join(f"{group.key_col}={k}: {f.status}" for k, f in curves.items())
        fit_rows.append(fit_row(n_star_kind, *ids, None, n_points=0, status=f"no usable sigmoid fit ({why})"))
        return FrontierTables(pd.DataFrame(fit_rows), no_frontier, no_transitions)
    x_lo, x_hi = float(pts[group.x_col].min()), float(pts[group.x_col].max())
    if not x_hi > x_lo:
        fit_rows.append(fit_row(n_star_kind, *ids, None, n_points=0,
                                 status=f"record points span no range of {group.x_col}"))
        return FrontierTables(pd.DataFrame(fit_rows), no_frontier, no_transitions)

    start = _resolved_start(usable, x_lo, x_hi, min_gain)
    resolved = start is not None and start < x_hi
    grid = frontier.log_grid(start if resolved else x_lo, x_hi, grid_points)
    keys = sorted(usable)
    # A3: a curve is used up to reach_factor times the largest x its runs were evaluated at
    seen = group.rows.groupby(group.key_col)[group.x_col].max()
    preds = np.vstack([usable[k].predict(grid) for k in keys])
    a_hi = asymptote_upper(np.stack([refits[k] for k in keys]), [float(seen[k]) for k in keys],
                           [seeds[k] for k in keys], LEVEL, a_max, reach_factor)
    allowed, beyond = reach_mask(grid, [reach_factor * float(seen[k]) for k in keys], preds, a_hi)
    fr = frontier.frontier(usable, grid, allowed)
    scale = group.batch or 1  # iso-batch: x is M and C = B·M
    extrapolated = beyond.any(axis=0)
    ext_from = {"extrapolated_from": float(grid[extrapolated].min()) * scale if extrapolated.any() else math.nan}
    log10_x = np.log10(fr["c"].to_numpy(float))
    if resolved:
        ns = frontier.fit_n_star(log10_x, fr["best_key"].astype(float).to_numpy())
        fit_rows.append(fit_row(n_star_kind, *ids, None, **ns.to_dict(), **ext_from))
        transitions = frontier.epochs_at_transitions(fr, _epochs_lookup(group))
    else:
        # every curve is still at its base reward: which one is highest is fit noise, not a best key
        ns = None
        fit_rows.append(fit_row(n_star_kind, *ids, None, n_points=len(grid), **ext_from, status=(
            f"the frontier gains less than {min_gain:g} over the {group.x_col} range: n* not resolved")))
        transitions = pd.DataFrame(columns=["c", "from_key", "to_key", "epochs"])
    n_seeds = min(seeds[k] for k in keys)
    refit_preds = _refit_preds(refits, keys, grid)
    bands = _frontier_intervals(refit_preds, keys, fr["best_key"].astype(float).to_numpy(), n_seeds, allowed)
    frontier_df = pd.DataFrame({"design": design, "bucket": group.bucket, "rule": group.rule, "fixed": group.fixed,
                                "c": fr["c"].to_numpy(float), "m": np.nan,
                                "frontier_reward": fr["frontier_reward"].to_numpy(float),
                                "best_key": pd.array([int(k) for k in fr["best_key"]], dtype="Int64"),
                                **bands, "n_seeds": n_seeds,
                                "n_star_fit": ns.predict(log10_x) if ns is not None and ns.ok else np.nan,
                                "extrapolated": extrapolated,
                                "extrapolated_keys": [", ".join(str(k) for k, b in zip(keys, col, strict=True) if b)
                                                      for col in beyond.T]})
    transitions = transitions.assign(design=design, bucket=group.bucket, rule=group.rule, fixed=group.fixed, m=np.nan)
    if group.batch is not None:
        # iso-batch: the grid is in optimizer steps M; C = B·M is the nominal compute (exact for the uniform rule)
        frontier_df["m"] = frontier_df["c"]
        frontier_df["c"] = frontier_df["m"] * group.batch
        transitions["m"] = transitions["c"]
        transitions["c"] = transitions["m"] * group.batch
    if design == "n" and resolved:
        best = np.argmax(np.where(allowed, preds, -np.inf), axis=0)
        fit_rows.append(_a2_row(ids, frontier_df["c"].to_numpy(float), keys, best, preds, refit_preds, allowed,
                                n_seeds))
    transitions = transitions[_TRANSITION_COLUMNS].astype({"from_key": "Int64", "to_key": "Int64"})
    return FrontierTables(pd.DataFrame(fit_rows), frontier_df[_FRONTIER_COLUMNS], transitions)


def _concat(frames: list[pd.DataFrame], columns: list[str]) -> pd.DataFrame:
    frames = [f for f in frames if not f.empty]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)


def frontier_analysis(
    points: pd.DataFrame, design: str, grid_points: int = 50, min_gain: float = 0.0,
    boot: Bootstrap | None = None, reach_factor: float = 2.0,
) -> FrontierTables:
    """Sigmoid per key, the frontier F(C) and its argmax, the n* fit and epochs at transitions (science §7).

    ``points`` is :func:`rollscale.core.fit.analysis.record_points`'s table. For each group of the design
    (module docstring): the monotonic sigmoid R(x) is fitted per key to the
    pooled record-breaking points at x > 0 of all runs with that key; the
    frontier is the max over the usable fits on a log grid of ``grid_points``
    values up to the highest record point; the logistic of log2 n* in log10 x
    is fitted to its argmax; and where the argmax changes, the epochs the new
    key's runs had completed there (interpolated in each run's evaluations,
    averaged over its runs).

    The grid starts at the lowest record point, or, with ``min_gain`` > 0 (the
    fit stage passes the record bin width), at the lowest x where F has risen
    by ``min_gain`` above its value there. We add this: below it every curve
    is still at the base reward, and which fitted R0 is highest is noise, not
    a best key. A frontier that never rises that much gets no n* fit, and its
    status says so.

    With ``boot`` (resamples > 0), runs are resampled with replacement within
    each config (its seeds) and every sigmoid refitted (:mod:`rollscale.core.fit.bootstrap`):
    fit rows gain ``<param>_lo`` / ``<param>_hi``, ``n_seeds`` and ``interval``;
    the frontier gains ``frontier_reward_lo/_hi``, ``best_key_lo/_hi`` and
    ``best_key_share``, the share of refits whose argmax is the ``best_key``
    shown. A key with one seed per config has NaN intervals and says so.

    What the fit saw (science §8, A1, A3; module docstring): for rewards in
    [0, 1] every A is at most 1; a key's curve competes up to
    ``reach_factor`` (the search's eta) times the largest x its runs were
    evaluated at, and beyond only where its A's upper bound could still beat
    the best curve within reach; ``extrapolated`` / ``extrapolated_keys``
    mark those budgets, ``extrapolated_from`` on the n* row the lowest.

    ``fits`` rows: kind ``sigmoid_<design>`` (one per key) and ``n_star``
    (n design) or ``n_star_<design>``; a family with no group for the design
    gets one ``n_star`` row whose status says why. The n design adds one
    ``a2_check`` row per resolved frontier (science §8, A2; ``a2_holds`` and a
    status saying where n* falls, :func:`rollscale.core.fit.frontier.a2_check`).
    """
    if design not in DESIGNS:
        raise ValueError(f"design: expected one of {list(DESIGNS)}, got {design!r}")
    require(points, "points", [*EVAL_COLUMNS, "n", "b_problem", "b", "is_record", *FAMILY])
    if int(grid_points) != grid_points or grid_points < 2:
        raise ValueError(f"grid_points: expected an integer >= 2, got {grid_points!r}")
    if not (math.isfinite(min_gain) and min_gain >= 0):
        raise ValueError(f"min_gain: expected a non-negative number, got {min_gain!r}")
    if not (math.isfinite(reach_factor) and reach_factor >= 1):
        raise ValueError(f"reach_factor: expected a number >= 1, got {reach_factor!r}")
    groups, missing = design_groups(points, design)
    fit_rows = [fit_row(_n_star_kind(design), design, m["bucket"], m["rule"], m["fixed"], None, n_points=0,
                         status=m["status"]) for m in missing]
    if points.empty:
        fit_rows = [fit_row(_n_star_kind(design), design, None, None, None, None, n_points=0,
                             status="no evaluations of finished runs")]
    boot = boot if boot is not None else Bootstrap(0)
    parts = [_frontier_for_group(g, design, int(grid_points), float(min_gain), boot, float(reach_factor))
             for g in groups]
    fits_rows = [*(r for p in parts for r in p.fits.to_dict("records")), *fit_rows]
    return FrontierTables(
        fits=fits_frame(fits_rows),
        frontier=_concat([p.frontier for p in parts], _FRONTIER_COLUMNS),
        transitions=_concat([p.transitions for p in parts], _TRANSITION_COLUMNS),
    )
