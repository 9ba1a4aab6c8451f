"""Why a study has no answer when the cause is what ran, not the fit.

Before the fit's reasons (too few evaluations, overlapping intervals: :mod:`rollscale.report.answer`)
come the causes that make them moot, each with the fix that applies to it: runs that did not
finish (interrupted, failed), runs that did not learn (validation avg@k never rose above its
step-0 value by more than its noise), noise estimates that are infinite or undefined (science
§6.2: B_simple = s / |G|^2 is infinite when the measured signal |G|^2 <= 0), and buckets whose
training split cannot fill one step's batch. Plain functions over the report's tables.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from rollscale.config.sections import MeasureParams
from rollscale.core.grpo.shaping import KL_MOVED, lr_to_move, round_up
from rollscale.core.noise.pooled import PIECES, pooled_noise, prompts_to_resolve
from rollscale.core.problems.buckets import bounds_holding
from rollscale.report.base import as_numeric, bucket_bounds, fmt_value, params_dict

__all__ = ["ENDED", "blocking_reasons", "infinite_noise", "measure_fix", "noise_reason", "runs_as_ended",
           "runs_reached_text"]

ENDED = ("finished", "stopped")  # stopped: ended by the search short of C_max (science §9.4)
LEARN_SE = 2.0  # a gain over step 0 within 2 standard errors of the two evaluations is noise


def runs_as_ended(runs: pd.DataFrame, steps: pd.DataFrame | None) -> pd.DataFrame:
    """The ``runs`` table as the report shows it once the sweep is not running: a run still marked
    "running" was interrupted (its row is written "running" with 0 steps when it starts), so it
    is "interrupted" at its last committed step and C, as ``rollscale status`` says."""
    if "status" not in runs.columns:
        return runs
    out = runs.copy()
    out["status"] = out["status"].astype("string")
    open_ = out["status"].isin(["running"])
    if not open_.any():
        return out
    out.loc[open_, "status"] = "interrupted"
    if steps is not None and {"run_id", "step", "c"} <= set(steps.columns) and len(steps):
        last = steps.assign(step=as_numeric(steps["step"]), c=as_numeric(steps["c"])) \
            .groupby(steps["run_id"].astype(str))[["step", "c"]].max()
        ids = out.loc[open_, "run_id"].astype(str)
        for col, name in (("steps", "step"), ("c", "c")):
            if col in out.columns:
                out.loc[open_, col] = ids.map(last[name]).fillna(0).to_numpy()
    return out


def runs_reached_text(runs: pd.DataFrame | None) -> str:
    """What the runs did against their budget, for a caption: "every run trained to C_max" only
    when that is so."""
    if runs is None or not {"status", "c", "c_max"} <= set(runs.columns) or runs.empty:
        return "no run has ended yet"
    reached = (runs["status"].astype(str) == "finished") & (as_numeric(runs["c"]) >= as_numeric(runs["c_max"]))
    if reached.all():
        return "every run trained to C_max"
    counts = runs.loc[~reached, "status"].astype(str).value_counts()
    others = ", ".join(f"{n} {s}" for s, n in counts.items())
    return f"{int(reached.sum())} of {len(runs)} runs trained to C_max ({others})"


def _unfinished(runs: pd.DataFrame) -> str | None:
    status = runs["status"].astype(str)
    ended = status.isin(ENDED)
    if ended.all():
        return None
    failed = runs[status == "failed"]
    why = ""
    if len(failed) and "error" in failed:
        why = f"; {len(failed)} failed ({str(failed['error'].iloc[0])[:120]}): fix that error first"
    open_ = runs[~ended & (status != "failed")]
    where = ""
    if len(open_) and "steps" in open_:
        at = sorted({int(s) for s in as_numeric(open_["steps"]).fillna(0)})
        where = f", the others stopped at step {', '.join(map(str, at[:4]))}{' ...' if len(at) > 4 else ''}"
    return (f"{int(ended.sum())} of {len(runs)} runs finished{where}{why}: run `rollscale study` to resume them "
            "(finished runs are kept, the others go on from their last checkpoint)")


KL_LAST_STEPS = 3  # a run's KL to its start, read at its end over this many measured steps


def _sweep_value(params: Mapping[str, Any] | Any | None, *keys: str) -> float | None:
    """``sweep.<keys>`` as params.yaml sets it, a positive finite number, else None; ``params`` the parsed tree or
    the validated StudyParams the report stage passes (read as a mapping only, the stage's own report
    never named lr_base)."""
    try:
        node = params_dict(params)["sweep"]
        for key in keys:
            node = node[key]
        value = float(node)
    except (KeyError, TypeError, ValueError):
        return None
    return value if math.isfinite(value) and value > 0 else None


def _not_learning(runs: pd.DataFrame, evals: pd.DataFrame | None, steps: pd.DataFrame | None = None,
                  params: Mapping[str, Any] | None = None) -> str | None:
    """No run's validation avg@k rose above its step-0 value by more than LEARN_SE standard errors; the fix names
    ``lr_base`` as params.yaml has it and the rate the runs' own KL to their start suggests."""
    if evals is None or not {"run_id", "step", "avg_at_k"} <= set(evals.columns) or evals.empty:
        return None
    e = evals.assign(run_id=evals["run_id"].astype(str), step=as_numeric(evals["step"]),
                     avg_at_k=as_numeric(evals["avg_at_k"]),
                     se=as_numeric(evals["avg_at_k_se"]) if "avg_at_k_se" in evals else 0.0)
    e = e.dropna(subset=["step", "avg_at_k"]).sort_values(["run_id", "step"])
    gains = []
    for _, g in e.groupby("run_id"):
        if len(g) < 2 or g["step"].iloc[0] != 0:
            continue
        first, rest = g.iloc[0], g.iloc[1:]
        gain = float(rest["avg_at_k"].max() - first["avg_at_k"])
        noise = LEARN_SE * float(np.hypot(first["se"], rest["se"].max())) if pd.notna(first["se"]) else 0.0
        gains.append((gain, noise))
    if not gains or any(gain > noise for gain, noise in gains):
        return None
    best = max(gain for gain, _ in gains)
    said = (f"no run learned: in all {len(gains)} runs validation avg@k rose at most {best:+.3f} over its step-0 "
            f"value, within {LEARN_SE:g} standard errors")
    lr_base = _sweep_value(params, "train", "lr_base")  # a run's lr is it scaled by sqrt(B / b_base)
    if lr_base is None:
        lr = f" (runs' lr up to {fmt_value(as_numeric(runs['lr']).max())})" if "lr" in runs else ""
        return said + f": raise sweep.train.lr_base{lr} or the budget sweep.c_max"
    kl = _run_kl(steps)
    more = _c_max_more(params)
    if kl is None:
        return (said + f": raise sweep.train.lr_base (now {lr_base:g}) or the budget {more}; the runs measured "
                "no KL to their start (sweep.train.kl_coef 0), so no rate is suggested")
    low, high = kl
    if low >= KL_MOVED:
        return (said + f", though they moved the policy (KL to the start {low:.2g} to {high:.2g} at their end, past "
                f"{KL_MOVED:.2g}): a larger budget ({more}), an easier bucket, or a stronger model; "
                f"sweep.train.lr_base ({lr_base:g}) is not what holds it back")
    need = lr_to_move(lr_base, low)
    moved = (f"the policy barely moved (KL to the start up to {high:.2g} at the runs' end, below {KL_MOVED:.2g})"
             if high < KL_MOVED else f"some runs barely moved the policy (KL to the start {low:.2g} to {high:.2g} "
             f"at their end; {KL_MOVED:.2g} is moved)")
    return (said + f", and {moved}: sweep.train.lr_base: {round_up(need):g} (now {lr_base:g}; KL grows "
            f"with lr^2), or {more}")


