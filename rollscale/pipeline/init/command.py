"""``rollscale init --model M --data D [--gpu H100|none] [--budget C] [--out params.yaml] [--force]``.

Reads the model's files (:mod:`rollscale.lm.model_info`) and a sample of the data
(:mod:`rollscale.core.problems.data_sample`, lengths in the model's own tokens), lets
:mod:`rollscale.pipeline.init.values` decide the params with their reasons, writes them
and runs the check (:mod:`rollscale.pipeline.check.findings`) on what it wrote.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from pathlib import Path

__all__ = ["context_warning", "init_params", "problem_count"]


def _token_counter(name_or_path: str, gguf_file: str | None):
    """The model's tokenizer as a length function, or None when it cannot be loaded here."""
    try:
        from transformers import AutoTokenizer

        from rollscale.lm.gguf import one_parse, tokenizer_source

        source, kwargs = tokenizer_source(name_or_path, gguf_file)  # a GGUF dequantised before: its saved tokenizer
        with one_parse():  # else its config and its vocabulary each parse the GGUF
            tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
    except (OSError, ValueError, ImportError):
        return None
    return lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"])


def _data_arg(data: str) -> str:
    """A local file as a path relative to the project folder when inside it (params stay portable)."""
    path = Path(data)
    if not path.exists():
        return data
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path.resolve())


def problem_count(source) -> int | None:
    """The problems a local table gives as the stages load it (duplicate prompts dropped), so the
    ``data.limit`` init writes is one the pool can fill; its rows, unread, when it is too large to read
    here (:data:`rollscale.pipeline.check.findings.READ_ROWS_MAX`)."""
    from rollscale.core.problems.data_sample import count_rows
    from rollscale.core.problems.sources import table_problems
    from rollscale.pipeline.check.findings import READ_ROWS_MAX

    rows = count_rows(source.path)
    return len(table_problems(source)) if rows is not None and rows <= READ_ROWS_MAX else rows


def context_warning(max_positions: int | None, prompt_tokens: list[int], unit: str,
                    ) -> tuple[str, tuple[str, ...], str, str] | None:
    """A warning finding when sampled prompts are longer than the model's context (``max_positions``, from its
    files): the engines would cut them or fail on them, and the answer needs room in it too."""
    over = [n for n in prompt_tokens if max_positions and n > max_positions]
    if not over:
        return None
    return ("warning", ("data.tables",),
            f"{len(over)} of the {len(prompt_tokens)} sampled prompts are longer than the model's context of "
            f"{max_positions:,} tokens (the longest: {max(over):,} {unit}); each answer needs room there too",
            "drop or shorten those rows, or use a model with a longer context")


def budget_values(values: dict, why: dict, budget: int, eta: float) -> None:
    """``--budget C``: the study answers at C* = C rollouts (science §9), so ``study.target_budget`` = C and
    ``sweep.c_max`` at least C / eta (a fit is trusted eta times past its data, A3), kept when already larger."""
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise ValueError(f"--budget: expected the rollouts of your production run (an integer >= 1), got {budget!r}")
    values["study.target_budget"] = budget
    why["study.target_budget"] = "C*: the rollouts of your production run (rollscale init --budget)"
    need = math.ceil(budget / eta)
    if values.get("sweep.c_max", 0) < need:
        values["sweep.c_max"] = need
        why["sweep.c_max"] = (f"rollouts per run: C* / eta = {budget:,} / {eta:g}, so the decision at C* is at most an "
                              f"extrapolation of eta (science §9.3); {budget:,} would see C* itself")


# a study estimated past TIME_MARGIN x the time asked is an error (`--force` writes it anyway; once
# `init --budget 20000` wrote a study of about 318 h on this machine and the check said it "can run")
TIME_MARGIN = 10
# the time asked of `init --budget` without --hours: the check's own limit (a warning past 12 h)
BUDGET_HOURS = 12.0


