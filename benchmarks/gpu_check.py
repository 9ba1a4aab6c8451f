"""What docs/gpu.md only estimates, measured on one CUDA GPU, in one time-boxed run (about 4-5 minutes).

    bash benchmarks/gpu_check.sh OUT                      # on the GPU machine (installs .whl first)
    python benchmarks/gpu_check.py OUT --cpu-smoke        # here: every part, reduced, on CPU

Four parts, each in a process of its own (a clean CUDA context and peak-memory counter each,
a hard time limit, and a crash or CUDA error in one part loses none of the others); each writes
``OUT/part_<name>.json`` and its log, and this process gathers them into ``OUT/results.json`` and
``OUT/results.md`` after every part:

1. ``env``: torch / CUDA / NCCL versions, the GPU, ``nvidia-smi``, and whether every module the
   other parts import is importable (a missing wheel shows here first).
2. ``step``: the CUDA rows of ``benchmarks/step.py`` (``run_qwen_gpu``: random-initialised Qwen3-0.6B
   and 1.7B shapes, one full GRPO step, bf16, gradient checkpointing), run through that file's own
   ``run_one``. As written (B = 256 x 8 rollouts in one generate call of 2,048, 1,024 new tokens)
   a row would need ~240 GB of KV cache and several minutes, so each row runs reduced: 32 prompts
   x 8 rollouts (one generate call of 256, ``sampling.batch_size`` of docs/gpu.md) and
   ``--new-tokens`` (512) new tokens, at ``micro_batch_tokens`` 16,384. The generation and the
   update peaks are read apart (a wrapper around the trainer's ``policy_update``), next to
   docs/gpu.md's estimates for these shapes and ``rollscale.pipeline.check.memory.full_finetune_gb``
   (what ``rollscale init`` decides full fine-tuning vs LoRA by). A random model never ends a
   completion, so ``train.overlong_filter`` masks every rollout out of the loss (the row's
   ``n_tokens`` is 0), but every token still runs forward and backward: time and memory are the
   real step's, and the model FLOP/s count every token of the batch.
3. ``trainer``: ``GRPOTrainer`` with the tiny Llama (``tests/test_distributed.py``'s run: 4 steps of
   4 prompts x 4 rollouts, KL on, 2 PPO epochs, gradient noise every 2 steps, paused at a
   checkpoint after 2 steps and resumed) on CPU, CUDA, CUDA + ``autocast_bf16`` and CUDA +
   ``autocast_bf16`` + gradient checkpointing; plus one ``policy_update`` on the same synthetic
   batch on each, which isolates the devices' arithmetic from their samplers (a CUDA generator
   draws other numbers than a CPU one from the same seed, so the runs' rollouts differ).
4. ``fsdp``: the sweep's sharded launch itself (``tasks.sharded_run.train_sharded``: ``torchrun
   --standalone --nproc_per_node 1 -m tasks.sharded_run``) on CUDA, i.e. NCCL, FSDP2, the
   bf16 ``MixedPrecisionPolicy`` and DCP sharded checkpoints: a run paused at a checkpoint after
   2 steps and resumed by a second launch, and an fp32 run, against part 3's CUDA runs. Then a
   probe of the process group: an NCCL-only group cannot all-reduce the CPU tensors ``Ranks.sum``
   / ``Ranks.max`` use, hence ``init_ranks``' ``cpu:gloo,cuda:nccl``.

``--cpu-smoke`` runs the same code on CPU, reduced: the "cuda" variants of part 3 on CPU, part 4 over
gloo, and part 2's ``run_qwen_gpu`` as written on a tiny Qwen3 shape of the real vocabulary (its
CUDA calls stood in for, :func:`_cpu_stand_ins`).

Parts run in the order env, trainer, fsdp, step: the last takes what is left of ``--deadline``
(each of its rows an equal share), so a slow generation cannot cost the other parts.
``reasoning_gym`` (and its ten dependencies) is not on the GPU machine: the problems are
chain-sum expressions made here (:func:`chain_sum_problems`); the models are random or tiny, so
only the prompts' shape matters.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# the problems' verifier, for the runs that import it (torchrun's ranks): a module of its own, see reward_module
REWARD_MODULE = "rollscale_gpu_check_reward"
REWARD_REF = f"{REWARD_MODULE}:odd_length_reward"
SHAPES = ("Qwen3-0.6B", "Qwen3-1.7B")
SMOKE_SHAPE = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                   num_key_value_heads=1, head_dim=16, vocab_size=151936, tie_word_embeddings=True)
# docs/gpu.md, "What a step costs" (Qwen3-0.6B, B = 256 x 8, 1,024 new tokens, micro_batch_tokens 16,384) and
# "Training side" (1.7B: ~3x the parameter memory): the figures as the page states them
DOC_FIGURES = {
    "Qwen3-0.6B": {"state_bf16_gb": 4.8, "state_fp32_gb": 9.6, "logits_gb": 5.0, "logits_with_grad_gb": 10.0,
                   "logsoftmax_slice_gb": 2.0, "checkpointed_hidden_gb": 1.0, "kv_per_rollout_mb_1224": 137.0,
                   "kv_256_rollouts_gb": 35.0, "update_peak_gb": "25-30", "update_flop": 7e15,
                   "update_s_at_40pct": 20.0},
    "Qwen3-1.7B": {"state_bf16_gb": 14.0, "update_peak_gb": "~3x the 0.6B state + the same activations"},
}
H100_BF16_PEAK = 989e12  # dense bf16 FLOP/s (vendor figure), the "40 % of bf16 peak" of docs/gpu.md
TRAIN_COLUMNS = ("c", "c_tokens", "reward_mean", "loss", "policy_loss", "kl", "entropy", "clip_frac", "grad_norm",
                 "n_tokens", "response_len_mean")
PAUSE_C = 32  # rollouts: the tiny runs (16 a step) pause at a checkpoint after 2 of their 4 steps


def log(msg: str) -> None:
    print(f"[gpu_check {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def odd_length_reward(completion: str, gold: str) -> float:
    """A reward an untrained model gets about half the time: mixed groups, so every step updates."""
    return float(len(completion) % 2 == 1)


def reward_module(folder: Path) -> None:
    """:func:`odd_length_reward` as a module of its own in ``folder``, put on the PYTHONPATH that
    torchrun's ranks inherit (a unique name shadows nothing, as benchmarks/ on the path could)."""
    import inspect

    (folder / f"{REWARD_MODULE}.py").write_text(inspect.getsource(odd_length_reward))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))