def _run_kl(steps: pd.DataFrame | None) -> tuple[float, float] | None:
    """(least, most) over the runs of each run's KL to its start at its end: the median of its last
    :data:`KL_LAST_STEPS` measured steps (one step's estimate on a few rollouts is noisy: SmolLM2 runs of an hour study
    ended at 1.6e-4 to 2.0e-3 with single steps up to 8e-3); None when no run measured one."""
    if steps is None or not {"run_id", "step", "kl"} <= set(steps.columns) or steps.empty:
        return None
    s = steps.assign(kl=as_numeric(steps["kl"]), step=as_numeric(steps["step"])).dropna(subset=["kl", "step"])
    if s.empty:
        return None
    by_run = s.sort_values("step").groupby(s["run_id"].astype(str))["kl"]
    end = by_run.apply(lambda k: float(k.tail(KL_LAST_STEPS).median()))
    return float(end.min()), float(end.max())


def _c_max_more(params: Mapping[str, Any] | Any | None) -> str:
    """A larger ``sweep.c_max`` with a value: 4 x the study's (a run's steps grow with it)."""
    c_max = _sweep_value(params, "c_max")
    return f"sweep.c_max: {4 * int(c_max)} (4 x the steps)" if c_max is not None else "a larger sweep.c_max"


def infinite_noise(noise: pd.DataFrame | None, prompts: pd.DataFrame | None = None,
                   counts: pd.DataFrame | None = None, measure: MeasureParams | None = None) -> str | None:
    """Every measured B_simple (or K_crit) infinite or undefined, with its fix (:func:`noise_reason`)."""
    reason = noise_reason(noise, prompts, counts, measure)
    return None if reason is None else f"{reason[0]}: {reason[1]}"


