"""A short measured calibration of this machine: the model's generate and train throughput.

``rollscale check`` turns it into each stage's wall time (:mod:`rollscale.pipeline.check.timing`; its findings:
:func:`estimate_findings`) and ``rollscale init --hours`` sizes a study to it. A few seconds for the tiny model; for a real one,
the time to load it. What it measures, on one process with ``torch_threads`` threads (as one
worker of a stage runs):

* generation: one ``sampling.backend`` call of up to ``sampling.batch_size`` rollouts of the pool's
  own prompts, at ``max_new_tokens`` up to :data:`GEN_TOKENS_MAX`, per rollout and new token (batched
  decoding runs to the longest answer, so a call's time grows with max_new_tokens);
* training: one GRPO update (:func:`rollscale.train.step.policy_update`, the sweep's loss and
  micro-batches) on rollouts of the pool's prompt length x max_new_tokens, with advantages that
  are not zero (a fresh model's own rollouts all score 0 and would train nothing);
* the measure stage's Gram pass of per-rollout gradients (:func:`rollscale.train.online_noise.batch_gram`)
  on two such batches;
* a learning-rate probe: :data:`PROBE_STEPS` real GRPO steps (the sweep's trainer, its loss and
  verifier) at ``lr_base`` on the pool's first problems, :data:`PROBE_N` rollouts of :data:`PROBE_B_PROBLEM`
  prompts a step (fewer, and shorter, for a real model), and the KL to the start after each
  (:mod:`rollscale.pipeline.check.lr` reads the planned runs' move from it); last, since it changes the
  weights. Not on a tiny model before the base stage has warm-started it (its answers all score 0);
* the tiny model's warm start: :data:`BASE_STEPS` supervised steps at ``base.batch_size`` with
  ``base.threads``; a real model: the seconds to load it (the base stage loads and stores it).

Times are this process's CPU seconds, on one thread: what the work costs a core of its own, steady
when other jobs share the machine (wall seconds of the same calls varied 20-fold here beside other
sessions' work; a busy machine's stages take longer than the estimate by as much). Stored as
``artifacts/calibration.json`` under a key of every setting it depends on (not the
lengths nor the grid, which the estimate scales), and reused while the key matches.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from rollscale.config import StudyParams
from rollscale.files import write_json_atomic
from rollscale.pipeline.check.calibrated import CALIBRATION_FILE, Calibration, calibration_key, stored_calibration

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["CALIBRATION_FILE", "Calibration", "CalibrationTimeUp", "calibrate", "calibration_key", "estimate_findings",
           "load_for_calibration", "stored_calibration"]

GEN_ROLLOUTS_MAX = 128  # rollouts in the measured generate call (a sweep step's batch is 32-256)
GEN_TOKENS_MAX = 32  # new tokens measured; a longer max_new_tokens is scaled from it
# the tiny model's timed calls (tens of ms) each timed 5 times, the fastest kept: a cost is a difference of two
TIMING_REPEATS = 5  # timings, and one slow call on a loaded machine drove it to zero (CI, 2026-11-29)
TRAIN_TOKENS = 4096  # padded tokens of the larger measured update (at most 128 rollouts; a quarter for the smaller)
# a model over LARGE_PARAMS (SmolLM2-135M and up) is measured on less work, so that the calibration
# stays within about a minute on CPU: SMALL_WORK = (rollouts, new tokens, update tokens, timings of each call)
LARGE_PARAMS = 20_000_000
SMALL_WORK = (16, 16, 512, 1)
# the learning-rate probe: a few GRPO steps of PROBE_N x PROBE_B_PROBLEM rollouts. 8 answers a prompt: on the
# issue-43 pool (SmolLM2 solved 9 % on average, half of the problems never) 2 x 4 answers a step all tied in the
# probe's 3 steps, as 2 x 8 would about 1 time in 20. A model over LARGE_PARAMS is probed on 2 prompts at up to
# PROBE_TOKENS_MAX new tokens (SmolLM2 on this CPU: 4 x 4 at 256 tokens took 5 min of init's 11)
PROBE_STEPS = 3
PROBE_N = 8
PROBE_B_PROBLEM = 4
PROBE_B_PROBLEM_LARGE = 2
PROBE_TOKENS_MAX = 128
PROBE_TOKENS_MIN = 32  # a probe sized to init's stop time answers in no fewer new tokens
BASE_STEPS = 3  # measured supervised steps of the tiny model's warm start
BASE_THREAD_SPEEDUP = 1.54  # 2 threads against 1 on the warm start, 2 idle cores (docs/benchmarks.md)


def _problems(p: StudyParams, count: int) -> list:
    """The first ``count`` problems of the study's own pool (their lengths set the cost)."""
    from rollscale.core.problems.sets import gsm8k_problems, math_problems, reasoning_gym_problems
    from rollscale.core.problems.sources import table_problems

    d = p.data
    if d.source == "reasoning_gym":
        pool = reasoning_gym_problems(d.name, count, d.seed, dict(d.config), d.prompt_style)
    elif d.source == "table":
        pool = table_problems(d.tables[0], d.skip_malformed, limit=count)
    else:
        loader = gsm8k_problems if d.source == "gsm8k" else math_problems
        hub = {"hub_id": d.hub_id} if d.hub_id else {}
        pool = loader(str(d.path) if d.path else None, split=d.split, skip_malformed=d.skip_malformed, limit=count, **hub)
    return list(pool[:count])