def foresee_buckets(values: dict, why: dict, pool: int, problems: int | None = None, clock=None,
                    seconds: float | None = None, loaded: tuple | None = None):
    """A pilot profile of ``problems`` of the pool (None: PILOT_PROBLEMS) on this machine sizes the used bucket
    before any stage runs (:mod:`rollscale.pipeline.init.pilot`); its Foresight, with a line of what it cost.
    ``clock`` (:class:`rollscale.pipeline.init.clock.InitClock`): the pilot gets ``seconds`` of it (None: all
    that is left), stopped inside a batch there; None when it had no time for one problem. ``loaded``: the model,
    loaded once for the pilot and the calibration (:func:`rollscale.pipeline.check.calibration.load_for_calibration`)."""
    import time

    from rollscale.pipeline.init.hours import params_of
    from rollscale.pipeline.init.pilot import PILOT_PROBLEMS, PILOT_SECONDS, Foresight, foresee, pilot_profile

    t0 = time.perf_counter()
    asked = PILOT_PROBLEMS if problems is None else problems
    if clock is None:
        pilot = pilot_profile(params_of(values, why), count=asked)
    else:
        with clock.step("pilot profile (one timed generation, then the problems)", seconds) as end:
            pilot = pilot_profile(params_of(values, why), count=asked, seconds=math.inf, deadline=end, say=clock.say,
                                  loaded=loaded[:2] if loaded else None)
    took = f"init: pilot profile of {len(pilot)} problems in {time.perf_counter() - t0:.0f} s"
    if pilot.empty:
        return Foresight(None, None, 0, (took + ": init's time ran out before one problem was sampled; the used "
                                         "bucket is sized for the default study's share, and `rollscale check` "
                                         "says after the profile stage whether it holds",))
    seen = foresee(values, why, pilot, pool)
    if len(pilot) < min(asked, pool):
        took += (" (what its share of init's time held; fewer problems give a wider bound on the bucket's share)"
                 if clock is not None else
                 f" (stopped after {PILOT_SECONDS:.0f} s: generation is slow here; fewer problems give a wider "
                 "bound on the bucket's share)")
    return Foresight(seen.easy, seen.bounds, seen.limit_min, (took, *seen.lines), pilot)


def busy() -> str:
    """This machine's load, for a line that says why init ran out of time."""
    import os

    try:
        load = os.getloadavg()[0]
    except OSError:
        return f"{os.cpu_count()} cores"
    return f"load average {load:.1f} on {os.cpu_count()} cores"


def hours_values(values: dict, why: dict, hours: float | None, artifacts: Path, pool: int | None,
                 budget: int | None = None, foresight=None, clock=None, loaded: tuple | None = None
                 ) -> tuple[str, float]:
    """``--hours H``: measure this machine's calibration (stored in ``artifacts`` for `rollscale check`) and
    shrink the study to H hours (:func:`rollscale.pipeline.init.hours.fit_hours`), keeping the pool the pilot's
    ``foresight`` needs; with ``hours`` None (``--budget`` alone) only the estimate. The lines to print, and the
    estimate in seconds. ``clock``: init's stop time, which bounds the calibration's learning-rate probe."""
    from rollscale.pipeline.check.calibration import CalibrationTimeUp, calibrate
    from rollscale.pipeline.check.timing import stage_times
    from rollscale.pipeline.init.hours import fit_hours, params_of

    if clock is None:
        cal = calibrate(params_of(values, why), artifacts)
    else:
        with clock.step("calibration (generate and train timing, learning-rate probe)") as end:
            try:
                cal = calibrate(params_of(values, why), artifacts, deadline=end, say=clock.say, loaded=loaded)
            except CalibrationTimeUp as err:
                raise ValueError(f"init: nothing written: {err} did not end within init's {clock.budget_s:.0f} s "
                                 f"of measuring ({busy()}): run it where the machine is less busy, or give it more "
                                 "--hours (its time is 5 % of them)") from None
    if hours is None:
        params = params_of(values, why)
        times, given = stage_times(params, cal, min(pool, params.data.limit or pool) if pool else params.data.limit), []
    else:
        seen = {"easy": foresight.easy, "limit_min": foresight.limit_min} if foresight and foresight.easy else {}
        with clock.step(f"sizing the study to --hours {hours:g}") if clock is not None else nullcontext():
            times, given = fit_hours(values, why, hours, cal, pool, **seen)
    per = ", ".join(f"{stage} {t / 60:.1f} min" for stage, t in times.seconds.items())
    flag = f"--hours {hours:g}" if hours is not None else f"--budget {budget}"
    head = (f"init {flag}: about {times.total / 60:.0f} min on this machine ({per}; calibration measured "
            f"in {cal.measured_s:.0f} s, stored in {artifacts})")
    if hours is not None and times.total > hours * 3600:
        head += f": more than {hours:g} h even at the smallest study init writes; give it more hours or a faster machine"
    if hours is None:
        return head, times.total
    gave = "".join(f"\n  gave up {g.text()}" for g in given) or "\n  gave up nothing: the suggested study fits"
    return head + gave, times.total


