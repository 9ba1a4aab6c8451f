"""Buckets foreseen before any stage runs: a pilot profile of a few dozen problems.

The issue's first study died at the bucket stage: the profile of 60 problems found 3 in Easy [0.3, 0.6]
(43 % never solved), while init had assumed the default study's 20 %. ``init`` now profiles
:data:`PILOT_PROBLEMS` problems of the pool itself, at the study's own sampling settings and
``profile.k`` samples each (science §2's avg@k, by the profile stage's own function), and from
their pass rates sizes the used bucket: the share of the pool in Easy's bounds sizes ``data.limit``
and the validation split (:func:`rollscale.pipeline.init.values.bucket_values`); where Easy's bounds
would hold too few even of the whole pool, it widens them to pass rates the pilot saw
(:func:`rollscale.core.problems.buckets.bounds_holding`); where no bounds would, it says so, with
the numbers and what would work. A pilot of 32 problems puts a share of 20 % at +-14 % (95 %); the
bounds it sets are checked again by `rollscale check` after the real profile.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from rollscale.config import StudyParams
from rollscale.core.problems.buckets import bounds_holding
from rollscale.pipeline.check.greedy import greedy_solved_line, unsolved_bounds
from rollscale.pipeline.init.values import EasyShare, bucket_values

__all__ = ["BUCKET_MIN", "PILOT_PROBLEMS", "Foresight", "foresee", "pilot_profile", "share_low"]

PILOT_PROBLEMS = 32  # a share of 20 % known to +-14 % at 95 % (binomial), for ~1/2 of the 60-problem profile's cost
# the pilot samples its problems PILOT_CHUNK at a time and stops after the chunk that passes PILOT_SECONDS: on a
# CPU a chat model's 32 x 16 answers of up to 256 tokens took minutes (SmolLM2-135M: init did not end in 600 s beside
# a test run); fewer problems widen the share's bound (share_low uses the count), they do not bias it
PILOT_CHUNK = 8
PILOT_SECONDS = 60.0
# sized to init's stop time (issue: 8 problems x 16 samples x 256 tokens took 40 min of SmolLM2 on a busy CPU): at
# least PILOT_PROBLEMS_MIN problems, their samples halved down to PILOT_K_MIN where they would not fit
PILOT_PROBLEMS_MIN = 8
PILOT_K_MIN = 4
TIMED_TOKENS = 16  # new tokens of the timed generation that sizes the pilot
PILOT_COLUMNS = ("problem_id", "k", "avg_at_k", "greedy")
# problems the used bucket must hold: 4 to validate (the smallest split init writes) and two batches of 4 to train
BUCKET_MIN = 12


@dataclass(frozen=True)
class Foresight:
    """What the pilot foresaw: the used bucket's share of the pool, its bounds, and the lines to print."""

    easy: EasyShare
    bounds: tuple[float, float]
    limit_min: int  # the fewest problems to profile for the bucket to hold BUCKET_MIN
    lines: tuple[str, ...]
    pilot: pd.DataFrame | None = None  # the pilot profile itself (avg@k and greedy answers per problem)