def noise_reason(noise: pd.DataFrame | None, prompts: pd.DataFrame | None = None,
                 counts: pd.DataFrame | None = None, measure: MeasureParams | None = None) -> tuple[str, str] | None:
    """(what, fix) when every measured B_simple (or K_crit) is infinite or undefined: the measured signal
    |G|^2 <= 0; the fix with the measure settings that would resolve it (:func:`measure_fix`)."""
    if noise is None or noise.empty:
        return None
    bad = []
    for col in ("b_simple", "k_crit"):
        if col in noise:
            v = as_numeric(noise[col])
            if len(v) and (~np.isfinite(v.to_numpy(dtype=float))).all():
                bad.append(col)
    if not bad:
        return None
    return (f"the noise estimates are infinite or undefined ({', '.join(bad)} in every measured step: the "
            "between-prompt signal |G|^2 measured <= 0, science §6.2), so no critical batch is predicted",
            measure_fix(measure or MeasureParams(), prompts, counts))


def measure_fix(measure: MeasureParams, prompts: pd.DataFrame | None, counts: pd.DataFrame | None) -> str:
    """``measure.b_problem`` and ``measure.steps`` that would resolve |G|^2, sized from the measured prompts
    (:func:`rollscale.core.noise.pooled.prompts_to_resolve`): a step holds at most the measure bucket's training
    problems (``counts``), the rest goes to steps: a fix printed without values could not be applied."""
    default = MeasureParams()
    row = counts[counts["bucket"].astype(str) == measure.bucket] if counts is not None and "train" in counts else None
    cap = int(as_numeric(row["train"]).iloc[0]) if row is not None and len(row) else None
    leave = "; or leave it: the decision at C* does not use these estimates (only the report's CRS check does)"
    if cap is not None and cap < 3:
        return (f"measure.bucket: a bucket with 3 or more training problems ({measure.bucket!r} holds {cap}; the "
                "pooled estimate needs 3 prompts a step)" + leave)
    # the shape measured (its steps and prompts a step), not params', which may have changed since: a fix applied
    # and not yet measured is named again, not doubled
    usable = prompts is not None and {"n", "step", *PIECES} <= set(prompts.columns)
    steps_now, b_now = measure.steps, measure.b_problem
    if usable and len(prompts):
        steps_now = int(prompts.groupby("n")["step"].nunique().max())
        b_now = int(prompts.groupby(["n", "step"]).size().max())
    # prompts a step: at least the default's, at most the bucket's training problems; the rest goes to steps
    b = min(max(b_now, default.b_problem), cap or 10**9)
    need, measured, at_least, few = 0, 0, False, False
    for n, g in prompts.groupby("n") if usable else ():
        try:
            pooled = pooled_noise(g, int(n), resamples=400)
        except ValueError:  # fewer than 3 prompts a step: no pooled estimate at all
            few = True
            continue
        r = prompts_to_resolve(pooled)
        if r is not None:
            need, measured, at_least = max(need, r[0]), max(measured, pooled.prompts), at_least or r[1]
    rerun = ", then rerun the measure stage"
    if need == 0:  # nothing sizes the signal: the default measurement, or twice the steps measured
        why = "fewer than 3 prompts a step pool nothing" if few else "how many would resolve it is unknown"
        return f"measure.b_problem: {b}, measure.steps: {max(2 * steps_now, default.steps)} ({why}){rerun}" + leave
    return (f"measure.b_problem: {b}, measure.steps: {max(steps_now, math.ceil(need / b))} "
            f"({'at least ' if at_least else 'about '}{need:,} prompts resolve |G|^2, "
            f"{need / measured:.0f} x those measured){rerun}" + leave)