# the pilot's share of init's measuring time where a calibration follows it (the calibration loads the model again
# and times generation and training; the learning-rate probe takes what is left)
PILOT_SHARE = 0.45

# the most init raises lr_base over its suggestion (TRL's and verl's defaults) on the probe's word: a rate 50 x
# theirs is at the top of what small models are fine-tuned at; past it the check's warning names what is needed
LR_MAX_FACTOR = 50


def lr_values(values: dict, why: dict, artifacts: Path) -> str:
    """The learning-rate probe's word on ``sweep.train.lr_base``: where the slowest planned run
    would not move the policy, the rate that does (at most LR_MAX_FACTOR x the suggested one) is written, with
    why. Called where ``--hours`` or ``--budget`` measured the calibration (stored in ``artifacts``); the line to
    print ("" when the probe measured nothing or saw no gradient: the check's warning then says what would help)."""
    from rollscale.core.grpo.shaping import KL_MOVED, lr_to_move, round_up
    from rollscale.pipeline.check.calibration import calibrate
    from rollscale.pipeline.check.lr import slowest_run
    from rollscale.pipeline.init.hours import params_of

    params = params_of(values, why)
    slow = slowest_run(params, calibrate(params, artifacts))  # the one hours_values measured: its key is the same
    if slow is None or slow.kl <= 0:
        return ""
    n, b, steps, _, kl = slow
    lr_base = params.sweep.train.lr_base
    run = f"the slowest run (n={n} x B_problem={b}, {steps} steps)"
    if kl >= KL_MOVED:
        return (f"init: sweep.train.lr_base {lr_base:g} moves the policy: the learning-rate probe expects {run} to "
                f"reach a KL to the start of {kl:.2g}, past {KL_MOVED:.2g}")
    need = round_up(lr_to_move(lr_base, kl))
    chosen = min(need, round_up(LR_MAX_FACTOR * lr_base))
    capped = f" (capped at {LR_MAX_FACTOR} x; {need:g} would reach it)" if chosen < need else ""
    values["sweep.train.lr_base"] = chosen
    why["sweep.train.lr_base"] = (f"the learning-rate probe: at {lr_base:g} {run} would reach a KL to the start of "
                                  f"{kl:.2g}, below {KL_MOVED:.2g}{capped}; lr = lr_base * sqrt(B / b_base)")
    return (f"init: sweep.train.lr_base {lr_base:g} -> {chosen:g}: at {lr_base:g} the learning-rate probe expects "
            f"{run} to reach a KL to the start of {kl:.2g}, below {KL_MOVED:.2g} (a token's log-prob moved by "
            f"0.05){capped}")


