"""The forecast of a key's reward at any budget C*, past the data too (science §10.2): the ``forecast`` table.

For every design group: the surface of :mod:`rollscale.core.fit.surface` (every run of the group at once,
partial pooling of the keys, A4), its bootstrap refits (:func:`rollscale.core.fit.surface.surface_refits`: seed
slots resampled paired across keys, evaluation noise redrawn, R0 re-estimated, the deviations' prior perturbed,
their sd tau drawn per refit: :func:`rollscale.core.fit.surface.tau_draws`),
and per key ``R_k(C*)`` with a 95 % interval, ``D_k = R_k - R_leader`` read refit by refit, for trained keys and
for keys between or beyond them (``trained`` false: the line's parameters plus a deviation drawn from
N(0, tau^2) at the refit's tau, so their interval holds the spread keys show about the line).

Interval. The refits' 2.5 / 97.5 percentiles, moved out from the point estimate by ``sqrt(S / (S - 1))`` (S: the
median runs per trained key): a resample of S runs spreads (S - 1) / S as much as new runs would (science §7's
expanded-percentile reasoning, Hesterberg 2015); with 2 seeds the pairing across keys, the redrawn noise and the
perturbed prior give the refits their variety. Clipped to what the quantity can be (a reward in [0, a_max], a D
in [-a_max, a_max]). A key is ``unknown`` when its interval is wider than ``max_width`` (science §10.2: the
interval speaks, not a fixed eta). The leader is the trained key with the largest median over refits; when it is unknown
the group has no answer at C* (its row says so). An untrained key is never the leader (its D says whether the
bracket should add it: ``d_lo > 0``).

How the fit stage calls it (not wired yet; the lead does it after the pipeline's restructure): per design group
of :func:`rollscale.core.fit.tables.design_groups` with a numeric key (n or B_problem; a rule keeps §9's per-key
fit), pass the group's evaluations merged with its runs (columns ``run_id, c, avg_at_k``, the key column, and
``seed`` for the pairing) with ``group_col`` naming the group, ``c_star = study.target_budget``, and
``ForecastSettings(eval_draws = validation problems x k of avg@k, resamples = fit.bootstrap_resamples, seed =
the fit's bootstrap seed)``::

    table = forecast_table(evals_with_runs, key_col="n", group_col="group", c_star=160_000,
                           settings=ForecastSettings(eval_draws=100 * 16))

It returns :data:`FORECAST_COLUMNS` (docs/tables.md, ``forecast``), one row per group and key (the trained keys
and the powers of two from half the smallest to twice the largest, or ``keys``). The backtest
(:func:`rollscale.core.fit.backtest.backtest`) and the cap (:func:`rollscale.core.fit.climb.climb_caps`) take the
same evaluations.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
from scipy.stats import t as student_t

from rollscale.core.fit.climb import accelerating_rise, acceleration, group_accelerating, steepest_rise
from rollscale.core.fit.decision import RunCurves, fit_runs, key_rewards
from rollscale.core.fit.forms import DEFAULT_FORM, FittedForm, FormSettings, fit_form
from rollscale.core.fit.surface import (
    Surface,
    SurfaceData,
    fit_surface,
    key_parameters,
    prepare,
    refit_surface,
    reward,
    surface_refits,
    tau_draws,
)

__all__ = ["DEFAULT_MULTIPLE", "FORECAST_COLUMNS", "ForecastSettings", "SurfaceBootstrap", "answer_multiple",
           "bootstrap_surface", "default_keys", "forecast_group", "forecast_table", "interval", "leader_index",
           "predict", "same_runs", "spread", "to_leader", "unfit_reason"]

DEFAULT_MULTIPLE = 2.0  # without C*: §10.3's half
FORECAST_COLUMNS = [
    "group", "key", "trained", "c_star", "reward", "reward_lo", "reward_hi", "d", "d_lo", "d_hi", "leader",
    "unknown", "width", "extrapolated", "seeds", "c_seen", "per_run", "per_run_lo", "per_run_hi", "a", "c_mid",
    "beta", "form", "continued_hi", "reason",
]


@dataclass(frozen=True)
class ForecastSettings:
    """``resamples`` bootstrap refits; ``eval_draws`` the 0/1 samples behind one evaluation (validation problems x
    k; None: no redraw); ``max_width`` the widest interval that is still an answer; ``a_max`` the reward's cap."""

    resamples: int = 200
    eval_draws: int | None = None
    max_width: float = 0.15
    level: float = 0.95
    seed: int = 0
    a_max: float | None = 1.0
    perturb: bool = True  # the refits' perturbed prior (rollscale.core.fit.surface.surface_refits)
    tau_spread: bool = True  # tau drawn per refit (rollscale.core.fit.surface.tau_draws); False: held
    form: str = DEFAULT_FORM  # the shape (rollscale.core.fit.forms; "surface": science §10.1's)
    ceiling: float | None = None  # the base's pass@k on the validation problems (science §11.2); None: a_max
    widen: float = 1.0  # the backtest's calibration of the interval (rollscale.core.fit.backtest.calibration)
    widen_d: float = 1.0  # and of D's, from the backtest's errors of D (a bias common to the keys cancels in D)
    multiple: float = DEFAULT_MULTIPLE  # the answer's multiple C* / c_max (answer_multiple): a form's own backtest cuts there

    def __post_init__(self) -> None:
        if self.resamples < 2:
            raise ValueError(f"forecast resamples: expected >= 2, got {self.resamples}")
        if not 0 < self.level < 1:
            raise ValueError(f"forecast level: expected in (0, 1), got {self.level}")
        if not (self.widen >= 1.0 and self.widen_d >= 1.0):
            raise ValueError(f"forecast widen: expected >= 1, got {self.widen} (D: {self.widen_d})")
        if not self.multiple > 1.0:
            raise ValueError(f"forecast multiple: expected > 1, got {self.multiple}")

    def form_settings(self, resample_runs: bool = True) -> FormSettings:
        """What the form's fit reads of these settings (:class:`rollscale.core.fit.forms.FormSettings`)."""
        return FormSettings(self.resamples, self.eval_draws, self.seed, self.top, resample_runs, self.multiple)

    def at_answer(self, evals: pd.DataFrame, c_star: float) -> ForecastSettings:
        """These settings with ``multiple`` the answer's (:func:`answer_multiple`) for ``evals`` read at
        ``c_star``."""
        return replace(self, multiple=answer_multiple(evals, c_star))

    @property
    def top(self) -> float:
        """The largest reward a key can reach: the pass@k ceiling where given, else ``a_max``."""
        caps = [v for v in (self.a_max, self.ceiling) if v is not None]
        return min(caps) if caps else math.inf


