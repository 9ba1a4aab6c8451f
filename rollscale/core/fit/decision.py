"""The decision at a target budget C* (science §9.2-9.4): which key, what reward, within a tolerance.

One R0 for every key of a group: the mean of every run's step-0 evaluation
(same base model, same validation problems; science §9.2). Each run's
evaluations (C > 0) are fitted with the §7 sigmoid at that R0, three free
parameters (A - R0 <= 1 - R0 for 0/1 rewards is then a box bound), all runs of
a study at once by the vectorised refits of :mod:`rollscale.core.fit.bootstrap`
from several starts. A key's reward at C is the mean of its runs' curves at C.

Interval (science §9.3). A key's own bootstrap over 2-3 seeds is no interval
(2 seeds give 3 distinct resamples). The seed-to-seed spread of the runs'
predictions at C, which holds each run's evaluation noise as well (every run is
fitted to its own evaluations), is a property of the study: it is pooled across
the keys of a group (degrees of freedom sum(S_k - 1)), a key's variance is the
larger of the pooled one and its own, and the shared R0 adds its own
evaluation noise (the spread of the step-0 evaluations over the runs)
through the fraction of the rise not yet made at C. The 95 % interval is
estimate +- t(df) * se. tests/test_decision.py checks its coverage on
simulated studies (docs/benchmarks.md gives the numbers).

Paired refits: the runs are resampled with the same indices for every key
(seed slot j of every key), R0 re-estimated from the resampled runs (its
effect on each run's prediction to first order), so differences are read refit
by refit; the leader is the key with the largest median refit (science §9.4).

For 0/1 rewards (``reward_max`` set) a key's interval is clipped to [0, reward_max]: the t interval of a
reward near 0 or 1 would reach past what a reward can be; D's to [-reward_max, reward_max], what a difference
of two rewards can be ("D = 0.27 [-1.13, 1.67]"). settled and within tolerance read the same
bounds: a tolerance below reward_max gives the same verdicts clipped or not.

Status of a key at C* (science §9.3, A3 of §8): ``within data`` when every
run of it reached C*; ``extrapolated`` when C* <= eta times the largest C all
its runs reached; beyond, ``unknown``: bounds only (the lower bound of its
reward where its runs end, and the reward's cap).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.special import expit
from scipy.stats import t as student_t

from rollscale.core.fit.bootstrap import LEVEL, sigmoid_refits
from rollscale.core.fit.sigmoid import sigmoid_model

__all__ = ["STATUS", "KeyRewards", "RunCurves", "decide", "fit_groups", "fit_runs", "key_rewards", "paired_refits",
           "shared_r0"]

_LN10 = math.log(10.0)
_MIN_POINTS = 4  # points at distinct C > 0 a run's three-parameter curve needs (one residual degree of freedom)
STATUS = ("leader", "within tolerance", "settled", "open", "unknown")


def shared_r0(c: np.ndarray, reward: np.ndarray, run_id: np.ndarray) -> tuple[float, float, int]:
    """(R0, its variance, runs behind it): the mean of every run's step-0 (C = 0) evaluation (science §9.2).

    The variance is the step-0 evaluations' spread over runs / runs (their evaluation noise: the base
    model is one); NaN with one run; R0 NaN with none."""
    at0 = np.asarray(c, float) == 0
    first = pd.Series(np.asarray(reward, float)[at0]).groupby(np.asarray(run_id)[at0]).mean()
    runs = len(first)
    if runs == 0:
        return math.nan, math.nan, 0
    var = float(first.var(ddof=1)) / runs if runs > 1 else math.nan
    return float(first.mean()), var, runs


@dataclass(frozen=True)
class RunCurves:
    """Every run's sigmoid at the shared R0: ``theta`` rows ``(R0, A - R0, log10 C_mid, beta)`` (NaN: no fit)."""

    run_id: np.ndarray
    key: np.ndarray
    reach: np.ndarray  # the largest C each run was evaluated at
    theta: np.ndarray
    r0: float
    r0_var: float
    r0_step0: np.ndarray  # each run's step-0 evaluation (NaN when it has none)
    # the least variance a run's prediction can have from its own evaluation noise: its residual variance over
    # its evaluations (science §9.3, "add the evaluation noise, which is known"); 0 where it has no fit
    noise_floor: np.ndarray | None = None

    def predict(self, c: float) -> tuple[np.ndarray, np.ndarray]:
        """Each run's reward at C and the share of its rise still to come (its sensitivity to R0)."""
        r0, delta, m, beta = self.theta.T
        frac = expit(beta * _LN10 * (math.log10(c) - m))
        return r0 + delta * frac, 1.0 - frac