def pilot_profile(p: StudyParams, count: int = PILOT_PROBLEMS, k: int | None = None,
                  seconds: float = PILOT_SECONDS, deadline: float | None = None, say=None,
                  loaded: tuple | None = None) -> pd.DataFrame:
    """avg@k of ``count`` problems of the pool drawn with ``data.seed``, sampled on this machine at the study's
    sampling settings with transformers' generate (the profile stage's function, science §2); ``k``: the
    profile's (``profile.k``), so that the pass rates fall on the grid the bucket bounds will be read on (a
    pilot at avg@8 put problems at 1/8 that the profile's avg@16 put at 1/16, below the bounds it chose).
    Each problem's greedy answer is scored too (column ``greedy``: a problem the model solves at temperature 0
    before any training gives the validation's greedy accuracy nothing to rise by).
    Sampled :data:`PILOT_CHUNK` problems at a time, stopping after the chunk that passes ``seconds``. With a
    ``deadline`` (``time.perf_counter()``) it stops there, inside a batch, and drops that batch; one short timed
    generation first sizes the problems, their samples and the chunk to it (:func:`pilot_size`); ``say`` prints
    what it sized. ``loaded``: (model, tokenizer) already loaded, else loaded here."""
    import time
    from functools import partial

    from rollscale.core.problems.profiling import profile_problems, score_rollouts
    from rollscale.core.problems.sources import table_problems
    from rollscale.core.rollouts import SamplingConfig
    from rollscale.lm.engines import EngineConfig, make_engine
    from rollscale.lm.engines.hf import GenerationTimeUp, generation_deadline
    from rollscale.lm.models import ModelRef, load_model, render_prompt

    d, s = p.data, p.sampling
    pool = [q for t in d.tables for q in table_problems(t, d.skip_malformed)]
    rng = np.random.default_rng(d.seed)
    problems = [pool[i] for i in sorted(rng.choice(len(pool), min(count, len(pool)), replace=False))]
    ref = ModelRef(str(p.model.name_or_path), p.model.gguf_file, p.model.dtype, p.model.chat_template)
    import torch

    model, tokenizer = loaded if loaded is not None else load_model(ref)
    engine = make_engine(model, tokenizer, EngineConfig(backend="hf", batch_size=s.batch_size))
    k = k or p.profile.k
    chunk = PILOT_CHUNK
    threads = torch.get_num_threads()
    torch.set_num_threads(p.torch_threads)  # as a stage's worker and the calibration run (its timing sizes the pilot)
    try:
        render = partial(render_prompt, tokenizer, use_chat_template=ref.chat_template,
                         chat_template_kwargs=s.chat_template_kwargs)
        config = SamplingConfig(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, max_new_tokens=s.max_new_tokens)
        greedy = SamplingConfig(temperature=0.0, max_new_tokens=s.max_new_tokens)
        start, parts = time.perf_counter(), []
        if deadline is not None:
            with generation_deadline(deadline):
                try:
                    per_step, per_rollout = timed_generation(engine, render(problems[0].prompt), config)
                except GenerationTimeUp:
                    return pd.DataFrame(columns=[*PILOT_COLUMNS])
            size = pilot_size(max(deadline - time.perf_counter(), 0.0), per_step, per_rollout, s.max_new_tokens, k,
                              len(problems))
            problems, k, chunk = problems[: size.problems], size.k, size.chunk
            if say is not None:
                say(f"init: pilot profile: one timed generation gives {1 / max(per_rollout, 1e-9):.0f} rollout-tokens "
                    f"a second here; up to {size.problems} problems at avg@{k}, {chunk} a batch, in its "
                    f"{max(deadline - time.perf_counter(), 0.0):.0f} s")
        for i in range(0, len(problems), chunk):
            part = problems[i:i + chunk]
            try:
                with generation_deadline(deadline):
                    table = profile_problems(engine.sample, render, part, k, config, d.seed + i)
                    solved = engine.sample([render(q.prompt) for q in part], 1, greedy, seed=d.seed + i + 1)
            except GenerationTimeUp:  # a batch cut short would score its answers as wrong: dropped
                break
            table["greedy"] = [float(score_rollouts(q, g)[0]) for q, g in zip(part, solved)]
            parts.append(table)
            if time.perf_counter() - start > seconds:
                break
        return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=[*PILOT_COLUMNS])
    finally:
        torch.set_num_threads(threads)
        engine.close()


def timed_generation(engine, prompt: str, config) -> tuple[float, float]:
    """(seconds per decoding step of a call, and per rollout and step) from two short calls of one prompt: one
    answer and four, at most :data:`TIMED_TOKENS` new tokens each (a decoding step's cost grows with the rows)."""
    import time
    from dataclasses import replace

    short = replace(config, max_new_tokens=min(config.max_new_tokens, TIMED_TOKENS))
    engine.sample([prompt], 1, replace(short, max_new_tokens=1), seed=0)  # first-call allocations
    timed = []
    for rows in (1, 4):
        t0 = time.perf_counter()
        engine.sample([prompt], rows, short, seed=rows)
        timed.append((time.perf_counter() - t0) / short.max_new_tokens)
    per_rollout = max((timed[1] - timed[0]) / 3, 0.0)
    return max(timed[0] - per_rollout, 0.0), max(per_rollout, 1e-6)


@dataclass(frozen=True)
class PilotSize:
    problems: int
    k: int
    chunk: int