@dataclass(frozen=True)
class SurfaceBootstrap:
    """A group's surface, its refits and what a prediction needs."""

    data: SurfaceData
    surface: Surface | None  # the §10.1 surface (its a, c_mid, beta columns); None where it could not be fitted
    thetas: np.ndarray  # (resamples, 3K + 6): the surface's refits (form "surface"), else empty
    r0s: np.ndarray  # (resamples,)
    seeds: int  # median runs per trained key
    settings: ForecastSettings
    taus: np.ndarray | None = None  # (resamples, 3): each refit's tau; None: the surface's
    form: FittedForm | None = None  # another form's fit (settings.form), with its refits
    reason: str = ""  # why the group has no forecast (degenerate data); "" when it has one


def answer_multiple(evals: pd.DataFrame, c_star: float) -> float:
    """``C* / c_max`` with c_max the largest budget the group's runs reached: the multiple the answer is read
    past the data (at least :data:`DEFAULT_MULTIPLE`, the backtest's smallest; science §11.4)."""
    return max(float(c_star) / float(evals["c"].max()), DEFAULT_MULTIPLE)


def unfit_reason(data: SurfaceData, top: float) -> str:
    """Why a group's evaluations carry no forecast, in words a report can show; "" when they do."""
    if not np.isfinite(data.step0).any():
        return "no step-0 (C = 0) evaluation: the forecast needs the group's R0 (science §9.2)"
    r0 = float(np.nanmean(data.step0))
    if r0 >= top - 1e-9:
        return "validation solved at step 0: nothing to learn on this bucket"
    budgets = [np.unique(data.log10_c[data.point_key == i]).size for i in range(len(data.keys))]
    if not budgets or max(budgets) < 2:
        return (f"not enough evaluations to fit: {max(budgets, default=0)} budget(s) past step 0 a key "
                "(at least 2 needed)")
    values = np.concatenate([data.y, data.step0[np.isfinite(data.step0)]])
    if np.ptp(values) < 1e-12:
        return (f"every evaluation reads {values[0]:.3f}: a flat curve"
                + (": no run learned on this bucket" if values[0] <= 0 else "") + ", nothing to extrapolate")
    return ""


