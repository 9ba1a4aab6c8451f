"""What the profile says of the model against the problem set, for ``rollscale check``.

A model that solves none of most problems' k samples (avg@k = 0) or all of them (avg@k = 1) leaves
the buckets between thin: GRPO learns only from groups whose rewards differ (science §2), so the
study trains on the few problems in between. Said after the profile, before the sweep spends
anything, with the truncation share beside it when cut answers may be the cause. Plain functions;
findings as (level, keys, message, fix) tuples that :mod:`rollscale.pipeline.check.findings` wraps.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from rollscale.config import StudyParams
from rollscale.core.fit import power
from rollscale.tables import TABLES

__all__ = ["EXTREME_SHARE_WARN", "model_fit_findings", "noise_findings"]

# share of the profiled problems at avg@k = 0 (or 1) above which the model is too weak (too strong)
# for the set: the SmolLM2 study had 86 % at 0 and an Easy bucket of 1-11 problems
EXTREME_SHARE_WARN = 0.5


def model_fit_findings(p: StudyParams, profile: pd.DataFrame | None) -> list[tuple[str, tuple[str, ...], str, str]]:
    """A warning when most profiled problems are never (or always) solved at avg@k."""
    if profile is None or profile.empty or "avg_at_k" not in profile:
        return []
    avg = pd.to_numeric(profile["avg_at_k"], errors="coerce")
    k = int(profile["k"].max()) if "k" in profile else p.profile.k
    zero, one = float((avg == 0).mean()), float((avg == 1).mean())
    between = int(((avg > 0) & (avg < 1)).sum())
    cut = float(pd.to_numeric(profile["trunc_rate"], errors="coerce").mean()) if "trunc_rate" in profile else 0.0
    said = (f"{zero:.0%} of the {len(profile)} profiled problems are never solved (avg@{k} = 0) and {one:.0%} "
            f"always (avg@{k} = 1): {between} are in between, where GRPO's groups have a reward signal")
    if zero > EXTREME_SHARE_WARN:
        why = (f"; {cut:.0%} of profiled rollouts were cut at max_new_tokens {p.sampling.max_new_tokens}, which may "
               "be the cause" if cut > 0.05 else "")
        fix = ("the model is too weak for this problem set" + why + ": use an easier set or a stronger model"
               + (", or raise sampling.max_new_tokens" if why else "") + ", then rerun the profile")
        return [("warning", ("model", "data"), said, fix)]
    if one > EXTREME_SHARE_WARN:
        return [("warning", ("model", "data"), said,
                 "the model is too strong for this problem set: use a harder set or a weaker model, then rerun "
                 "the profile")]
    return []


def noise_findings(artifacts: str | Path | None, p: StudyParams | None = None
                   ) -> list[tuple[str, tuple[str, ...], str, str]]:
    """After the measure stage, before the sweep: a warning when every measured B_simple (or K_crit) is
    infinite or undefined (the measure stage printed `b_simple inf` and the report used it),
    in the words the report uses (:func:`rollscale.report.reasons.noise_reason`), with the measure
    settings that would resolve the signal (:func:`rollscale.report.reasons.measure_fix`)."""
    from rollscale.report.reasons import noise_reason

    root = Path(artifacts or "")
    if artifacts is None or not (root / TABLES["noise_steps"]).is_file():
        return []
    tables = {name: _read(root / TABLES[name]) for name in ("noise_steps", "noise_prompts", "bucket_counts")}
    said = noise_reason(tables["noise_steps"], tables["noise_prompts"], tables["bucket_counts"],
                        None if p is None else p.measure)
    return [] if said is None else [("warning", ("measure.b_problem", "measure.steps"), *said)]


def _read(path: Path) -> pd.DataFrame | None:
    try:
        return pd.read_parquet(path) if path.is_file() else None
    except (OSError, ValueError):  # damaged: the study reruns its stage
        return None