def chain_sum_problems(name: str = "chain_sum", size: int = 24, seed: int = 0, config: dict | None = None,
                       prompt_style: str = "expression") -> list:
    """Stand-in for ``reasoning_gym_problems`` (same signature): ``size`` distinct expressions
    such as ``"7+3="`` (2 terms of 1 digit when ``config`` asks for ``max_digits`` 1, as the tiny
    runs do; else 2-3 terms of 1-2 digits), scored by :data:`REWARD_REF`."""
    import random

    from rollscale.core.problems.problem import Problem

    cfg = dict(config or {})
    rng = random.Random(seed)
    top = 10 ** cfg.get("max_digits", 2) - 1
    terms = (cfg.get("min_terms", 2), cfg.get("max_terms", 3))
    out: dict[str, Problem] = {}
    while len(out) < size:
        values = [rng.randint(1, top) for _ in range(rng.randint(*terms))]
        signs = [rng.choice("+-") for _ in values[1:]]
        expr = str(values[0]) + "".join(f"{s}{v}" for s, v in zip(signs, values[1:]))
        answer = values[0] + sum(v if s == "+" else -v for s, v in zip(signs, values[1:]))
        out.setdefault(expr, Problem.create(f"gpu_check:{name}", expr + "=", str(answer), REWARD_REF))
    return list(out.values())


def loaded_packages() -> list[str]:
    """Top-level non-stdlib modules this process imported (what the GPU machine must hold)."""
    tops = {m.split(".")[0] for m in sys.modules}
    return sorted(m for m in tops - set(sys.stdlib_module_names) if not m.startswith("_"))


def step_bench():
    """benchmarks/step.py, loaded from its file (an installed package named "benchmarks" would shadow the folder)."""
    import importlib.util

    name = "rollscale_benchmarks_step"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / "step.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def _cuda_peak_mb() -> float:
    import torch

    return torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else float("nan")


# ---------------------------------------------------------------- part 1: the environment


def part_env(args: argparse.Namespace) -> dict:
    """Versions, the GPU, nvidia-smi, and each module the other parts import (a missing wheel shows here)."""
    import importlib
    import importlib.metadata as md

    import torch

    out: dict = {"python": sys.version.split()[0], "torch": torch.__version__, "torch_cuda": torch.version.cuda,
                 "cuda_available": torch.cuda.is_available(), "cwd": os.getcwd(),
                 "pythonpath": os.environ.get("PYTHONPATH", "")}
    for dist in ("transformers", "peft", "accelerate", "tokenizers", "safetensors", "numpy", "pandas", "pyarrow",
                 "scipy", "pydantic", "pydantic_core", "typing_extensions", "filelock", "PyYAML"):
        try:
            out[f"v_{dist}"] = md.version(dist)
        except md.PackageNotFoundError:
            out[f"v_{dist}"] = None
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        out |= {"gpu": torch.cuda.get_device_name(0), "capability": list(torch.cuda.get_device_capability(0)),
                "gpu_memory_gib": props.total_memory / 2**30, "sms": props.multi_processor_count,
                "nccl": str(torch.cuda.nccl.version()), "cudnn": torch.backends.cudnn.version(),
                "bf16_supported": torch.cuda.is_bf16_supported()}
    for cmd in (["nvidia-smi", "--query-gpu=name,memory.total,driver_version,clocks.max.sm", "--format=csv,noheader"],
                ["nvidia-smi", "-L"]):
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
            out[" ".join(cmd[:2])] = (done.stdout or done.stderr).strip()
        except (OSError, subprocess.TimeoutExpired) as err:
            out[" ".join(cmd[:2])] = f"{type(err).__name__}: {err}"
    imports = {}
    for module in ("pydantic", "rollscale.config", "rollscale.train.trainer", "rollscale.train.distributed",
                   "rollscale.train.sharded_checkpoint", "rollscale.pipeline.init.values", "tasks.sharded_run",
                   "tasks.models", "benchmarks/step.py"):
        try:
            mod = step_bench() if module.endswith(".py") else importlib.import_module(module)
            imports[module] = "ok " + str(getattr(mod, "__file__", ""))
        except Exception as err:  # noqa: BLE001 - recorded: the point of this part
            imports[module] = f"{type(err).__name__}: {err}"
    out["imports"] = imports
    return out


# ---------------------------------------------------------------- part 2: benchmarks/step.py's CUDA rows