def _small_buckets(runs: pd.DataFrame, counts: pd.DataFrame | None, profile: pd.DataFrame | None = None,
                   params: Mapping[str, Any] | Any | None = None) -> str | None:
    if counts is None or not {"bucket", "train"} <= set(counts.columns) or "b_problem" not in runs:
        return None
    small, wider = [], []
    for bucket, g in runs.groupby(runs["bucket"].astype(str) if "bucket" in runs else pd.Series("", runs.index)):
        row = counts[counts["bucket"].astype(str) == bucket]
        if row.empty:
            continue
        train, need = int(as_numeric(row["train"]).iloc[0]), int(as_numeric(g["b_problem"]).max())
        if train < need:
            small.append(f"'{bucket}' has {train} training problems for B_problem up to {need}")
            val = int(as_numeric(row["val"]).iloc[0]) if "val" in row else 0
            wider.append(_bounds_holding(bucket, val + need, profile, params))
    if not small:
        return None
    widen = "; ".join(w for w in wider if w) or "widen the bucket (bucket.*)"
    return (f"a bucket too small: {'; '.join(small)}, so every step repeats problems: {widen}, or profile more "
            "problems (data.limit for a table), or lower sweep.b_problem")


def _bounds_holding(bucket: str, need: int, profile: pd.DataFrame | None,
                    params: Mapping[str, Any] | Any | None) -> str | None:
    """Bounds of ``bucket`` that hold ``need`` profiled problems (its validation split and one batch), from the
    profile's pass rates ("widen the bucket" named none); None where the profile or bounds are unknown
    or no bounds hold them."""
    if profile is None or "avg_at_k" not in profile:
        return None
    try:
        bounds = bucket_bounds(params_dict(params))
    except ValueError:
        return None
    if bucket not in bounds:
        return None
    avg = as_numeric(profile["avg_at_k"]).dropna()
    held = bounds_holding(avg, need, bounds[bucket])
    if held is None:
        return None
    return (f"bucket.{bucket}: [{held[0]:g}, {held[1]:g}] (holds {int(avg.between(*held).sum())} of the "
            f"{len(avg)} profiled; {need} fill its validation split and a batch)")


def blocking_reasons(t: Mapping[str, pd.DataFrame | None], params: Mapping[str, Any] | None = None) -> list[str]:
    """The causes that leave the study without an answer before any fit, each with its fix, in the
    order to address them (an unfinished sweep first: the others may be its consequence); ``params``: the
    study's params tree, whose values the fixes name."""
    runs = t.get("runs")
    if runs is None or runs.empty or "status" not in runs:
        return []
    runs = runs_as_ended(runs, t.get("steps"))
    # infinite noise estimates are not among them: the decision does not use them (only the CRS check does), and
    # the default study's K_crit is infinite in every step; a study said "No answer yet" for it beside a decision
    found = [_unfinished(runs), _small_buckets(runs, t.get("bucket_counts"), t.get("profile"), params),
             _not_learning(runs, t.get("evals"), t.get("steps"), params)]
    return [r for r in found if r]