def fit_runs(evals: pd.DataFrame, key_col: str, a_max: float | None = 1.0, iterations: int = 100) -> RunCurves:
    """Fit every run of ``evals`` (``run_id, c, avg_at_k`` and ``key_col``) at one shared R0 (science §9.2)."""
    return fit_groups(evals.assign(_group=0), key_col, "_group", a_max, iterations)[0]


def fit_groups(evals: pd.DataFrame, key_col: str, group_col: str, a_max: float | None = 1.0,
               iterations: int = 100) -> dict:
    """:func:`fit_runs` for every group of ``group_col`` (its own R0 each), all runs fitted in one batch."""
    ev = evals.sort_values([group_col, "run_id", "c"])
    # runs as slices of the sorted columns (numpy, not a pandas group per run: ~2 s a call in the search's
    # simulation, where the fits run ~1,000 times)
    grp_of, run_of = ev[group_col].to_numpy(), ev["run_id"].to_numpy()
    c_all, y_all, key_all = ev["c"].to_numpy(float), ev["avg_at_k"].to_numpy(float), ev[key_col].to_numpy()
    new_run = np.ones(len(ev), bool)
    new_run[1:] = (grp_of[1:] != grp_of[:-1]) | (run_of[1:] != run_of[:-1])
    bounds = [*np.flatnonzero(new_run).tolist(), len(ev)]
    runs = [(bounds[i], bounds[i + 1]) for i in range(len(bounds) - 1)]
    parts = []
    for g in dict.fromkeys(grp_of[s] for s, _ in runs):
        mine = [(s, e) for s, e in runs if grp_of[s] == g]
        lo, hi = mine[0][0], mine[-1][1]  # sorted by group first: a group's runs are one slice
        r0, r0_var, _ = shared_r0(c_all[lo:hi], y_all[lo:hi], run_of[lo:hi])
        parts += [(g, r0, r0_var, s, e) for s, e in mine]
    pts = [(c_all[s:e][c_all[s:e] > 0], y_all[s:e][c_all[s:e] > 0]) for *_, s, e in parts]
    width = max([len(p[0]) for p in pts] + [1])
    x, y, w = np.ones((len(parts), width)), np.zeros((len(parts), width)), np.zeros((len(parts), width))
    for i, (pc, py) in enumerate(pts):
        x[i, :len(pc)], y[i, :len(pc)], w[i, :len(pc)] = np.log10(pc), py, 1.0
    r0s = np.array([p[1] for p in parts], float)
    theta = np.full((len(parts), 4), math.nan)
    # a run needs _MIN_POINTS evaluations past step 0 (the refits also ask for as many distinct C)
    fit = np.isfinite(r0s) & (w.sum(axis=1) >= _MIN_POINTS)
    if fit.any():
        theta[fit] = _fit_at_r0(x[fit], y[fit], w[fit], r0s[fit], a_max, iterations)
    # a run's residual variance over its points: the noise its prediction keeps however its seeds agree (runs
    # that did not learn all fit flat at R0, and their spread at C* is 0: the --hours 1 SmolLM2 study)
    floor = np.zeros(len(parts))
    ok = fit & np.isfinite(theta).all(axis=1)
    if ok.any():
        resid = w[ok] * (sigmoid_model(theta[ok].T[:, :, None], x[ok]) - y[ok]) ** 2
        m = w[ok].sum(axis=1)
        floor[ok] = np.nansum(resid, axis=1) / np.maximum(m - 3, 1) / m
    out = {}
    groups = np.array([p[0] for p in parts], dtype=object)
    for g in dict.fromkeys(groups.tolist()):
        i = np.flatnonzero(groups == g)
        spans = [(parts[j][3], parts[j][4]) for j in i]
        step0 = [y_all[s:e][(c_all[s:e] == 0) & ~np.isnan(y_all[s:e])] for s, e in spans]
        out[g] = RunCurves(
            np.array([run_of[s] for s, _ in spans], dtype=object), np.array([int(key_all[s]) for s, _ in spans]),
            np.array([float(c_all[s:e].max()) for s, e in spans]), theta[i], float(r0s[i[0]]), float(parts[i[0]][2]),
            np.array([float(v.mean()) if v.size else math.nan for v in step0]), floor[i])
    return out