def too_long(total_s: float, hours: float | None, budget: int | None, gpu: str) -> str:
    """The one line for a study estimated past TIME_MARGIN x the time asked (``hours``, or BUDGET_HOURS for
    ``--budget`` alone), naming what would fit; "" when it is within."""
    asked = hours if hours is not None else BUDGET_HOURS
    if total_s <= TIME_MARGIN * asked * 3600:
        return ""
    what = f"the {asked:g} h asked (--hours)" if hours is not None else f"{asked:g} h (the check's limit; --hours sets yours)"
    would = ([] if gpu.lower() not in ("none", "cpu") else ["a GPU (--gpu)"]) + \
        [f"--hours {math.ceil(total_s / 3600)}"] + ([f"a smaller --budget than {budget:,}"] if budget else [])
    return (f"the study takes about {total_s / 3600:.1f} h on this machine, more than {TIME_MARGIN} x {what}: "
            f"{', or '.join(would)} would fit it")


def answerable(values: dict, why: dict, artifacts: Path, hours: float | None, n_params: int, force: bool) -> str:
    """The study as it would be written, against the verdict `rollscale check` gives
    (:func:`rollscale.pipeline.check.answerable.answer_verdict`): "" where it can settle a key at its tolerance;
    where it cannot, a ValueError naming what would (the hours here, an H100's minutes), or with ``force`` that
    line, to be said first."""
    from rollscale.pipeline.check.answerable import answer_verdict
    from rollscale.pipeline.check.calibration import stored_calibration
    from rollscale.pipeline.init.hours import params_of

    params = params_of(values, why)
    verdict = answer_verdict(params, stored_calibration(params, artifacts), hours, n_params)
    if verdict is None or verdict.settles:
        return ""
    if not force:
        raise ValueError(f"init: nothing written (--force writes it anyway): {verdict.line}")
    return verdict.line


def _measure(values: dict, why: dict, machine, pool: int | None, pilot: int | None, hours: float | None,
             budget: int | None, out: str, clock) -> tuple[str, float]:
    """init's measurements within ``clock``'s budget: the pilot profile on CPU (its share: PILOT_SHARE where a
    calibration follows, else all of it), then the calibration with ``--hours`` or ``--budget``; the lines to
    print and the estimated seconds of the study (0 without a calibration)."""
    from rollscale.pipeline.init.values import EASY_SHARE

    from rollscale.pipeline.check.calibration import load_for_calibration, stored_calibration
    from rollscale.pipeline.init.hours import params_of

    calibrating = hours is not None or budget is not None
    piloting = machine.gpu is None and pool and pilot != 0
    artifacts = Path(out).parent / "artifacts"
    loaded = None
    if piloting or (calibrating and stored_calibration(params_of(values, why), artifacts) is None):
        with clock.step("loading the model"):  # once, for the pilot and the calibration
            loaded = load_for_calibration(params_of(values, why), artifacts)
    foresight = (foresee_buckets(values, why, pool, pilot, clock,
                                 PILOT_SHARE * clock.left() if calibrating else None, loaded) if piloting else None)
    sized = "\n".join(foresight.lines) if foresight else ""
    if foresight is not None and foresight.pilot is not None:  # `rollscale check` reads its greedy answers
        from rollscale.pipeline.check.greedy import PILOT_FILE

        (Path(out).parent / "artifacts").mkdir(parents=True, exist_ok=True)
        foresight.pilot.to_parquet(Path(out).parent / "artifacts" / PILOT_FILE)
    if pilot == 0 and machine.gpu is None:
        sized = ("init: no pilot profile (--pilot 0): the used bucket is sized for the default study's share of it "
                 f"({EASY_SHARE:.0%}); `rollscale check` says after the profile stage whether it holds")
    if not calibrating:
        return sized, 0.0
    said, total = hours_values(values, why, hours, artifacts, pool, budget, foresight, clock, loaded)
    return "\n".join(x for x in (sized, said) if x), total