def _qwen_shape(shape: str) -> dict:
    return SMOKE_SHAPE if shape == "Qwen3-smoke" else step_bench().QWEN3_SHAPES[shape]


def doc_estimates(shape: str, rollouts: int, seq_tokens: int, new_tokens: int, micro_batch_tokens: int) -> dict:
    """docs/gpu.md's "What a step costs" formulas (its "how" column) for this row's shape and sizes,
    and ``full_finetune_gb`` of ``rollscale init`` (with its budget: half the GPU for training)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from rollscale.pipeline.check.memory import full_finetune_gb
    from rollscale.pipeline.init.values import GPU_MEMORY_GB

    dims = _qwen_shape(shape)
    with torch.device("meta"):
        n_params = sum(p.numel() for p in Qwen3ForCausalLM(Qwen3Config(**dims)).parameters())
    vocab, layers, hidden = dims["vocab_size"], dims["num_hidden_layers"], dims["hidden_size"]
    kv_per_token = 2 * layers * dims["num_key_value_heads"] * dims["head_dim"] * 2
    rows_per_micro = max(1, micro_batch_tokens // seq_tokens)
    est = {
        "n_params": n_params,
        "state_bf16_gb": n_params * 2 * 4 / 1e9,  # weights, gradients, AdamW's two moments, bf16
        "logits_gb": micro_batch_tokens * vocab * 2 / 1e9,
        "logits_with_grad_gb": 2 * micro_batch_tokens * vocab * 2 / 1e9,
        "logsoftmax_slice_gb": rows_per_micro * min(256, new_tokens) * vocab * 4 * 2 / 1e9,  # 256-position slices
        "checkpointed_hidden_gb": micro_batch_tokens * hidden * 2 * layers / 1e9,
        "kv_per_token_bytes": kv_per_token,
        "kv_call_gb": rollouts * seq_tokens * kv_per_token / 1e9,  # one generate call of every rollout
        "update_flop": 8 * n_params * rollouts * seq_tokens,
    }
    est["update_peak_gb_sum"] = (est["state_bf16_gb"] + est["logits_with_grad_gb"] + est["logsoftmax_slice_gb"]
                                 + est["checkpointed_hidden_gb"])
    est["generation_peak_gb_sum"] = n_params * 2 / 1e9 + est["kv_call_gb"]
    est["update_s_at_40pct_h100"] = est["update_flop"] / (0.4 * H100_BF16_PEAK)
    est["init_full_finetune_gb"] = full_finetune_gb(n_params, "bfloat16", micro_batch_tokens, vocab)
    est["init_budget_gb_h100"] = GPU_MEMORY_GB["H100"] * 0.5
    est["init_decision_h100"] = "full" if est["init_full_finetune_gb"] <= est["init_budget_gb_h100"] else "lora"
    return est


def part_step_row(args: argparse.Namespace) -> dict:
    """One of benchmarks/step.py's CUDA rows (its ``run_one``), reduced (see the module doc), with the
    generation and update peaks read apart, and docs/gpu.md's estimates for the same shape and sizes."""
    import torch

    import rollscale.core.problems.sets as sets
    import rollscale.train.trainer as trainer_module

    bench = step_bench()
    shape, smoke = args.shape, args.cpu_smoke
    sets.reasoning_gym_problems = chain_sum_problems  # run_qwen_gpu imports it at call time
    phases: dict = {}
    inner = trainer_module.policy_update

    def timed_update(*a, **kw):
        """The step's update, its memory apart from generation's (the trainer calls it by this name)."""
        if torch.cuda.is_available():
            torch.cuda.synchronize()
            phases["generation_peak_mb"] = torch.cuda.max_memory_allocated() / 2**20
            phases["generation_reserved_peak_mb"] = torch.cuda.max_memory_reserved() / 2**20
            phases["allocated_before_update_mb"] = torch.cuda.memory_allocated() / 2**20
            torch.cuda.reset_peak_memory_stats()
        out = inner(*a, **kw)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
            phases["update_peak_mb"] = torch.cuda.max_memory_allocated() / 2**20
            phases["update_reserved_peak_mb"] = torch.cuda.max_memory_reserved() / 2**20
        batch = a[3] if len(a) > 3 else kw["batch"]
        phases.update(update_n_tokens=out["n_tokens"], update_micro_batches=out["micro_batches"],
                      update_batch_tokens=sum(len(p) + len(c) for p, c in zip(batch.prompt_ids, batch.completion_ids)))
        return out

    trainer_module.policy_update = timed_update
    if smoke:
        _cpu_stand_ins(bench)
    spec = dict(model=f"{shape} (random init)", engine="hf", B=args.b_problem * args.n, b_problem=args.b_problem,
                n=args.n, new_tokens=args.new_tokens, micro_batch_tokens=args.micro_batch_tokens, gpu=True,
                threads=min(8, os.cpu_count() or 1))
    prompt_len = max(len(p.prompt) for p in chain_sum_problems(size=2 * args.b_problem + 16)) + 1  # chars + BOS
    seq = prompt_len + args.new_tokens  # a random model never stops early: every completion is new_tokens long
    est = doc_estimates(shape, args.b_problem * args.n, seq, args.new_tokens, args.micro_batch_tokens)
    write_json(part_path(args), {"estimate": est, "doc_figures": DOC_FIGURES.get(shape, {}),
                                 "partial": "estimates only: the row did not finish"})
    log(f"step row {shape}: {args.b_problem} x {args.n} rollouts, {args.new_tokens} new tokens, "
        f"micro_batch_tokens {args.micro_batch_tokens}")
    t0 = time.perf_counter()
    row = bench.run_one(spec)
    row["row_wall_s"] = time.perf_counter() - t0
    row |= phases
    measured = {"seq_tokens_max": seq, "decode_step_ms": 1e3 * row["t_generate"] / args.new_tokens}
    if row.get("update_batch_tokens"):  # every token runs forward and backward, masked out of the loss or not
        flop = 8 * est["n_params"] * row["update_batch_tokens"]
        measured["update_model_tflops"] = flop / row["t_train"] / 1e12
        if shape in DOC_FIGURES and "update_flop" in DOC_FIGURES[shape]:  # the page's full step at this rate
            measured["doc_full_step_update_s_projected"] = DOC_FIGURES[shape]["update_flop"] / (flop / row["t_train"])
    return {"row": row, "estimate": est, "measured": measured, "doc_figures": DOC_FIGURES.get(shape, {})}