def bootstrap_surface(evals: pd.DataFrame, key_col: str, settings: ForecastSettings) -> SurfaceBootstrap:
    """Fit one group's form (``settings.form``; the §10.1 surface beside it for its parameters) and its
    ``settings.resamples`` refits (science §10.2, §11.2). Degenerate data give ``reason``, never an error."""
    data = prepare(evals, key_col)
    seeds = int(np.median(np.bincount(data.run_key))) if data.run_key.size else 0
    empty = np.empty((0, 3 * len(data.keys) + 6))
    reason = unfit_reason(data, settings.top)
    if reason:
        return SurfaceBootstrap(data, None, empty, np.empty(0), seeds, settings, reason=reason)
    if settings.form != "surface":
        try:
            surface = fit_surface(data, a_max=settings.a_max)
        except (ValueError, np.linalg.LinAlgError):
            surface = None
        form = fit_form(settings.form, data, settings.form_settings())
        return SurfaceBootstrap(data, surface, empty, np.empty(0), seeds, settings, form=form)
    surface = fit_surface(data, a_max=settings.top if math.isfinite(settings.top) else None)
    taus = tau_draws(surface, settings.resamples, settings.seed) if settings.tau_spread else None
    thetas, r0s = surface_refits(data, surface, settings.resamples, settings.eval_draws, settings.seed,
                                 settings.perturb, taus)
    return SurfaceBootstrap(data, surface, thetas, r0s, seeds, settings, taus)


def same_runs(boot: SurfaceBootstrap) -> SurfaceBootstrap:
    """``boot`` refitted for what these runs' own evaluations leave open (the backtest's A4 check): every run kept
    once (no seed resampled, no spread correction), the points weighed by their residual sd alone (the runs' design
    effect is the seeds' spread about the key's curve, which these runs' mean does not have); evaluation noise,
    R0 and the deviations' prior still redrawn. The point surface is refitted at that weight first."""
    s, surface = boot.settings, boot.surface
    if boot.reason:
        return boot
    if boot.form is not None:
        form = fit_form(s.form, boot.data, s.form_settings(resample_runs=False))
        return replace(boot, form=form, seeds=1)
    assert surface is not None
    if surface.s_points is not None:
        surface = replace(surface, s_eff=surface.s_points)
        point, _ = surface_refits(boot.data, surface, 1, None, s.seed, False, None, resample_runs=False)
        surface = replace(surface, theta=point[0])
    thetas, r0s = surface_refits(boot.data, surface, s.resamples, s.eval_draws, s.seed, s.perturb, boot.taus,
                                 resample_runs=False)
    return replace(boot, surface=surface, thetas=thetas, r0s=r0s, seeds=1)