def _model(p: StudyParams, artifacts: str | Path | None):
    """(model, tokenizer, chat template on, load seconds, trained): the base stage's model when it has run, a
    fresh tiny model of ``base``'s shape (not trained: the base stage warm-starts it), or the real model's files."""
    from rollscale.lm.models import ModelRef, add_lora, char_tokenizer, load_model, tiny_llama

    t0 = time.process_time()  # CPU seconds, as every other figure: reading and dequantising are CPU work
    stored = Path(artifacts or "") / "base" / "model_ref.json"
    if artifacts is not None and stored.is_file():
        ref = ModelRef.read(stored)
        model, tokenizer = load_model(ref)
    elif p.model.kind == "tiny":
        b, tokenizer = p.base, char_tokenizer()
        model = tiny_llama(len(tokenizer), b.hidden_size, b.num_layers, b.num_heads, b.intermediate_size,
                           b.max_positions, tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id)
        ref = ModelRef("tiny", chat_template=False)
    else:
        ref = ModelRef(str(p.model.name_or_path), p.model.gguf_file, p.model.dtype, p.model.chat_template)
        model, tokenizer = load_model(ref)
    load_s = time.process_time() - t0
    if p.model.lora.enabled and p.model.kind != "tiny":
        lora = p.model.lora
        model = add_lora(model, lora.r, lora.alpha, lora.dropout, list(lora.target_modules))
    return model, tokenizer, ref.chat_template, load_s, ref.name_or_path != "tiny"


def _large(model) -> bool:
    """A model over LARGE_PARAMS (SmolLM2-135M and up): measured, and probed, on less work."""
    return sum(q.numel() for q in model.parameters()) > LARGE_PARAMS


def _work(model) -> tuple[int, int, int, int]:
    """(the larger generate call's rollouts, new tokens, the larger update's tokens, timings a call) of ``model``."""
    return SMALL_WORK if _large(model) else (GEN_ROLLOUTS_MAX, GEN_TOKENS_MAX, TRAIN_TOKENS, TIMING_REPEATS)


def _fastest(calls: list, repeats: int, deadline: float | None = None, part: str = "") -> list[float]:
    """The CPU seconds of each of ``calls``: the fastest of ``repeats`` timings taken alternately (timeit's rule),
    each after :func:`past_deadline`'s check of ``deadline`` (naming ``part``)."""
    best = [float("inf")] * len(calls)
    for _ in range(repeats):
        for i, call in enumerate(calls):
            past_deadline(deadline, part)
            t0 = time.process_time()
            call()
            best[i] = min(best[i], time.process_time() - t0)
    return best