def _cpu_stand_ins(bench) -> None:
    """--cpu-smoke only: run_qwen_gpu as written (it moves its model to "cuda" and reads CUDA's
    memory counters) on CPU, with a tiny Qwen3 shape of the real vocabulary."""
    import torch
    import transformers

    class CpuQwen3(transformers.Qwen3ForCausalLM):
        def to(self, *a, **kw):
            return super().to("cpu", torch.bfloat16)

    bench.QWEN3_SHAPES["Qwen3-smoke"] = SMOKE_SHAPE
    transformers.Qwen3ForCausalLM = CpuQwen3
    for name, value in (("reset_peak_memory_stats", None), ("max_memory_allocated", 0), ("get_device_name", "cpu")):
        setattr(torch.cuda, name, lambda *a, _v=value, **kw: _v)


# ---------------------------------------------------------------- part 3: the trainer on CUDA and CPU


def _tiny_model(vocab: int):
    from rollscale.lm.models import tiny_llama

    return tiny_llama(vocab, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, max_positions=32)


def tiny_run_config(autocast: bool, checkpointing: bool):
    """tests/test_distributed.py's run: 4 steps of 4 prompts x 4 rollouts, KL on, 2 PPO epochs,
    small micro-batches, gradient noise every 2 steps, a checkpoint every 2."""
    from rollscale.core.rollouts import SamplingConfig
    from rollscale.train.run_config import RunConfig

    return RunConfig(n=4, b_problem=4, c_max=64, seed=3, eval_per_doubling=0, eval_every=2, eval_k=2, checkpoint_every=2, noise_every=2,
                     sampling=SamplingConfig(temperature=1.0, max_new_tokens=6),
                     train=dict(lr_base=1e-2, b_base=16, warmup_steps=0, kl_coef=0.05, entropy_coef=0.0,
                                zero_var_filter=False, overlong_filter=False, ppo_epochs=2, micro_batch_tokens=40,
                                autocast_bf16=autocast, gradient_checkpointing=checkpointing))


def tiny_problems() -> tuple[list, list]:
    problems = chain_sum_problems(size=24, config=dict(min_terms=2, max_terms=2, max_digits=1))
    return problems[:16], problems[16:]


def _store_rows(run_dir: Path) -> dict:
    from rollscale.train.checkpoint import RunStore

    store = RunStore(run_dir)
    steps, evals = store.rows("steps"), store.rows("evals")
    ckpt = store.latest()
    return {"steps": {c: [float(x) for x in steps[c]] for c in ("step", *TRAIN_COLUMNS) if c in steps},
            "evals": {c: [float(x) for x in evals[c]] for c in evals.select_dtypes("number") if not c.startswith("t_")},
            "checkpoint": None if ckpt is None else {"step": ckpt.step, "files": sorted(
                str(p.relative_to(ckpt.path)) for p in ckpt.path.rglob("*") if p.is_file())}}


def tiny_trainer_run(device: str, autocast: bool, checkpointing: bool, run_dir: Path) -> dict:
    """The tiny run on ``device``, paused at a checkpoint after 2 steps and resumed by a fresh trainer."""
    import torch

    from rollscale.lm.models import char_tokenizer
    from rollscale.train.checkpoint import RunStore
    from rollscale.train.trainer import GRPOTrainer

    train, val = tiny_problems()
    cfg = tiny_run_config(autocast, checkpointing)
    tok = char_tokenizer()
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    statuses = []
    for budget in (PAUSE_C, None):  # the KL reference is the base weights: each trainer starts from them
        trainer = GRPOTrainer(_tiny_model(len(tok)).to(device), tok, train, val, cfg, reward=odd_length_reward,
                              use_chat_template=False)
        result = trainer.run(RunStore(run_dir), budget=budget)
        statuses.append(result.status)
        del trainer
    return {"statuses": statuses, "steps_done": result.steps, "c": result.c, "wall_s": time.perf_counter() - t0,
            "peak_gpu_mb": _cuda_peak_mb() if device == "cuda" else None, **_store_rows(run_dir)}


