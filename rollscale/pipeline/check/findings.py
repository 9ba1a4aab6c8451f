"""``rollscale check``: can this study answer? (run again at the start of ``rollscale study``)

From the params and what is known of the data (the pool size, counted from a local
table when that is cheap; the profile, when the profile stage has run: then the
buckets and their train / validation splits are laid out exactly as the bucket
stage will, with the current bucket settings), it computes with
:mod:`rollscale.core.fit.power` what the study can resolve: evaluations per run
against what the frontier fit needs, the standard error of validation avg@k and
the smallest reward difference it can tell apart, epochs per run, the grid the
sweep will train, the settings of one section another needs, the profile's
truncation share. Each finding is an error (the study cannot work or cannot
answer), a warning (it will be weak) or a note, naming the params keys and the fix.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pandas as pd

from rollscale.config import StudyParams
from rollscale.core.fit import power
from rollscale.core.problems.buckets import BucketError, assign_buckets, make_splits
from rollscale.pipeline.check.budget import decision_findings
from rollscale.pipeline.check.evals import (
    cadence_key,
    evaluations_fix,
    run_evaluation_steps,
)
from rollscale.pipeline.check.memory import sharded_memory_findings
from rollscale.pipeline.check.profile import model_fit_findings
from rollscale.pipeline.check.resolution import bucket_bounds_fix, noise_findings_of_split

__all__ = ["DataKnown", "Finding", "format_findings", "known_data", "study_findings"]

TRUNCATION_WARN = 0.05  # share of profiled rollouts cut at max_new_tokens above which the check warns
TRUNCATION_TARGET = 0.02
EPOCHS_WARN = 50.0  # passes over the training split (the default study's longest run makes ~33)


@dataclass(frozen=True)
class Finding:
    level: Literal["error", "warning", "note"]
    keys: tuple[str, ...]
    message: str
    fix: str = ""

    def text(self) -> str:
        return f"{self.level:7s} {', '.join(self.keys)}: {self.message}" + (f"\n        fix: {self.fix}" if self.fix else "")


@dataclass(frozen=True)
class DataKnown:
    """What is known of the data before the stages run: the pool size (None: unknown, e.g. a
    hub dataset; ``pool_exact`` False: an upper bound, duplicates and malformed rows still to
    drop) and the profile table, if the profile stage has run."""

    pool_size: int | None = None
    pool_exact: bool = False
    profile: pd.DataFrame | None = None
    data_errors: tuple[str, ...] = ()  # what the stages would refuse in the data (:func:`read_tables`)
    calibration: object | None = None  # this machine's stored calibration (:mod:`rollscale.pipeline.check.calibration`)


def known_data(params: StudyParams, artifacts: str | Path | None = "artifacts") -> DataKnown:
    """The pool size and profile, from ``artifacts``/profile when it exists, else counted cheaply
    from the data source (reasoning-gym's size, local table files' rows)."""
    from dataclasses import replace

    from rollscale.pipeline.check.calibration import stored_calibration

    known = _known_data(params, artifacts)
    return replace(known, calibration=stored_calibration(params, artifacts)) if artifacts is not None else known


def _known_data(params: StudyParams, artifacts: str | Path | None) -> DataKnown:
    from rollscale.core.problems.data_sample import count_rows

    path = Path(artifacts or "") / "profile" / "profile.parquet"
    if artifacts is not None and path.is_file():
        try:
            profile = pd.read_parquet(path)
        except (OSError, ValueError):  # damaged: the study reruns the profile stage (status names it)
            profile = None
        if profile is not None:
            return DataKnown(len(profile), True, profile)
    d = params.data
    size: int | None = None
    if d.source == "reasoning_gym":
        size = d.size
    elif d.source == "table":
        counts = [count_rows(t.path) if t.path is not None else None for t in d.tables]
        if all(c is not None for c in counts):
            weights = [t.weight / sum(t.weight for t in d.tables) for t in d.tables]
            size = counts[0] if len(counts) == 1 else int(min(c / w for c, w in zip(counts, weights)))
    elif d.path is not None:
        size = count_rows(d.path)
    if size is not None and d.limit is not None:
        size = min(size, d.limit)
    if d.source == "table" and (read := read_tables(params)) is not None:
        return DataKnown(read[0], read[0] is not None, None, read[1])
    return DataKnown(size, False, None)


# local tables up to this many rows are read whole by the check, as the base stage reads them (seconds)
READ_ROWS_MAX = 200_000


def read_tables(params: StudyParams) -> tuple[int | None, tuple[str, ...]] | None:
    """The pool the stages would load from local tables, read as they read them (each row mapped, duplicate
    prompts dropped, mixed to ``data.limit``): its size and what they would refuse (a missing column, a
    limit the tables cannot fill), or None when a table is a hub dataset or too large to read here."""
    from rollscale.core.problems.problem import DataRowError
    from rollscale.core.problems.data_sample import count_rows
    from rollscale.core.problems.sources import mix_problems, table_problems

    d = params.data
    if any(t.path is None or (count_rows(t.path) or 0) > READ_ROWS_MAX for t in d.tables):
        return None
    parts = []
    for t in d.tables:
        try:
            parts.append((t.label, table_problems(t, d.skip_malformed), t.weight))
        except (DataRowError, ValueError, OSError) as err:
            where = f"bad data row at {err.where}: {err.reason}" if isinstance(err, DataRowError) else str(err)
            return None, (f"{where.splitlines()[0][:300]}",)
    try:
        pool = parts[0][1] if len(parts) == 1 and d.limit is None else mix_problems(parts, d.limit, d.seed)
    except ValueError as err:
        return sum(len(p) for _, p, _ in parts), (f"data.limit {d.limit}: {err} (after dropping duplicate "
                                                   "prompts)",)
    return len(pool), ()


def _data(known: DataKnown) -> Iterable[Finding]:
    for problem in known.data_errors:
        yield Finding("error", ("data.tables", "data.limit"), f"the stages would refuse the data as they load the "
                      f"pool: {problem}", "fix the table or the params (data.tables' columns, data.limit) as it says")


def _cross_section(p: StudyParams) -> Iterable[Finding]:
    if p.bucket.extremely_hard and p.profile.k_extreme == 0:
        yield Finding("error", ("bucket.extremely_hard", "profile.k_extreme"),
                      "Extremely hard needs the k_extreme samples of problems with avg@k = 0, and k_extreme is 0 "
                      "(the bucket stage would refuse after the profile ran)",
                      "set bucket.extremely_hard: false, or profile.k_extreme: 64 or more")
    if p.model.kind == "tiny" and p.data.source != "reasoning_gym":
        yield Finding("error", ("model.kind", "data.source"), "the tiny model is trained on reasoning-gym "
                      "arithmetic; it cannot read your problems", "set model.kind: hf and model.name_or_path")
    if p.model.kind == "hf" and p.data.source == "reasoning_gym" and p.data.prompt_style == "expression":
        yield Finding("warning", ("data.prompt_style",), "a chat model gets bare expressions ('12+7-45=') made "
                      "for the character-level tiny model", "set data.prompt_style: question")
    if p.model.kind == "hf":  # the schema's defaults are the tiny model's: kept for a real model, they waste a run
        if p.sampling.max_new_tokens <= 16:
            yield Finding("warning", ("sampling.max_new_tokens",), f"{p.sampling.max_new_tokens} tokens suit the tiny "
                          "model's bare answers; a chat model's are longer and would be cut (and masked)",
                          "`rollscale init` sizes it from your data; the profile's truncation share then checks it")
        if not p.model.lora.enabled and p.sweep.train.lr_base >= 1e-4:
            yield Finding("warning", ("sweep.train.lr_base",), f"lr_base {p.sweep.train.lr_base:g} is the tiny "
                          "model's (trained from scratch); full fine-tuning of a pretrained model uses ~1e-6 "
                          "(TRL's GRPOConfig, verl)", "sweep.train.lr_base: 1.0e-6 (LoRA: 1.0e-5)")
    for key, bucket in (("sweep.bucket", p.sweep.bucket), ("measure.bucket", p.measure.bucket)):
        if bucket not in p.bucket.used:
            yield Finding("warning", (key, "bucket.used"), f"{bucket!r} is not in bucket.used, so the bucket stage "
                          "does not make sure it has problems and a validation set", f"add {bucket} to bucket.used")
    if p.fit.bootstrap_resamples == 0:
        yield Finding("warning", ("fit.bootstrap_resamples",), "no bootstrap: no claim gets an interval, and the "
                      "report makes none", "set fit.bootstrap_resamples: 200")


def _grid(p: StudyParams) -> Iterable[Finding]:
    from rollscale.sweep.grid import plan_runs

    try:
        plan = plan_runs(p.sweep)
    except ValueError as err:
        yield Finding("error", ("sweep.design", "sweep.n", "sweep.b_max"), str(err))
        return
    for why in plan.skipped:
        yield Finding("warning", ("sweep.rules", "sweep.n"), f"skipped: {why}")
    for rule in sorted({r.rule for r in p.sweep.rules} - {point.rule.rule for point, _ in plan.runs}):
        yield Finding("error", ("sweep.rules", "sweep.n"), f"rule {rule!r} has no run: every n was skipped for it",
                      "raise sweep.n, or change the rule's settings in sweep.rules (the skips above say why)")
    if not plan.runs:
        return
    shapes = sorted({(pt.n, pt.b_problem) for pt, _ in plan.runs})
    axis = "b_problem" if p.sweep.design == "prompt_axis" else "n"
    keys = {n if axis == "n" else b for n, b in shapes}
    if len(keys) < 2:
        yield Finding("warning", (f"sweep.{axis}",), f"one {axis} on the {p.sweep.design} design: the frontier "
                      "has one curve, so there is nothing to compare", f"give sweep.{axis} three values")
    if len({n * b for n, b in shapes}) < 3:
        yield Finding("note", ("sweep.n", "sweep.b_problem"), "fewer than 3 batch sizes B: S(B) and E(B) "
                      "(steps to target against batch size) cannot be fitted")
    seeds = len(p.sweep.seeds)
    if seeds < 3:
        yield Finding("warning", ("sweep.seeds",), f"{seeds} seed(s) per grid point: "
                      + ("no interval, and the report shows no single-seed observation as a claim" if seeds == 1
                         else "bootstrap intervals from 2 seeds are crude"), "sweep.seeds: [0, 1, 2]")
    evals = {(n, b): len(run_evaluation_steps(p, n * b)) for n, b in shapes}
    cadence = cadence_key(p)
    fix = evaluations_fix(p, [n * b for n, b in shapes])
    shown = ", ".join(f"n={n} x B_problem={b}: {e}" for (n, b), e in evals.items())
    unfit = [s for s, e in evals.items() if e < power.FIT_MIN_EVALS]
    weak = [s for s, e in evals.items() if power.FIT_MIN_EVALS <= e < power.EVALS_COMFORTABLE]
    if len(unfit) == len(evals):
        yield Finding("error", ("sweep.c_max", cadence), f"evaluations per run ({shown}) are below the "
                      f"{power.FIT_MIN_EVALS} distinct budgets a sigmoid needs: no frontier can be fitted", fix)
    elif unfit or weak:
        yield Finding("warning", ("sweep.c_max", cadence), f"evaluations per run ({shown}): "
                      f"a sigmoid needs {power.FIT_MIN_EVALS} record points, and records are only the rising "
                      f"evaluations; below {power.EVALS_COMFORTABLE} its fit often fails", fix)
    tokens = len(plan.runs) * p.sweep.c_max * p.sampling.max_new_tokens
    yield Finding("note", ("sweep",), f"{len(plan.runs)} runs of {p.sweep.c_max:,} rollouts: up to {tokens:,} "
                  f"generated tokens at max_new_tokens {p.sampling.max_new_tokens}")


def _splits(p: StudyParams, profile: pd.DataFrame) -> tuple[dict | None, list[Finding]]:
    b = p.bucket
    quiet = logging.getLogger("rollscale.core.problems.buckets")  # its "bucket X is empty" is the bucket stage's to say
    level, quiet.disabled = quiet.disabled, True
    try:  # Extremely hard without the profile's k_extreme samples is _cross_section's error; the rest is laid out
        membership = assign_buckets(profile, {"easy": b.easy, "hard": b.hard, "very_easy": b.very_easy},
                                    extremely_hard=b.extremely_hard and "n_correct_extreme" in profile)
        return make_splits(membership, b.val_size, b.seed, b.used, {k: list(v) for k, v in b.mixtures.items()},
                           p.data.more_problems), []
    except BucketError as err:
        short = next((name for name in b.used if f"bucket {name!r}" in str(err)), p.sweep.bucket)
        return None, [Finding("error", ("bucket.used", "bucket.val_size", f"bucket.{short}"), f"{err} (from the "
                              f"profile of {len(profile)} problems)", bucket_bounds_fix(p, profile, short))]
    finally:
        quiet.disabled = level


def _sizes(p: StudyParams, known: DataKnown, splits: dict | None) -> Iterable[Finding]:
    profile = known.profile if known.profile is not None else pd.DataFrame()
    sizes: dict[str, tuple[int, int]] = {}
    if splits is not None:
        sizes = {name: (len(s.train), len(s.val)) for name, s in splits.items()}
    elif known.pool_size is not None:
        bound = "" if known.pool_exact else "at most "
        if known.pool_size <= p.bucket.val_size and p.bucket.used:
            yield Finding("error", ("bucket.val_size", "data.limit"), f"the pool has {bound}{known.pool_size} "
                          f"problems, not more than bucket.val_size = {p.bucket.val_size}: a used bucket would "
                          "have no training problems", "lower bucket.val_size or use more problems")
        train_max = known.pool_size - p.bucket.val_size
        for key, b_problem in (("sweep.b_problem", max(p.sweep.b_problem)), ("measure.b_problem", p.measure.b_problem)):
            if train_max > 0 and b_problem > train_max:
                yield Finding("error", (key,), f"{b_problem} prompts per step, but even a bucket holding the whole "
                              f"pool would train on {bound}{train_max}", f"lower {key} below {train_max}")
    for key, bucket, b_problem in (("sweep", p.sweep.bucket, max(p.sweep.b_problem)),
                                   ("measure", p.measure.bucket, p.measure.b_problem)):
        if splits is None:
            continue
        train, val = sizes.get(bucket, (0, 0))
        if train == 0 or (key == "sweep" and val == 0):
            yield Finding("error", (f"{key}.bucket",), f"bucket {bucket!r} would have {train} training and {val} "
                          "validation problems", f"choose another {key}.bucket, or widen its bounds")
        elif b_problem > train:
            yield Finding("error", (f"{key}.b_problem",), f"{b_problem} prompts per step over {train} training "
                          f"problems of {bucket!r}: every step would repeat problems within its batch",
                          f"{key}.b_problem: {max(2, train // 2)} or less, or {bucket_bounds_fix(p, profile, bucket)}")
    val_ids = splits[p.sweep.bucket].val if splits is not None and p.sweep.bucket in splits else None
    yield from (Finding(*f) for f in noise_findings_of_split(p, sizes.get(p.sweep.bucket), val_ids, known.profile,
                                                              (known.pool_size, known.pool_exact)))
    if p.sweep.bucket in sizes and sizes[p.sweep.bucket][0] > 0:
        train = sizes[p.sweep.bucket][0]
        epochs = [power.epochs_per_run(power.steps_per_run(p.sweep.c_max, n * b), b, train)
                  for n in p.sweep.n for b in p.sweep.b_problem]
        lo, hi = min(epochs), max(epochs)
        level = "warning" if hi > EPOCHS_WARN else "note"
        yield Finding(level, ("sweep.c_max", "sweep.b_problem"), f"runs make {lo:.1f}-{hi:.1f} epochs over the "
                      f"{train} training problems of {p.sweep.bucket!r}",
                      "more problems (data.limit, wider bounds) or a smaller sweep.c_max" if level == "warning" else "")


def _truncation(p: StudyParams, profile: pd.DataFrame | None) -> Iterable[Finding]:
    if profile is None or not {"mean_len", "trunc_rate"} <= set(profile.columns) or profile.empty:
        return
    share = float(profile["trunc_rate"].mean())
    cap = p.sampling.max_new_tokens
    masked = " and masked from training (sweep.train.overlong_filter)" if p.sweep.train.overlong_filter else ""
    msg = f"{share:.1%} of profiled rollouts reached max_new_tokens {cap} (the profile as last run){masked}"
    if share <= TRUNCATION_WARN:
        yield Finding("note", ("sampling.max_new_tokens",), msg)
        return
    need = power.max_new_tokens_for_truncation(profile["mean_len"], profile["trunc_rate"], cap, TRUNCATION_TARGET)
    fix = (f"sampling.max_new_tokens: {need} (an exponential tail fitted to the profile puts the share at "
           f"{TRUNCATION_TARGET:.0%} there; it errs long), then rerun profile" if need is not None else
           "every rollout was cut: raise sampling.max_new_tokens several-fold and rerun profile")
    yield Finding("warning", ("sampling.max_new_tokens",), msg, fix)


def _answerable(p: StudyParams, known: DataKnown) -> Iterable[Finding]:
    """The verdict `rollscale init` refuses a study on (:func:`rollscale.pipeline.check.answerable.answer_verdict`):
    an error where no key can be settled at the tolerance."""
    from rollscale.pipeline.check.answerable import answer_verdict

    verdict = answer_verdict(p, known.calibration)
    if verdict is not None and not verdict.settles:
        yield Finding("error", ("study.tolerance", "bucket.val_size", "sweep.eval_k", "sweep.seeds"), verdict.line,
                      "the hours or the table it names, or a larger study.tolerance; `rollscale study --no-check` "
                      "runs it as it is (a pilot that cannot answer)")


def study_findings(params: StudyParams, known: DataKnown | None = None) -> list[Finding]:
    """Every finding on ``params`` given ``known``: errors first, then warnings, then notes."""
    known = known or DataKnown()
    splits, found = (None, []) if known.profile is None else _splits(params, known.profile)
    split = splits.get(params.sweep.bucket) if splits is not None else None
    size = (len(split.train), len(split.val)) if split is not None else None
    found += [*_data(known), *_cross_section(params), *_grid(params), *_sizes(params, known, splits),
              *_truncation(params, known.profile), *(Finding(*f) for f in model_fit_findings(params, known.profile)),
              *(Finding(*f) for f in decision_findings(params, size, known.pool_size)),
             *(Finding(*f) for f in sharded_memory_findings(params)), *_answerable(params, known)]
    order = {"error": 0, "warning": 1, "note": 2}
    return sorted(found, key=lambda f: order[f.level])


def format_findings(findings: list[Finding], source: str = "params.yaml") -> str:
    """One block per finding, then a verdict line."""
    errors = sum(f.level == "error" for f in findings)
    warnings = sum(f.level == "warning" for f in findings)
    verdict = ("the study cannot answer as set: fix the errors" if errors else
               "the study can run; the warnings say where it will be weak" if warnings else
               "the study can answer")
    lines = [f.text() for f in findings]
    return "\n".join([*lines, f"check {source}: {errors} error(s), {warnings} warning(s): {verdict}"])