def _fit_at_r0(x: np.ndarray, y: np.ndarray, w: np.ndarray, r0: np.ndarray, a_max: float | None,
               iterations: int) -> np.ndarray:
    """Least squares of each row's sigmoid with R0 pinned, from nine starts (as ``fit_sigmoid``): the best."""
    rows = x.shape[0]
    big = np.where(w > 0, x, np.nan)
    lo_x, hi_x = np.nanmin(np.where(w > 0, x, np.inf), axis=1), np.nanmax(np.where(w > 0, x, -np.inf), axis=1)
    hi_delta = np.maximum(a_max - r0, 0.0) if a_max is not None else np.full(rows, np.inf)
    lower = np.column_stack([r0, np.zeros(rows), lo_x - 3.0, np.full(rows, 1e-3)])
    upper = np.column_stack([r0, hi_delta, hi_x + 3.0, np.full(rows, 50.0)])
    span = np.clip(np.nanmax(np.where(w > 0, y, -np.inf), axis=1) - r0, 1e-3, np.maximum(hi_delta, 1e-3))
    best, best_ssr = np.full((rows, 4), np.nan), np.full(rows, np.inf)
    with np.errstate(all="ignore"):
        quart = np.nanquantile(big, [0.25, 0.5, 0.75], axis=1)
    for m0 in quart:
        for b0 in (0.5, 1.0, 2.0):
            start = np.column_stack([r0, span, np.nan_to_num(m0), np.full(rows, b0)])
            theta = sigmoid_refits(x, y, w, np.clip(start, lower, upper), lower, upper, iterations, dedupe=False)
            f = sigmoid_model(theta.T[:, :, None], x)  # (rows, points)
            ssr = np.nansum(w * (f - y) ** 2, axis=1)
            better = np.isfinite(theta).all(axis=1) & (ssr < best_ssr)
            best[better], best_ssr[better] = theta[better], ssr[better]
    return best


@dataclass(frozen=True)
class KeyRewards:
    """Per key at one C: mean reward, its variance (pooled seeds + R0), seeds, R0 sensitivity; ``df`` pooled."""

    keys: np.ndarray
    reward: np.ndarray
    var: np.ndarray
    seeds: np.ndarray
    r0_weight: np.ndarray
    seed_var: np.ndarray  # the pooled (or the key's own, when larger) seed-to-seed variance of one run
    df: int


def key_rewards(curves: RunCurves, c: float) -> KeyRewards:
    """Each key's reward at C with the pooled variance of science §9.3 (module docstring)."""
    pred, weight = curves.predict(c)
    ok = np.isfinite(pred)
    keys = np.array(sorted(set(curves.key[ok].tolist())), dtype=int)
    reward, own, seeds, rw = (np.full(len(keys), math.nan) for _ in range(4))
    ss, df = 0.0, 0
    for i, k in enumerate(keys):
        p = pred[ok & (curves.key == k)]
        seeds[i], reward[i], rw[i] = p.size, p.mean(), weight[ok & (curves.key == k)].mean()
        if p.size > 1:
            own[i] = p.var(ddof=1)
            ss, df = ss + own[i] * (p.size - 1), df + p.size - 1
    pooled = ss / df if df else math.nan
    seed_var = np.fmax(pooled, own) if df else np.full(len(keys), math.nan)
    if curves.noise_floor is not None and df:  # never below what the runs' own evaluation noise leaves
        noise = np.array([curves.noise_floor[ok & (curves.key == k)].mean() for k in keys])
        seed_var = np.fmax(seed_var, noise)
    r0_var = curves.r0_var if math.isfinite(curves.r0_var) else 0.0
    var = seed_var / seeds + rw**2 * r0_var
    return KeyRewards(keys, reward, var, seeds.astype(int), rw, seed_var, df)