def same_batch_update(device: str, autocast: bool) -> dict:
    """One ``policy_update`` (micro-batched) of the tiny model on step.py's synthetic batch: the devices'
    arithmetic alone, without their samplers; the gradient as the optimizer gets it (AdamW's first step is
    lr x sign(g), so the weights after it say little)."""
    import torch

    from rollscale.config import TrainParams
    from rollscale.lm.models import char_tokenizer
    from rollscale.train.step import StepSettings, policy_update

    tok = char_tokenizer()
    model = _tiny_model(len(tok)).to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-2)
    grads: list[list] = []
    opt.register_step_pre_hook(lambda *_: grads.append([p.grad.detach().float().cpu().clone() for p in params]))
    batch = step_bench()._synthetic_batch(16, 8, 8, len(tok))
    train = TrainParams(kl_coef=0.0, entropy_coef=0.01, zero_var_filter=False, micro_batch_tokens=64,
                        autocast_bf16=autocast)
    out = policy_update(model, opt, params, batch, StepSettings(train, 1.0, max_new_tokens=8), tok.pad_token_id)
    return {"loss": float(out["loss"]), "grad_norm": float(out["grad_norm"]), "grads": grads[0]}


def part_trainer(args: argparse.Namespace) -> dict:
    """The real trainer on CPU and CUDA (fp32, bf16 autocast, + gradient checkpointing), and one update
    on a shared batch per device; each variant caught on its own."""
    import torch

    cuda = "cpu" if args.cpu_smoke else "cuda"  # --cpu-smoke: the same variants, all on CPU
    torch.set_num_threads(1 if args.cpu_smoke else 4)
    variants = {"cpu": ("cpu", False, False), "cuda": (cuda, False, False), "cuda_bf16": (cuda, True, False),
                "cuda_bf16_ckpt": (cuda, True, True)}
    out: dict = {"runs": {}, "same_batch": {}}
    scratch = Path(tempfile.mkdtemp(prefix="gpu-check-trainer-"))
    for name, (device, autocast, ckpt) in variants.items():
        log(f"trainer: {name} (device {device}, autocast_bf16 {autocast}, gradient_checkpointing {ckpt})")
        out["runs"][name] = _caught(lambda: tiny_trainer_run(device, autocast, ckpt, scratch / name))
    ref = None
    for name, (device, autocast, _) in list(variants.items())[:3]:
        log(f"trainer: same-batch update, {name}")
        got = _caught(lambda: same_batch_update(device, autocast))
        if "grads" in got:
            grads = got.pop("grads")
            ref = grads if ref is None else ref
            scale = max(float(g.abs().max()) for g in ref)
            got["grad_max_rel_diff_vs_cpu"] = max(float((a - b).abs().max()) for a, b in zip(grads, ref)) / scale
        out["same_batch"][name] = got
    shutil.rmtree(scratch, ignore_errors=True)
    return out


# ---------------------------------------------------------------- part 4: FSDP2 over NCCL through torchrun


def nccl_probe() -> dict:
    """An NCCL-only process group and a CPU tensor (what ``Ranks.sum`` all-reduces), then the
    ``cpu:gloo,cuda:nccl`` group ``init_ranks`` makes on CUDA: one process, world size 1."""
    import socket

    import torch
    import torch.distributed as dist

    out = {}
    for backend in ("nccl", "cpu:gloo,cuda:nccl"):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        res = {}
        try:
            torch.cuda.set_device(0)
            dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
            for where in ("cpu", "cuda"):
                try:
                    t = torch.ones(1, dtype=torch.float64, device=where)
                    dist.all_reduce(t)
                    res[f"all_reduce_{where}"] = "ok"
                except Exception as err:  # noqa: BLE001 - recorded: the probe's answer
                    res[f"all_reduce_{where}"] = f"{type(err).__name__}: {str(err)[:300]}"
        except Exception as err:  # noqa: BLE001
            res["init"] = f"{type(err).__name__}: {str(err)[:300]}"
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
        out[backend] = res
    return out


def sharded_launch(device: str, autocast: bool, pause: bool, model_dir: Path, run_dir: Path) -> dict:
    """The sweep's sharded run (``train_sharded``: torchrun, 1 process) of the tiny run; ``pause``: one
    launch to a checkpoint after 2 steps, a second that resumes it from the DCP shards."""
    import torch

    from rollscale.config import SamplingParams
    from rollscale.lm.models import ModelRef
    from tasks.sharded_run import train_sharded

    train, val = tiny_problems()
    cfg = tiny_run_config(autocast, False)
    ref = ModelRef(str(model_dir), dtype="float32", chat_template=False)
    sampling = SamplingParams(backend="hf", temperature=1.0, max_new_tokens=6, batch_size=512)
    run = dict(ref=ref, config=cfg, bucket="easy", train_problems=train, val_problems=val, run_dir=str(run_dir),
               lora=None, device=device, sampling=sampling)
    out: dict = {"launches": []}
    t0 = time.perf_counter()
    for budget in ((PAUSE_C, None) if pause else (None,)):
        t1 = time.perf_counter()
        result = train_sharded(1, min(4, torch.get_num_threads()), **run, budget=budget)
        out["launches"].append({"budget": budget, "status": result.status, "steps": result.steps, "c": result.c,
                                "wall_s": time.perf_counter() - t1})
    out["wall_s"] = time.perf_counter() - t0
    return out | _store_rows(run_dir)