def predict(boot: SurfaceBootstrap, keys: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(point (n,), refits (resamples, n))``: the reward of ``keys[i]`` at ``c[i]``. An untrained key takes a
    deviation from N(0, tau^2) per refit, the same for a key at every C (seeded by the key)."""
    keys, c = np.asarray(keys), np.asarray(c, float)
    if boot.reason:
        return np.full(keys.size, math.nan), np.full((max(boot.settings.resamples, 1), keys.size), math.nan)
    if boot.form is not None:
        return boot.form.predict(keys, c)
    assert boot.surface is not None
    point = reward(boot.surface.r0, key_parameters(boot.surface, keys), c)
    out = np.empty((len(boot.r0s), keys.size))
    tau = boot.surface.tau[None, :] if boot.taus is None else boot.taus
    draws = np.stack([np.random.default_rng([boot.settings.seed, 1, int(k)]).normal(size=(len(boot.r0s), 3))
                      for k in keys], axis=1) * tau[:, None, :]
    for b, (theta, r0) in enumerate(zip(boot.thetas, boot.r0s, strict=True)):
        refit = refit_surface(boot.surface, theta, r0)
        out[b] = reward(r0, key_parameters(refit, keys, draws[b]), c)
    return point, out


def interval(point: np.ndarray, refits: np.ndarray, spread: float, level: float,
             bounds: tuple[float, float]) -> tuple[np.ndarray, np.ndarray]:
    """The module docstring's interval: the refits' percentiles moved out from ``point`` by ``spread``, clipped."""
    tail = 50.0 * (1.0 - level)
    lo, hi = np.nanpercentile(refits, [tail, 100.0 - tail], axis=0)
    lo = point - spread * np.maximum(point - lo, 0.0)
    hi = point + spread * np.maximum(hi - point, 0.0)
    return np.clip(lo, *bounds), np.clip(hi, *bounds)


def spread(boot: SurfaceBootstrap, of_d: bool = False) -> float:
    """How far the refits' percentiles are moved out (module docstring): ``sqrt(S / (S - 1))``, S the median runs
    per trained key (1 with one run a key: no seed spread to correct), times the backtest's calibration
    (``settings.widen``, science §11.4; for D to the leader ``settings.widen_d``, calibrated on D's own errors)."""
    seeds = math.sqrt(boot.seeds / (boot.seeds - 1)) if boot.seeds > 1 else 1.0
    return seeds * (boot.settings.widen_d if of_d else boot.settings.widen)


def leader_index(refits: np.ndarray, candidates: np.ndarray) -> int:
    """The leader among ``candidates`` (indices of columns of ``refits``): the largest median over refits
    (science §9.4)."""
    return int(candidates[int(np.argmax(np.nanmedian(refits[:, candidates], axis=0)))])


def to_leader(point: np.ndarray, refits: np.ndarray, lead: int, boot: SurfaceBootstrap, level: float,
              top: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``D_k = R_k - R_lead`` refit by refit: its point and interval, moved out by D's own calibration."""
    d_point = point - point[lead]
    d_lo, d_hi = interval(d_point, refits - refits[:, [lead]], spread(boot, of_d=True), level, (-top, top))
    return d_point, d_lo, d_hi


def default_keys(trained: np.ndarray) -> np.ndarray:
    """The trained keys and every power of two from half the smallest to twice the largest."""
    lo, hi = math.floor(math.log2(min(trained))) - 1, math.ceil(math.log2(max(trained))) + 1
    powers = [2**i for i in range(max(lo, 0), hi + 1)]
    return np.array(sorted(set(int(k) for k in trained) | set(powers)))


def forecast_group(evals: pd.DataFrame, key_col: str, c_star: float, keys: np.ndarray | None = None,
                   settings: ForecastSettings = ForecastSettings(),
                   boot: SurfaceBootstrap | None = None, curves: RunCurves | None = None) -> pd.DataFrame:
    """One group's rows of the ``forecast`` table (module docstring; ``group`` left to the caller). ``boot`` and
    ``curves`` (:func:`rollscale.core.fit.decision.fit_runs`): the group's fits when the caller has them."""
    if not c_star > 0:
        raise ValueError(f"forecast c_star: expected > 0, got {c_star}")
    boot = boot if boot is not None else bootstrap_surface(evals, key_col, settings)
    data, s = boot.data, boot.surface
    keys = default_keys(data.keys) if keys is None else np.asarray(sorted(set(int(k) for k in keys)))
    if (keys <= 0).any():
        raise ValueError(f"forecast keys: expected positive keys (the forecast is in log2 {key_col}), "
                         f"got {keys.tolist()}")
    point, refits = predict(boot, keys, np.full(keys.size, float(c_star)))
    top = settings.top
    lo, hi = interval(point, refits, spread(boot), settings.level, (0.0, top))
    trained = np.isin(keys, data.keys)
    c_seen = {int(k): float(data.reach[data.run_key == i].min()) for i, k in enumerate(data.keys)}
    out = pd.DataFrame({"key": keys, "trained": trained, "c_star": float(c_star), "reward": point})
    out["seeds"] = [int((data.run_key == np.searchsorted(data.keys, k)).sum()) if t else 0
                    for k, t in zip(keys, trained, strict=True)]
    out["c_seen"] = [c_seen.get(int(k), math.nan) for k in keys]
    out["extrapolated"] = ~(out["c_seen"] >= c_star * (1 - 1e-9))
    continued = _continuation(boot, evals, key_col, keys, out["c_seen"].to_numpy(float), c_star)
    hi = np.fmax(hi, continued)
    lo, hi = _around(point, lo, hi, boot, (0.0, top))
    out["reward_lo"], out["reward_hi"], out["continued_hi"] = lo, hi, continued
    out["width"] = hi - lo
    out["unknown"] = ~(out["width"] <= settings.max_width)
    if s is not None:
        params = key_parameters(s, keys)
        out["a"], out["c_mid"], out["beta"] = params[:, 0], 10.0 ** params[:, 1], np.exp(params[:, 2])
    else:
        out["a"], out["c_mid"], out["beta"] = math.nan, math.nan, math.nan
    out["form"], out["reason"] = settings.form, boot.reason
    # every trained key may lead, an unknown one too: leading among the known keys only would answer with the
    # best key whose interval is narrow, which past the data is often not the best (measured: right fell to
    # 36 % in `cross` at 8 x C_max, where the wide key was the best)
    candidates = np.flatnonzero(trained & np.isfinite(point))
    out["leader"] = None
    for col in ("d", "d_lo", "d_hi"):
        out[col] = math.nan
    if candidates.size:
        lead = leader_index(refits, candidates)
        d_point, d_lo, d_hi = to_leader(point, refits, lead, boot, settings.level, top)
        # a key's continuation (science §11.3) bounds its D too: against the leader's lower bound
        d_hi = np.fmax(d_hi, continued - lo[lead])
        d_lo, d_hi = _around(d_point, d_lo, d_hi, boot, (-top, top))
        out["leader"], out["d"], out["d_lo"], out["d_hi"] = int(keys[lead]), d_point, d_lo, d_hi
        out.loc[lead, ["d", "d_lo", "d_hi"]] = 0.0
    return _with_per_run(out, evals, key_col, c_star, settings, curves)


def _continuation(boot: SurfaceBootstrap, evals: pd.DataFrame, key_col: str, keys: np.ndarray, c_seen: np.ndarray,
                  c_star: float) -> np.ndarray:
    """Per key, its own level where its runs end continued to C* at the group's steepest rise per doubling seen
    beyond its data (science §11.3, §10.4's cap), or, where its rise per doubling still grows (beyond noise on its
    own, or grows and the group's keys pooled grow beyond noise), with that growth
    (:func:`rollscale.core.fit.climb.accelerating_rise`), the larger: NaN for a key whose data reach C* or that
    neither reads."""
    out = np.full(keys.size, math.nan)
    short = np.isfinite(c_seen) & (c_seen < c_star * (1 - 1e-9))
    if boot.reason or not short.any():
        return out
    level, _ = predict(boot, keys[short], c_seen[short])
    accs = [acceleration(evals[evals[key_col] == keys[i]], float(c_seen[i])) for i in np.flatnonzero(short)]
    pooled = group_accelerating(accs)
    for j, i in enumerate(np.flatnonzero(short)):
        doublings = math.log2(c_star / c_seen[i])
        rise = steepest_rise(evals, key_col, beyond=float(c_seen[i]))
        rises = [max(rise, 0.0) * doublings] if math.isfinite(rise) else []
        acc = accs[j]
        if acc is not None and (acc.accelerating or (pooled and acc.last > max(acc.before, 0.0))):
            rises.append(accelerating_rise(acc, doublings))
        if rises:
            out[i] = min(level[j] + max(rises), boot.settings.top)
    return out


def _around(point: np.ndarray, lo: np.ndarray, hi: np.ndarray, boot: SurfaceBootstrap,
            bounds: tuple[float, float]) -> tuple[np.ndarray, np.ndarray]:
    """``[lo, hi]`` made to hold ``point`` and never a single value: a refit-less spread (all refits on one value,
    e.g. at the ceiling) takes one evaluation's standard error on each side, clipped to ``bounds``."""
    lo, hi = np.fmin(lo, point), np.fmax(hi, point)
    draws = boot.settings.eval_draws or 100
    se = np.sqrt(np.clip(point * (1 - point), 0.0025, None) / draws)
    flat = np.isfinite(point) & (hi - lo < 1e-6)
    lo = np.where(flat, np.clip(point - se, *bounds), lo)
    hi = np.where(flat, np.clip(point + se, *bounds), hi)
    return lo, hi


def _with_per_run(out: pd.DataFrame, evals: pd.DataFrame, key_col: str, c_star: float,
                  settings: ForecastSettings, curves: RunCurves | None) -> pd.DataFrame:
    """Beside each key whose runs all reached C*, the per-run §9.3 value and its t interval (science §10.2)."""
    out["per_run"], out["per_run_lo"], out["per_run_hi"] = math.nan, math.nan, math.nan
    within = out.loc[~out["extrapolated"], "key"]
    if within.empty or (out["reason"] != "").any():
        return out
    est = key_rewards(curves if curves is not None else fit_runs(evals, key_col, settings.a_max), c_star)
    q = float(student_t.ppf(0.5 + settings.level / 2, est.df)) if est.df else math.nan
    for k, r, v in zip(est.keys, est.reward, est.var, strict=True):
        row = out.index[out["key"] == k]
        if int(k) in set(within.tolist()):
            out.loc[row, ["per_run", "per_run_lo", "per_run_hi"]] = [r, r - q * math.sqrt(v), r + q * math.sqrt(v)]
    return out


def forecast_table(evals: pd.DataFrame, key_col: str, group_col: str, c_star: float,
                   keys: np.ndarray | None = None,
                   settings: ForecastSettings = ForecastSettings()) -> pd.DataFrame:
    """The ``forecast`` table: :func:`forecast_group` for every group of ``group_col`` (each its own R0)."""
    if group_col not in evals.columns:
        raise ValueError(f"evals: missing the group column {group_col!r} (has {list(evals.columns)})")
    parts = []
    for g, rows in evals.groupby(group_col, sort=True):
        parts.append(forecast_group(rows, key_col, c_star, keys, settings).assign(group=g))
    if not parts:
        return pd.DataFrame(columns=FORECAST_COLUMNS)
    return pd.concat(parts, ignore_index=True)[FORECAST_COLUMNS]