def paired_refits(curves: RunCurves, c: float, resamples: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``(keys, (resamples, keys))``: each key's reward at C on runs resampled with the same slot indices for every
    key, R0 re-estimated from the resampled runs' step-0 evaluations (to first order in each run's curve)."""
    pred, weight = curves.predict(c)
    ok = np.isfinite(pred)
    keys = np.array(sorted(set(curves.key[ok].tolist())), dtype=int)
    u = np.random.default_rng(seed).random((resamples, max([int((ok & (curves.key == k)).sum()) for k in keys] + [1])))
    picks = {int(k): np.flatnonzero(ok & (curves.key == k)) for k in keys}
    chosen = {k: idx[np.floor(u[:, :idx.size] * idx.size).astype(int)] for k, idx in picks.items()}
    step0 = np.concatenate([curves.r0_step0[v] for v in chosen.values()], axis=1)
    r0_b = np.nanmean(step0, axis=1) if np.isfinite(step0).any() else np.full(resamples, curves.r0)
    shift = np.nan_to_num(r0_b - curves.r0)
    out = np.column_stack([(pred[v] + weight[v] * shift[:, None]).mean(axis=1) for v in chosen.values()])
    return keys, out


DECISION_TABLE_COLUMNS = ["key", "reward", "reward_lo", "reward_hi", "seeds", "c_seen", "extrapolated", "unknown",
                          "leader", "leader_share", "decided", "df", "d", "d_lo", "d_hi", "settled", "within_tolerance",
                          "settled_by", "status"]


def decide(curves: RunCurves, c_star: float, tolerance: float, eta: float, rollout_axis: bool = False,
           reward_max: float | None = 1.0, level: float = LEVEL, resamples: int = 200, seed: int = 0,
           leader: int | None = None) -> pd.DataFrame:
    """One row per key: the decision at C* (science §9.4).

    Columns: ``key, reward, reward_lo, reward_hi, d, d_lo, d_hi, status, settled, settled_by, within_tolerance,
    extrapolated, unknown, seeds, c_seen, leader, leader_share, decided, df``. ``d = R_k(C*) - R_L(C*)`` with its
    ``level`` interval; settled: ``d_hi <= tolerance`` (``d_hi <= 0`` where the key's or the leader's curve is read
    past its data, extrapolated), or (``rollout_axis``, A2) a smaller n the leader beats at the
    largest budget both reached (``d_hi < 0`` there); within tolerance: ``d_lo >= -tolerance``; decided: every
    key but the leader settled. An unknown key (C* past eta x ``c_seen``) has bounds only and is never settled at C*.
    ``leader``: a key known at C* to lead instead of the largest median (the search's answer, when it decided the
    group: the fit stage then reads every D against the key the search named).
    """
    keys_all = np.array(sorted(set(curves.key.tolist())), dtype=int)
    c_seen = {int(k): float(curves.reach[curves.key == k].min()) for k in keys_all}
    est = key_rewards(curves, c_star)
    q = float(student_t.ppf(0.5 + level / 2, est.df)) if est.df else math.nan
    idx = {int(k): i for i, k in enumerate(est.keys)}
    known = [int(k) for k in est.keys if c_star <= eta * c_seen[int(k)] * (1 + 1e-9)]
    cap = reward_max if reward_max is not None else math.inf
    floor = 0.0 if reward_max is not None else -math.inf  # 0/1 rewards: the interval is clipped to [0, 1]
    # the columns are built as lists and the frame made once at the end: the search calls this ~1,700 times
    # in a simulated study set, where a column written at a time cost 3/4 of its time (pandas' per-call overhead)
    rows = []
    for k in keys_all:
        k = int(k)
        i = idx.get(k)
        r = est.reward[i] if i is not None else math.nan
        half = q * math.sqrt(est.var[i]) if i is not None else math.nan
        row = {"key": k, "reward": r, "reward_lo": max(r - half, floor), "reward_hi": min(r + half, cap),
               "seeds": int(est.seeds[i]) if i is not None else int((curves.key == k).sum()), "c_seen": c_seen[k],
               "extrapolated": c_star > c_seen[k] * (1 + 1e-9), "unknown": k not in known}
        if row["unknown"]:  # bounds only: where its runs end, and the cap
            at_end = key_rewards(curves, c_seen[k])
            j = list(at_end.keys).index(k) if k in at_end.keys else None
            lo = at_end.reward[j] - q * math.sqrt(at_end.var[j]) if j is not None else math.nan
            row.update(reward=math.nan, reward_lo=max(lo, floor) if math.isfinite(lo) else lo, reward_hi=cap)
        row.update(d=math.nan, d_lo=math.nan, d_hi=math.nan, settled_by="", within_tolerance=False)
        rows.append(row)
    lead, share = None, math.nan
    if known:
        keys_b, refits = paired_refits(curves, c_star, resamples, seed)
        cols = [list(keys_b).index(k) for k in known]
        medians = np.median(refits[:, cols], axis=0)
        lead = leader if leader in known else known[int(np.argmax(medians))]
        share = float(np.mean(np.argmax(refits[:, cols], axis=1) == known.index(lead)))
        li = idx[lead]
        [lead_row] = [row for row in rows if row["key"] == lead]
        lead_extrapolated = lead_row["extrapolated"]
        for row in rows:
            k = row["key"]
            if k == lead:
                row.update(d=0.0, d_lo=0.0, d_hi=0.0)
                continue
            if row["unknown"]:
                d, d_lo = math.nan, row["reward_lo"] - lead_row["reward_hi"]
                d_hi = row["reward_hi"] - lead_row["reward_lo"]
            else:
                i = idx[k]
                d = est.reward[i] - est.reward[li]
                var = est.seed_var[i] / est.seeds[i] + est.seed_var[li] / est.seeds[li] + \
                    (est.r0_weight[i] - est.r0_weight[li]) ** 2 * (curves.r0_var if math.isfinite(curves.r0_var) else 0)
                d_lo, d_hi = d - q * math.sqrt(var), d + q * math.sqrt(var)
            # read past the data (A3) a curve's bias is not in the seeds' spread (simulated late bloomers: 0.02-0.03
            # low at C* from 0.71 C*): there a key is settled only below the leader, without epsilon's credit
            bound = 0.0 if row["extrapolated"] or lead_extrapolated else tolerance
            settled_by = "tolerance" if (not row["unknown"] and d_hi <= bound) else ""
            if not settled_by and rollout_axis and k < lead and _beaten_where_both_ran(curves, k, lead, c_seen, q):
                settled_by = "a2"
            if reward_max is not None:
                d_lo, d_hi = max(d_lo, -reward_max), min(d_hi, reward_max)
            row.update(d=d, d_lo=d_lo, d_hi=d_hi, settled_by=settled_by,
                       within_tolerance=bool(not row["unknown"] and d_lo >= -tolerance))
    decided = bool(known) and all(row["settled_by"] != "" for row in rows if row["key"] != lead)
    for row in rows:
        settled = row["settled_by"] != ""
        row["status"] = ("leader" if row["key"] == lead else "within tolerance" if row["within_tolerance"] else
                         "settled" if settled else "unknown" if row["unknown"] else "open") if known else "unknown"
        row.update(leader=lead, leader_share=share, decided=decided, df=est.df, settled=settled)
    return pd.DataFrame(rows, columns=DECISION_TABLE_COLUMNS)


def _beaten_where_both_ran(curves: RunCurves, k: int, lead: int, c_seen: dict[int, float], q: float) -> bool:
    """A2 (science §9.4): the leader beats the smaller n at the largest budget both reached (upper bound of D < 0)."""
    at = key_rewards(curves, min(c_seen[k], c_seen[lead]))
    ks = list(at.keys)
    if k not in ks or lead not in ks or not math.isfinite(q):
        return False
    i, j = ks.index(k), ks.index(lead)
    var = at.seed_var[i] / at.seeds[i] + at.seed_var[j] / at.seeds[j]
    return bool(at.reward[i] - at.reward[j] + q * math.sqrt(var) < 0)