def part_fsdp(args: argparse.Namespace) -> dict:
    """The sharded launch with bf16 mixed precision (paused and resumed) and in fp32, then the NCCL probe."""
    import torch

    from rollscale.lm.models import char_tokenizer

    device = "cpu" if args.cpu_smoke else "cuda"  # --cpu-smoke: gloo, the path tests/test_distributed.py runs
    out: dict = {"device": device}
    scratch = Path(tempfile.mkdtemp(prefix="gpu-check-fsdp-"))
    tok = char_tokenizer()
    _tiny_model(len(tok)).save_pretrained(scratch / "tiny")  # the same base weights as part 3's runs
    tok.save_pretrained(scratch / "tiny")
    reward_module(scratch)
    torch.set_num_threads(1 if args.cpu_smoke else 4)
    for name, autocast, pause in (("sharded_bf16", True, True), ("sharded_fp32", False, False)):
        log(f"fsdp: {name} (autocast_bf16 {autocast}{', paused and resumed' if pause else ''})")
        out[name] = _caught(lambda: sharded_launch(device, autocast, pause, scratch / "tiny", scratch / name))
    shutil.rmtree(scratch, ignore_errors=True)
    if device == "cuda":  # last: this process then holds a CUDA context, and a hang here costs nothing above
        log("fsdp: process-group probe")
        out["probe"] = _caught(nccl_probe)
    return out


# ---------------------------------------------------------------- the parts' processes


PARTS: dict[str, Callable[[argparse.Namespace], dict]] = {
    "env": part_env, "step": part_step_row, "trainer": part_trainer, "fsdp": part_fsdp,
}


def _caught(fn: Callable[[], dict]) -> dict:
    """``fn()``, or its exception as a record (one failing variant loses none of the others)."""
    import traceback

    try:
        return fn()
    except Exception as err:  # noqa: BLE001 - recorded in the results
        traceback.print_exc()
        return {"error": f"{type(err).__name__}: {err}"[:2000]}


def part_path(args: argparse.Namespace) -> Path:
    return Path(args.outdir) / f"part_{args.label}.json"


def write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    os.replace(tmp, path)


def child_main(args: argparse.Namespace) -> None:
    """Run one part in this process and write its JSON (also when it raised; a part may write a
    partial one first, which a timeout then leaves)."""
    t0 = time.perf_counter()
    result = _caught(lambda: PARTS[args.child](args))
    if "error" in result and part_path(args).exists():  # keep what the part wrote before it failed
        result = {**json.loads(part_path(args).read_text()), **result}
    result["part_wall_s"] = time.perf_counter() - t0
    result["imported_packages"] = loaded_packages()
    write_json(part_path(args), result)


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc), to stop what a timed-out part started."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def run_part(label: str, part: str, extra: list[str], timeout: float, args: argparse.Namespace) -> dict:
    """One part in its own process, its output shown as it comes and kept in ``part_<label>.log``;
    killed (with everything it started) past ``timeout`` seconds."""
    outdir = Path(args.outdir)
    cmd = [sys.executable, "-u", __file__, str(outdir), "--child", part, "--label", label, *extra]
    if args.cpu_smoke:
        cmd.append("--cpu-smoke")
    log(f"part {label}: start (limit {timeout:.0f} s)")
    t0 = time.perf_counter()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    tail: list[str] = []
    with open(outdir / f"part_{label}.log", "w") as logfile:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env,
                                start_new_session=True)

        def pump() -> None:
            for line in proc.stdout:
                logfile.write(line)
                tail.append(line)
                del tail[:-40]
                print(f"  {label}| {line}", end="", flush=True)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        status = "ok"
        try:
            proc.wait(timeout=max(timeout, 1))
        except subprocess.TimeoutExpired:
            status = "timeout"
            for pid in [proc.pid, *_descendants(proc.pid)]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            proc.wait()
        reader.join(10)
    seconds = time.perf_counter() - t0
    path = outdir / f"part_{label}.json"
    result = json.loads(path.read_text()) if path.exists() else {}
    if status == "ok" and proc.returncode != 0:
        status = f"exit {proc.returncode}"
    if status == "ok" and "error" in result:
        status = "error"
    if status != "ok" and "error" not in result:
        result["error"] = f"{status}; last output:\n" + "".join(tail[-15:])
    log(f"part {label}: {status} in {seconds:.0f} s")
    return {"status": status, "seconds": seconds, **result}


# ---------------------------------------------------------------- results: JSON and a markdown table


def _max_diff(a: dict, b: dict, columns=TRAIN_COLUMNS) -> dict:
    """max |a - b| per column of two runs' ``steps`` rows (over the steps both have)."""
    out = {}
    for c in columns:
        if c in a.get("steps", {}) and c in b.get("steps", {}):
            pairs = [(x, y) for x, y in zip(a["steps"][c], b["steps"][c]) if x == x and y == y]
            out[c] = max((abs(x - y) for x, y in pairs), default=float("nan"))
    return out


def comparisons(parts: dict) -> dict:
    """The trainer's runs against the CPU run, and the sharded runs against the one-process CUDA runs."""
    runs = parts.get("trainer", {}).get("runs", {})
    fsdp = parts.get("fsdp", {})
    out = {}
    for name in ("cuda", "cuda_bf16", "cuda_bf16_ckpt"):
        if "steps" in runs.get(name, {}) and "steps" in runs.get("cpu", {}):
            out[f"{name} vs cpu"] = _max_diff(runs[name], runs["cpu"])
    for sharded, single in (("sharded_bf16", "cuda_bf16"), ("sharded_fp32", "cuda")):
        if "steps" in fsdp.get(sharded, {}) and "steps" in runs.get(single, {}):
            out[f"{sharded} vs {single}"] = _max_diff(fsdp[sharded], runs[single])
    return out