def pilot_size(seconds: float, per_step: float, per_rollout: float, max_new_tokens: int, k: int,
               problems: int) -> PilotSize:
    """The pilot for ``seconds`` at the timed cost of a call (``per_step`` + rollouts x ``per_rollout`` a
    decoding step, each to ``max_new_tokens``: a call decodes to its longest answer): the problems asked, at
    ``k`` samples, or, where fewer than PILOT_PROBLEMS_MIN would fit, at half the samples (down to PILOT_K_MIN);
    the batch a quarter of those that fit (a batch cut at the stop time is lost), at most PILOT_CHUNK."""
    def problem_s(samples: int) -> float:  # sampled and greedy calls of one problem, in a batch of ``chunk``
        return max_new_tokens * (per_rollout * (samples + 1) + 2 * per_step / PILOT_CHUNK)

    while k > PILOT_K_MIN and seconds / problem_s(k) < PILOT_PROBLEMS_MIN:
        k = max(PILOT_K_MIN, k // 2)
    fit = max(1, min(problems, int(seconds / problem_s(k))))
    # every problem asked stays: the stop time ends the pilot where the estimate (one moment's timing, on a busy
    # machine up to 5 x pessimistic here) was wrong, and loses at most the batch it cuts
    return PilotSize(problems, k, max(1, min(PILOT_CHUNK, fit // 4)))


def share_low(hits: int, n: int, z: float = 1.0) -> float:
    """The Wilson lower bound of a share ``hits / n`` at ``z`` (1: one-sided 84 %): a pilot of a few dozen problems
    sizes the bucket on the share it is fairly sure of (the issue's pilot-sized guess was 19 %, the profile 8 %)."""
    if n <= 0 or hits <= 0:
        return 0.0
    p = hits / n
    centre = p + z * z / (2 * n)
    spread = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, (centre - spread) / (1 + z * z / n))


def foresee(values: dict[str, Any], why: dict[str, str], pilot: pd.DataFrame, pool: int) -> Foresight:
    """Size ``data.limit``, the used bucket's bounds and its split in ``values`` (with their reasons) from the
    pilot's pass rates, for a pool of ``pool`` problems."""
    avg = pd.to_numeric(pilot["avg_at_k"], errors="coerce").dropna().to_numpy()
    n, k = len(avg), int(pilot["k"].max())
    lo, hi = values.get("bucket.easy", StudyParams().bucket.easy)
    zero, one = float(np.mean(avg == 0)), float(np.mean(avg == 1))
    seen = (f"a pilot of {n} problems at avg@{k} (max_new_tokens {values['sampling.max_new_tokens']}): "
            f"{zero:.0%} never solved, {one:.0%} always")
    share = share_low(int(np.sum((avg >= lo) & (avg <= hi))), n)
    limit = values.get("data.limit") or pool
    lines = []
    if share * pool < BUCKET_MIN:  # Easy's bounds hold too few even of the whole pool: widen them
        hits = next((h for h in range(1, n + 1) if share_low(h, n) * pool >= BUCKET_MIN), None)
        held = bounds_holding(avg, hits, (lo, hi)) if hits is not None else None
        if held is None:
            signal = int(np.sum((avg > 0) & (avg < 1)))
            side = "weak" if zero >= one else "strong"
            would = ("an easier set, longer answers (sampling.max_new_tokens) or a stronger model" if side == "weak"
                     else "a harder set or a weaker model")
            line = (f"init: the model looks too {side} for this set: {seen}; {signal} of {n} have a reward signal "
                    f"(0 < avg@{k} < 1), too few for a bucket of {BUCKET_MIN} of the {pool} problems; {would} would "
                    "work (the profile stage would find the same: `rollscale check` says so after it)")
            return Foresight(EasyShare(), (lo, hi), values.get("data.limit") or pool, (line,))
        lo, hi = held
        share = share_low(int(np.sum((avg >= lo) & (avg <= hi))), n)
        values["bucket.easy"] = [lo, hi]
        why["bucket.easy"] = (f"{seen}: [{lo:g}, {hi:g}] holds at least {share:.0%} of them (84 % lower bound; "
                              f"Easy's [0.3, 0.6] held too few for {BUCKET_MIN} problems of {pool})")
        lines.append(f"init: bucket.easy [{lo:g}, {hi:g}]: {seen}; the default [0.3, 0.6] would hold too few")
    if said := greedy_solved_line(pilot, (lo, hi), "the used bucket"):  # a validation set RL cannot move
        hits = next((h for h in range(1, n + 1) if share_low(h, n) * pool >= BUCKET_MIN), None)
        moving = unsolved_bounds(pilot, hits) if hits is not None else None
        if moving is not None and moving != (lo, hi):
            lo, hi = moving
            share = share_low(int(np.sum((avg >= lo) & (avg <= hi))), n)
            values["bucket.easy"] = [lo, hi]
            why["bucket.easy"] = (f"{seen}: [{lo:g}, {hi:g}] holds the problems with a reward signal that greedy "
                                  f"decoding does not solve ({said.split(':')[0]})")
            lines.append(f"init: bucket.easy [{lo:g}, {hi:g}]: {said}; these bounds hold the problems with a reward "
                         "signal that greedy decoding does not solve")
        else:
            lines.append(f"warning: {said}; the pilot has too few problems greedy decoding does not solve for other "
                         "bounds: a harder table, or a weaker model")
    limit_min = min(pool, math.ceil(BUCKET_MIN / share))
    if limit < limit_min:
        values["data.limit"] = limit_min
        why["data.limit"] = (f"{BUCKET_MIN} problems in the used bucket at the pilot's {share:.0%} (the profile's "
                             "cost grows with it)")
        limit = limit_min
    easy = EasyShare(share, f"at least {share:.0%} in [{lo:g}, {hi:g}] in {seen}")
    values["bucket.expected_share"] = round(share, 3)  # what `rollscale check` sizes its fixes by before the profile
    why["bucket.expected_share"] = f"{seen}: at least {share:.0%} in [{lo:g}, {hi:g}] (84 % lower bound)"
    bucket_values(values, why, limit, easy, values["sweep.b_problem"][0])
    lines.append(f"init: at least {share:.0%} of the pool expected in the used bucket [{lo:g}, {hi:g}] ({seen}): "
                 f"data.limit {limit}, bucket.val_size {values['bucket.val_size']}")
    return Foresight(easy, (lo, hi), limit_min, tuple(lines))