def init_params(model: str, data: str, gpu: str = "none", out: str = "params.yaml", force: bool = False,
                engine: str | None = None, budget: int | None = None, gpus: int = 1,
                hours: float | None = None, pilot: int | None = None) -> str:
    """Write a params file for ``model`` on ``data``; returns what to print (the decisions, the check).
    ``engine`` (hf | vllm): the sampler, else the machine's (vLLM on a GPU, transformers on CPU);
    ``budget``: the rollouts of the production run, the study's C* (:func:`budget_values`);
    ``gpus``: the GPUs of one node, over which a run is sharded when only so full fine-tuning fits;
    ``hours``: the wall time the study may take here (:func:`hours_values`);
    ``pilot``: the problems of the pilot profile on CPU (:func:`foresee_buckets`; None: PILOT_PROBLEMS, 0: none)."""
    from rollscale.pipeline.init.clock import InitClock, calibration_budget_s
    from rollscale.pipeline.init.values import Machine

    if Path(out).exists() and not force:  # before minutes of reading: the answer will be the same
        raise ValueError(f"{out} exists: pass --force to overwrite it (or --out another file)")
    if pilot is not None and (isinstance(pilot, bool) or not isinstance(pilot, int) or pilot < 0):
        raise ValueError(f"--pilot: expected the problems of the pilot profile (an integer >= 0), got {pilot!r}")
    if hours is not None:
        from rollscale.pipeline.init.hours import check_hours

        check_hours(hours)
    machine = Machine.from_arg(gpu, gpus)
    clock = InitClock(calibration_budget_s(hours))  # from here: reading the model and data counts too
    try:
        return _init(model, data, gpu, out, force, engine, budget, gpus, hours, pilot, machine, clock)
    finally:
        clock.close()