def _fmt(x, digits: int = 3) -> str:
    if isinstance(x, float):
        return f"{x:.{digits}g}"
    return "-" if x is None else str(x)


def _step_note(shape: str, part: dict) -> str:
    """A step row's estimates one by one (docs/gpu.md's rows, init's figure) and what was measured beside them."""
    est, row = part["estimate"], part.get("row", {})
    gb = lambda key: _fmt(row.get(key, float("nan")) / 1024)  # noqa: E731
    return (f"\n- {shape}: {est['n_params'] / 1e9:.3f}B parameters. docs/gpu.md's rows for these sizes (GB): "
            f"weights + grads + AdamW {est['state_bf16_gb']:.2f}, logits {est['logits_gb']:.2f} "
            f"({est['logits_with_grad_gb']:.2f} with their gradient), float32 log-softmax slice "
            f"{est['logsoftmax_slice_gb']:.2f}, checkpointed hidden states {est['checkpointed_hidden_gb']:.2f}, "
            f"KV cache of the generate call {est['kv_call_gb']:.2f}; init's full_finetune_gb "
            f"{est['init_full_finetune_gb']:.2f} of {est['init_budget_gb_h100']:.0f} ({est['init_decision_h100']}). "
            f"Measured (GB): allocated before the update {gb('allocated_before_update_mb')}, reserved peaks "
            f"{gb('generation_reserved_peak_mb')} (generation) / {gb('update_reserved_peak_mb')} (update); "
            f"{_fmt(row.get('update_micro_batches'))} micro-batches, {_fmt(row.get('update_batch_tokens'))} tokens.")