def _generate_s(p: StudyParams, model, tokenizer, chat: bool, prompts: list[str]) -> tuple[float, float, float]:
    """(seconds per decoding step of a call, plus seconds per rollout in it, mean prompt tokens): two calls, of
    ``GEN_ROLLOUTS_MAX`` (at most ``sampling.batch_size``) rollouts and of a quarter of that, give a call's fixed
    cost per new token and each rollout's."""
    from rollscale.core.rollouts import SamplingConfig
    from rollscale.lm.engines import EngineConfig, make_engine
    from rollscale.lm.models import render_prompt

    s = p.sampling
    most, new, _, repeats = _work(model)
    tokens = min(s.max_new_tokens, new)
    rendered = [render_prompt(tokenizer, q, chat, s.chat_template_kwargs) for q in prompts]
    engine = make_engine(model, tokenizer, EngineConfig(backend=s.backend, batch_size=s.batch_size,
                                                        dtype=s.engine_dtype, max_model_len=s.max_model_len))
    config = SamplingConfig(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, max_new_tokens=tokens)
    batches = (min(s.batch_size, most), max(1, min(s.batch_size, most) // 4))  # each: (prompts, rollouts a prompt)
    calls = [(rendered[: max(1, b // k)], k) for b, k in ((b, max(1, -(-b // len(rendered)))) for b in batches)]
    try:
        engine.sample(rendered[:1], 1, config, seed=0)  # warm-up: first-call allocations
        best = _fastest([lambda c=c, k=k, i=i: engine.sample(c, k, config, seed=i + 1)
                         for i, (c, k) in enumerate(calls)], repeats)
    finally:
        engine.close()
    (big, t_big), (small, t_small) = ((len(c) * k, t / tokens) for (c, k), t in zip(calls, best))
    per_rollout = max((t_big - t_small) / (big - small), 0.0) if big > small else t_big / big
    fixed = max(t_big - per_rollout * big, 0.0)
    prompt_tokens = sum(len(tokenizer(r, add_special_tokens=False)["input_ids"]) for r in rendered) / len(rendered)
    return fixed, per_rollout, prompt_tokens


def _train_s(p: StudyParams, model, tokenizer, prompt_tokens: float,
             deadline: float | None = None) -> tuple[float, float, float, float]:
    """Seconds of one GRPO update on rollouts with advantages: per step and per (prompt + completion) token;
    the measure stage's Gram pass per token and per token x rollout (:func:`rollscale.train.online_noise.batch_gram`:
    its rollout-pair products grow with B^2). From two batches, of up to TRAIN_TOKENS tokens and a quarter."""
    import numpy as np
    import torch

    from rollscale.core.grpo.logprobs import token_logprobs
    from rollscale.train.online_noise import batch_gram
    from rollscale.train.step import StepSettings, TrainBatch, policy_update

    rng = np.random.default_rng(0)
    vocab = int(model.config.vocab_size)
    _, new, budget, repeats = _work(model)
    width = (max(1, round(prompt_tokens)), min(p.sampling.max_new_tokens, new))

    def batch(n: int) -> TrainBatch:
        return TrainBatch([rng.integers(3, vocab, width[0]).tolist() for _ in range(n)],
                          [rng.integers(3, vocab, width[1]).tolist() for _ in range(n)],
                          rng.normal(size=n), np.ones(n, dtype=bool), np.ones(n, dtype=bool))

    trained = [q for q in model.parameters() if q.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=0.0)  # lr 0: the calibration leaves the weights as they were
    settings = StepSettings(train=p.sweep.train, temperature=p.sampling.temperature,
                            max_new_tokens=p.sampling.max_new_tokens)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    @torch.no_grad()
    def reference(ids, attention, completion):  # the KL reference's forward: a frozen copy costs the same
        return token_logprobs(model, ids, attention, completion, p.sampling.temperature)

    model.train()
    big = max(4, min(128, budget // sum(width)))
    small, large = batch(big // 4), batch(big)
    past_deadline(deadline, "the update's timing")
    policy_update(model, optimizer, trained, small, settings, pad, reference)  # warm-up
    updates = _fastest([lambda b=b: policy_update(model, optimizer, trained, b, settings, pad, reference)
                        for b in (small, large)], repeats, deadline, "the update's timing")
    grams = _fastest([lambda b=b: batch_gram(model, b, settings, pad, reference) for b in (small, large)], 1,
                     deadline, "the update's timing")
    grams = [t / (len(b) * sum(width)) for t, b in zip(grams, (small, large))]
    model.eval()
    # the update: a step's fixed part (optimizer, hooks) and its part per token, from the two sizes
    per_token = max((updates[1] - updates[0]) / ((len(large) - len(small)) * sum(width)), 0.0)
    fixed = max(updates[1] - per_token * len(large) * sum(width), 0.0)
    pair = max((grams[1] - grams[0]) / (len(large) - len(small)), 0.0)  # per token and rollout: the B^2 part
    return fixed, per_token, max(grams[0] - pair * len(small), 0.0), pair


def probe_size(p: StudyParams, large: bool, seconds: float, per_step: float, per_rollout: float,
               train_per_token: float, prompt_tokens: float) -> tuple[int, int] | None:
    """(steps, new tokens) of the learning-rate probe that fit ``seconds`` at the measured costs (a step: its
    rollouts generated to the longest answer, then one update): PROBE_STEPS + 1 steps at up to PROBE_TOKENS_MAX
    tokens (a real model) where they fit, else fewer tokens (down to PROBE_TOKENS_MIN), else fewer steps (at least
    two: the KL after one update is the second step's); None where not even that fits."""
    rollouts = PROBE_N * (PROBE_B_PROBLEM_LARGE if large else PROBE_B_PROBLEM)
    tokens = min(p.sampling.max_new_tokens, PROBE_TOKENS_MAX) if large else p.sampling.max_new_tokens

    def step_s(t: int) -> float:
        return t * (per_step + rollouts * per_rollout) + rollouts * (prompt_tokens + t) * train_per_token

    while tokens > PROBE_TOKENS_MIN and (PROBE_STEPS + 1) * step_s(tokens) > seconds:
        tokens = max(PROBE_TOKENS_MIN, tokens // 2)
    steps = min(PROBE_STEPS + 1, int(seconds / step_s(tokens))) if step_s(tokens) > 0 else PROBE_STEPS + 1
    return (steps, tokens) if steps >= 2 else None


def _lr_probe(p: StudyParams, model, tokenizer, chat: bool, problems: list, steps: int = PROBE_STEPS + 1,
              tokens: int | None = None, deadline: float | None = None) -> tuple[float, ...]:
    """The learning-rate probe: the per-token KL to the start after each of :data:`PROBE_STEPS` GRPO steps at
    ``lr_base`` (the sweep's trainer, loss and verifier; PROBE_N rollouts of PROBE_B_PROBLEM of the pool's
    first problems a step, or of PROBE_B_PROBLEM_LARGE at up to PROBE_TOKENS_MAX tokens for a model over
    LARGE_PARAMS, sampled by the trainer's own transformers sampler). Each step's ``kl`` column is
    measured on its fresh rollouts before its update: the KL after s updates is step s + 1's. The model's
    weights change: the calibration's last measurement. A loss that turns non-finite ends it with an infinite KL
    (the rate diverges). With ``kl_coef`` 0 the KL is still measured (a
    coefficient of 1e-12 switches the reference on and leaves the loss as it was). ``steps``, ``tokens``: a probe
    sized to a time (:func:`probe_size`); ``deadline`` (``time.perf_counter()``): it stops there, inside a
    generation, with the KLs measured so far."""
    import math

    from rollscale.core.grpo.allocation import RuleNotApplicable
    from rollscale.core.rollouts import SamplingConfig
    from rollscale.lm.engines.hf import GenerationTimeUp, generation_deadline
    from rollscale.train.step import NonFiniteLossError
    from rollscale.sweep.grid import GridPoint, point_config
    from rollscale.train.trainer import GRPOTrainer

    if len(problems) < 2:
        return ()
    large = _large(model)
    b_problem = min(PROBE_B_PROBLEM_LARGE if large else PROBE_B_PROBLEM, len(problems) - 1)
    s = p.sampling
    if tokens is None:
        tokens = min(s.max_new_tokens, PROBE_TOKENS_MAX) if large else s.max_new_tokens
    sampling = SamplingConfig(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, max_new_tokens=tokens)
    config = None
    for rule in sorted(p.sweep.rules, key=lambda r: r.rule != "uniform"):  # the plain rule where the study has it
        try:
            config = point_config(p.sweep, sampling, GridPoint(PROBE_N, b_problem, rule, 0))
            break
        except RuleNotApplicable:
            continue
    if config is None:
        return ()
    train = config.train.model_copy(update={"warmup_steps": 0, "kl_coef": config.train.kl_coef or 1e-12})
    config = config.model_copy(update={"train": train, "c_max": steps * PROBE_N * b_problem, "noise_every": 0})
    lora = p.model.lora.enabled and p.model.kind != "tiny"
    trainer = GRPOTrainer(model, tokenizer, problems[:-1], problems[-1:], config, use_chat_template=chat,
                          lora=lora, sample_batch_size=p.sampling.batch_size,
                          chat_template_kwargs=p.sampling.chat_template_kwargs)
    kls = []
    for step in range(steps):
        try:
            with generation_deadline(deadline):
                row = trainer.train_step()
        except NonFiniteLossError:  # the rate diverges here: said by the check (rollscale.pipeline.check.lr)
            return (*kls, math.inf)
        except GenerationTimeUp:  # init's stop time: the KLs measured so far
            break
        if step:
            kls.append(float(row.get("kl", math.nan)))  # a step that trained nothing: NaN
    return tuple(kls)


def _tiny_base_s(p: StudyParams) -> float:
    """The tiny model's warm start: ``base.steps`` x one supervised step at ``base.batch_size``, measured on
    one thread (two threads beside other work ran 3-25x slower here, one thread steadily) and divided by
    :data:`BASE_THREAD_SPEEDUP` when ``base.threads`` > 1 on a machine with the cores for them."""
    import os

    from rollscale.lm.models import char_tokenizer, tiny_llama, train_supervised

    b, tokenizer = p.base, char_tokenizer()
    model = tiny_llama(len(tokenizer), b.hidden_size, b.num_layers, b.num_heads, b.intermediate_size,
                       b.max_positions, tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id)
    pairs = [(f"{i}+{i + 7}-{i % 13}=", str(2 * i + 7 - i % 13)) for i in range(b.batch_size)]
    train_supervised(model, tokenizer, pairs, 1, b.batch_size, b.lr)  # warm-up
    t0 = time.process_time()
    train_supervised(model, tokenizer, pairs, BASE_STEPS, b.batch_size, b.lr)
    speedup = BASE_THREAD_SPEEDUP if b.threads > 1 and (os.cpu_count() or 1) > 1 else 1.0
    return (time.process_time() - t0) / BASE_STEPS * b.steps / speedup


class CalibrationTimeUp(RuntimeError):
    """The calibration's stop time (init's) passed before it had measured what an estimate needs; the message
    names the part."""


def past_deadline(deadline: float | None, part: str) -> None:
    """Raise :class:`CalibrationTimeUp` naming ``part`` when ``deadline`` (``time.perf_counter()``) has passed."""
    if deadline is not None and time.perf_counter() > deadline:
        raise CalibrationTimeUp(part)


def load_for_calibration(p: StudyParams, artifacts: str | Path | None = "artifacts") -> tuple:
    """The model the calibration measures, loaded (:func:`calibrate`'s ``loaded``): init loads it once for its
    pilot profile and the calibration."""
    return _model(p, artifacts)


def calibrate(p: StudyParams, artifacts: str | Path | None = "artifacts", reuse: bool = True,
              deadline: float | None = None, say=None, loaded: tuple | None = None) -> Calibration:
    """The stored calibration when it is this study's (``reuse``), else measure it now and store it. With a
    ``deadline`` (``time.perf_counter()``, init's stop time) the timing stops there with
    :class:`CalibrationTimeUp` (inside the generation, between the updates), the learning-rate probe is sized to
    the time left and stopped there (:func:`probe_size`), and ``say`` prints what was sized. ``loaded``: the model already
    loaded (:func:`load_for_calibration`), else loaded here."""
    import torch

    from rollscale.lm.engines.hf import GenerationTimeUp, generation_deadline

    if reuse and (cal := stored_calibration(p, artifacts)) is not None:
        return cal
    t0 = time.perf_counter()
    threads = torch.get_num_threads()
    torch.set_num_threads(p.torch_threads)
    try:
        model, tokenizer, chat, load_s, trained = loaded if loaded is not None else _model(p, artifacts)
        problems = _problems(p, 32)
        past_deadline(deadline, "the model's load")
        try:
            with generation_deadline(deadline):
                fixed, gen, prompt_tokens = _generate_s(p, model, tokenizer, chat, [q.prompt for q in problems])
        except GenerationTimeUp:
            raise CalibrationTimeUp("the generation's timing") from None
        train_step, train, gram, gram_pair = _train_s(p, model, tokenizer, prompt_tokens, deadline)
        base = _tiny_base_s(p) if p.model.kind == "tiny" else load_s
        probe: tuple[float, ...] = ()
        sized = probe_size(p, _large(model), deadline - time.perf_counter(), fixed, gen, train, prompt_tokens) \
            if deadline is not None else (PROBE_STEPS + 1, None)
        if trained and sized is not None:
            if say is not None and deadline is not None:
                say(f"init: learning-rate probe: {sized[0]} GRPO steps at up to {sized[1]} new tokens, sized to the "
                    f"{max(deadline - time.perf_counter(), 0.0):.0f} s left")
            probe = _lr_probe(p, model, tokenizer, chat, problems[: PROBE_B_PROBLEM + 1], sized[0], sized[1], deadline)
        elif trained and say is not None:
            say("init: no learning-rate probe: not one step of it fits init's time left (check warns on the rate)")
    finally:
        torch.set_num_threads(threads)
    cal = Calibration(calibration_key(p, artifacts), fixed, gen, train_step, train, gram, gram_pair,
                      prompt_tokens, base, load_s, time.perf_counter() - t0, p.sweep.train.lr_base, probe)
    if artifacts is not None:
        write_json_atomic(cal.to_json(), Path(artifacts) / CALIBRATION_FILE)
    return cal


def estimate_findings(p: StudyParams, artifacts: str | Path | None, pool: int | None,
                      profile: pd.DataFrame | None, measure: bool = True,
                      done: frozenset[str] = frozenset()) -> list[tuple[str, tuple[str, ...], str, str]]:
    """The time finding of the stages not in ``done`` and the learning-rate warning
    (:mod:`rollscale.pipeline.check.lr`) from the stored calibration, or one measured now (``measure``; a few
    seconds, a real model's load); none when there is neither, or the grid cannot be laid out (its own finding
    says why)."""
    from rollscale.pipeline.check.lr import lr_findings
    from rollscale.pipeline.check.timing import stage_times, time_finding

    cal = stored_calibration(p, artifacts)
    if cal is None and measure:
        print(f"check: measuring this machine's generate and train throughput for "
              f"{p.model.name_or_path or 'the tiny model'} and a learning-rate probe of a few GRPO steps (seconds for "
              f"the tiny model; a real model's load first, and minutes on CPU; stored in {artifacts})", file=sys.stderr)
        try:
            cal = calibrate(p, artifacts, reuse=False)
        except ImportError as err:  # a GPU study (vLLM) prepared where its engine is not installed: still checked
            return [("note", ("sampling.backend",), f"could not calibrate here: {str(err).splitlines()[0]}; "
                     "no time estimate", "run `rollscale check` on the machine that will run the study")]
    if cal is None:
        return []
    try:
        times = stage_times(p, cal, pool, profile)
    except ValueError:
        return []
    return [time_finding(p, times, cal, done), *lr_findings(p, cal)]