def _init(model: str, data: str, gpu: str, out: str, force: bool, engine: str | None, budget: int | None,
          gpus: int, hours: float | None, pilot: int | None, machine, clock) -> str:
    """:func:`init_params` past its argument checks, on ``clock``."""
    from rollscale.config import StudyParams, load_params
    from rollscale.pipeline.init.values import (B_PROBLEM_MIN, EASY_SHARE, PROBLEMS_MIN, VAL_SIZE_MIN, render,
                                                suggest, write_params)
    from rollscale.core.problems.data_sample import inspect_rows, sample_rows
    from rollscale.config.data import TableParams
    from rollscale.core.problems.sources import table_problems
    from rollscale.lm.model_info import inspect_model, resolve_model
    from rollscale.pipeline.check.findings import Finding, format_findings, known_data, study_findings
    from rollscale.pipeline.init.project import init_project
    import dataclasses

    from rollscale.pipeline.check.calibration import stored_calibration
    from rollscale.pipeline.check.greedy import greedy_findings
    from rollscale.pipeline.init.clock import CALIBRATION_SHARE

    with clock.step("reading the model's files and the data"):
        name_or_path, gguf_file = resolve_model(model)
        info = inspect_model(name_or_path, gguf_file)
        try:  # datasets draws a progress bar per file it reads; init prints its own summary
            import datasets

            datasets.disable_progress_bars()
        except ImportError:
            pass
        placed = sample_rows(data)
        sample = inspect_rows([row for _, row in placed], _token_counter(name_or_path, gguf_file),
                              [place for place, _ in placed])
        data_path = _data_arg(data)
        if Path(data).exists():
            source = TableParams(path=data_path, prompt=sample.prompt, answer=sample.answer,
                                 answer_format=sample.answer_format, reward=sample.reward)
            table_problems(source, limit=50)  # the mapping must read the file's rows (DataRowError names a bad one)
        pool = problem_count(source) if Path(data).exists() else None
        if pool is not None and pool < PROBLEMS_MIN:  # the bucket stage would refuse it after the profile's hours
            raise ValueError(f"--data {data}: {pool} problem(s); a study needs at least {PROBLEMS_MIN} to bucket "
                             f"({VAL_SIZE_MIN} to validate on and {B_PROBLEM_MIN} to train on, were every one Easy; "
                             f"about {math.ceil(PROBLEMS_MIN / EASY_SHARE)} with the usual {EASY_SHARE:.0%} in Easy)")
    values, why = suggest(info, sample, data_path, pool, machine)
    if engine:
        values["sampling.backend"], why["sampling.backend"] = engine, f"--engine {engine}"
        if engine == "vllm":  # one engine per worker process, or per rank of a sharded run (the config refuses more)
            devices = values.get("sweep.devices_per_run", 1)
            values["workers"], why["workers"] = devices, ("vLLM: one engine, in one worker process" if devices == 1
                                                          else why["workers"])
    if budget is not None:
        budget_values(values, why, budget, values.get("sweep.search.eta", StudyParams().sweep.search.eta))
    sized, total = _measure(values, why, machine, pool, pilot, hours, budget, out, clock)
    if hours is not None or budget is not None:
        if late := too_long(total, hours, budget, gpu):
            if not force:
                raise ValueError(f"init: {late}; nothing written (--force writes it anyway)")
            sized += f"\nwarning: {late} (written: --force)"
        if moved := lr_values(values, why, Path(out).parent / "artifacts"):
            sized += f"\n{moved}"
    with clock.step("what the study resolves, and the hours its tolerance needs"):
        cannot = answerable(values, why, Path(out).parent / "artifacts", hours, info.n_params, force)
    command = (f"rollscale init --model {model} --data {data} --gpu {gpu}" + (f" --engine {engine}" if engine else "")
               + (f" --budget {budget}" if budget is not None else "") + (f" --gpus {gpus}" if gpus > 1 else "")
               + (f" --hours {hours:g}" if hours else "") + (f" --pilot {pilot}" if pilot is not None else ""))
    header = ([f"It cannot answer: {cannot}"] if cannot else []) + [
              f"rollscale study parameters, written by `{command}`.",
              "Each comment says why its value; everything else is the schema's default (rollscale/config/study.py).",
              "`rollscale check` tells whether this study can answer; rerun it after the profile stage."]
    path = write_params(out, render(values, why, header), force)
    project = init_project(Path(path).parent, data, force, values["model.kind"])  # an empty folder becomes the study's
    params = load_params(path)
    known = known_data(params, None)  # a new study: a profile under artifacts/ is of another one
    known = dataclasses.replace(known, calibration=stored_calibration(params, Path(path).parent / "artifacts"))
    past_context = context_warning(info.max_positions, sample.prompt_tokens, sample.token_unit)
    long = [Finding(*past_context)] if past_context else []
    greedy = [Finding(*f) for f in greedy_findings(params, Path(path).parent / "artifacts")]
    chosen = ", ".join(f"{k} = {values[k]}" for k in ("model.lora.enabled", "sampling.backend",
                                                       "sampling.max_new_tokens", "sweep.c_max")
                       + (("sweep.devices_per_run",) if "sweep.devices_per_run" in values else ())
                       + (("study.target_budget",) if budget is not None else ()))
    took = (f"init: measured in {clock.elapsed():.0f} s (its budget: {clock.budget_s:.0f} s, "
            + (f"{CALIBRATION_SHARE:.0%} of --hours {hours:g})" if hours is not None else "without --hours)"))
    first = (f"init: cannot answer (written: --force; `rollscale study --no-check` runs it): {cannot}\n"
             if cannot else "")
    return (first + took + "\n" + f"init: wrote {path} ({info.architecture}, {info.n_params / 1e6:,.0f}M parameters; {sample.rows} rows "
            f"sampled: prompt {sample.prompt!r} ({sample.prompt_kind}), answer {sample.answer!r} "
            f"({sample.answer_format}, reward {sample.reward}); {chosen})\n"
            + (sized + "\n" if sized else "")
            + "".join(line + "\n" for line in project)
            + format_findings([*long, *study_findings(params, known), *greedy], str(path)))