def markdown(results: dict) -> str:
    """The tables docs/gpu.md needs: measured beside estimated."""
    p = results["parts"]
    lines = [f"# gpu_check ({'CPU smoke' if results['cpu_smoke'] else 'GPU'}), {results['started']}", ""]
    env = p.get("env", {})
    lines += ["## Environment", "", "| what | value |", "| --- | --- |"]
    for k in ("status", "gpu", "gpu_memory_gib", "torch", "torch_cuda", "nccl", "cudnn", "v_transformers", "v_peft",
              "v_pydantic", "nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm", "error"):
        if k in env:
            lines.append(f"| {k} | {_fmt(env[k])} |".replace("\n", " "))
    bad = {m: v for m, v in env.get("imports", {}).items() if not v.startswith("ok")}
    lines.append(f"| imports | {'all ok' if not bad else bad} |")
    lines += ["", "## benchmarks/step.py's CUDA rows (reduced; see part_step_*.json), measured vs docs/gpu.md", "",
              "| shape | status | rollouts x tokens | generation peak GB (est: weights + KV) | update peak GB "
              "(est: doc rows' sum; init's full_finetune_gb) | t_generate s (ms a decode step) | t_train s "
              "(model TFLOP/s) | update s est at 40 % | doc's full-step update s (projected from measured) |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for label, part in p.items():
        if not label.startswith("step_"):
            continue
        row, est, m = part.get("row", {}), part.get("estimate", {}), part.get("measured", {})
        gb = lambda mb: _fmt(mb / 1024) if isinstance(mb, (int, float)) else "-"  # noqa: E731
        doc = part.get("doc_figures", {})
        lines.append(
            f"| {label[5:]} | {part['status']} | {row.get('B', '-')} x {m.get('seq_tokens_max', '-')} | "
            f"{gb(row.get('generation_peak_mb'))} ({_fmt(est.get('generation_peak_gb_sum'))}) | "
            f"{gb(row.get('update_peak_mb'))} ({_fmt(est.get('update_peak_gb_sum'))}; "
            f"{_fmt(est.get('init_full_finetune_gb'))}) | {_fmt(row.get('t_generate'))} "
            f"({_fmt(m.get('decode_step_ms'))}) | {_fmt(row.get('t_train'))} ({_fmt(m.get('update_model_tflops'))}) | "
            f"{_fmt(est.get('update_s_at_40pct_h100'))} | {_fmt(m.get('doc_full_step_update_s_projected'))} "
            f"(doc: {_fmt(doc.get('update_s_at_40pct'))}) |")
        if part["status"] != "ok":
            lines.append(f"|  | {_fmt(part.get('error', ''))[:300]} |".replace("\n", " "))
    lines += [_step_note(label[5:], part) for label, part in p.items() if label.startswith("step_")
              and part.get("estimate")]
    tr = p.get("trainer", {})
    lines += ["", "## The trainer (tiny Llama, 4 steps, paused after 2 and resumed)", "",
              f"part status: {tr.get('status', 'not run')}", "",
              "| run | statuses | steps | wall s | peak GPU MB | losses | rewards |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    runs = dict(tr.get("runs", {}))
    runs |= {k: v for k, v in p.get("fsdp", {}).items() if k.startswith("sharded_") and isinstance(v, dict)}
    for name, run in runs.items():
        if "error" in run:
            lines.append(f"| {name} | error: {_fmt(run['error'])[:300]} |".replace("\n", " "))
            continue
        statuses = run.get("statuses") or [x["status"] for x in run.get("launches", [])]
        st = run.get("steps", {})
        losses = [round(x, 4) for x in st.get("loss", [])]
        rewards = [round(x, 3) for x in st.get("reward_mean", [])]
        lines.append(f"| {name} | {statuses} | {_fmt(run.get('steps_done') or len(st.get('step', [])))} | "
                     f"{_fmt(run.get('wall_s'))} | {_fmt(run.get('peak_gpu_mb'))} | {losses} | {rewards} |")
    lines += ["", "Same synthetic batch, one update per device:", "",
              "| device | loss | grad norm | max abs gradient diff / max abs gradient, vs cpu |",
              "| --- | --- | --- | --- |"]
    for name, got in tr.get("same_batch", {}).items():
        lines.append(f"| {name} | {_fmt(got.get('loss'), 8)} | {_fmt(got.get('grad_norm'), 8)} | "
                     f"{_fmt(got.get('grad_max_rel_diff_vs_cpu'))} |" if "error" not in got
                     else f"| {name} | error: {_fmt(got['error'])[:300]} | | |")
    lines += ["", "Max abs difference of the steps rows:", "", "| pair | " + " | ".join(TRAIN_COLUMNS) + " |",
              "| --- |" + " --- |" * len(TRAIN_COLUMNS)]
    for pair, diff in results.get("comparisons", {}).items():
        lines.append(f"| {pair} | " + " | ".join(_fmt(diff.get(c)) for c in TRAIN_COLUMNS) + " |")
    fsdp = p.get("fsdp", {})
    lines += ["", "## FSDP2 through torchrun (1 process)", "", f"part status: {fsdp.get('status', 'not run')}", ""]
    for backend, res in (fsdp.get("probe") or {}).items():
        lines.append(f"- process group `{backend}`: {res}")
    for name in ("sharded_bf16", "sharded_fp32"):
        run = fsdp.get(name, {})
        lines.append(f"- {name}: launches {run.get('launches', run.get('error'))}; checkpoint "
                     f"{run.get('checkpoint')}")
    return "\n".join(lines) + "\n"


def write_results(results: dict) -> None:
    outdir = Path(results["outdir"])
    results["comparisons"] = comparisons(results["parts"])
    (outdir / "results.json").write_text(json.dumps(results, indent=1, default=str))
    (outdir / "results.md").write_text(markdown(results))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outdir", help="folder for results.json, results.md and each part's JSON and log")
    parser.add_argument("--cpu-smoke", action="store_true", help="every part reduced, on CPU (does it run at all)")
    parser.add_argument("--deadline", type=float, default=None,
                        help="seconds for all parts (default 290 on a GPU, 900 with --cpu-smoke)")
    parser.add_argument("--parts", nargs="*", default=["env", "trainer", "fsdp", "step"], help="which, in this order")
    parser.add_argument("--shapes", nargs="*", default=None, help=f"step rows (default {' '.join(SHAPES)})")
    parser.add_argument("--b-problem", type=int, default=None, help="step rows: prompts (default 32; smoke 2)")
    parser.add_argument("--n", type=int, default=None, help="step rows: rollouts per prompt (default 8; smoke 2)")
    parser.add_argument("--new-tokens", type=int, default=None, help="step rows: new tokens (default 512; smoke 8)")
    parser.add_argument("--micro-batch-tokens", type=int, default=None, help="step rows (default 16384; smoke 256)")
    parser.add_argument("--child", choices=sorted(PARTS), help=argparse.SUPPRESS)  # internal: run one part here
    parser.add_argument("--label", help=argparse.SUPPRESS)
    parser.add_argument("--shape", help=argparse.SUPPRESS)
    args = parser.parse_args()
    smoke = args.cpu_smoke
    defaults = dict(b_problem=(2, 32), n=(2, 8), new_tokens=(8, 512), micro_batch_tokens=(256, 16384))
    for key, (small, full) in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, small if smoke else full)
    if args.child:
        child_main(args)
        return
    Path(args.outdir).mkdir(parents=True, exist_ok=True)
    deadline = args.deadline or (900.0 if smoke else 290.0)
    t_start = time.perf_counter()
    left = lambda: deadline - (time.perf_counter() - t_start)  # noqa: E731
    results = {"outdir": str(Path(args.outdir).resolve()), "cpu_smoke": smoke, "deadline_s": deadline,
               "started": time.strftime("%Y-%m-%d %H:%M:%S"), "argv": sys.argv[1:], "parts": {}}
    limits = {"env": 60.0, "trainer": 90.0, "fsdp": 120.0}  # seconds; "step" takes what is left
    step_args = ["--b-problem", str(args.b_problem), "--n", str(args.n), "--new-tokens", str(args.new_tokens),
                 "--micro-batch-tokens", str(args.micro_batch_tokens)]
    for part in args.parts:
        if part == "step":
            shapes = args.shapes or (["Qwen3-smoke"] if smoke else list(SHAPES))
            for i, shape in enumerate(shapes):
                label = f"step_{shape}"
                share = left() / (len(shapes) - i)
                if share < 20:
                    results["parts"][label] = {"status": "skipped", "error": f"{left():.0f} s of the deadline left"}
                    continue
                results["parts"][label] = run_part(label, "step", ["--shape", shape, *step_args], share, args)
                write_results(results)
            continue
        limit = min(limits[part], left() - 10)
        if limit < 15:
            results["parts"][part] = {"status": "skipped", "error": f"{left():.0f} s of the deadline left"}
            continue
        results["parts"][part] = run_part(part, part, [], limit, args)
        write_results(results)
    results["total_s"] = time.perf_counter() - t_start
    write_results(results)
    log(f"done in {results['total_s']:.0f} s: " + ", ".join(f"{k} {v['status']}" for k, v in results["parts"].items()))
    print(markdown(results), flush=True)


if __name__ == "__main__":
    main()
