"""What a ``base`` setting buys: train the tiny model with some ``base`` params (or load one),
then its avg@8 at T = 1 on the first 400 problems of the default pool, and the shares that
would land in Easy [0.3, 0.6] and Hard [0, 1/16].

    python benchmarks/base_trials.py --threads 2 steps=800 batch_size=128 lr=0.002
    python benchmarks/base_trials.py --load artifacts/base/model

A quick stand-in for base + profile + bucket (which take minutes more): it ranks settings by
the bucket spread the study needs (Easy and Hard each >= 10 % of the pool) and by training
seconds, measured in the same process. The real shares come from the ``bucket`` stage.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tasks/ runs from the project folder

from rollscale.config import BaseParams, DataParams  # noqa: E402
from rollscale.core.problems.problem import disjoint  # noqa: E402
from rollscale.lm.models import char_tokenizer, tiny_llama, train_supervised  # noqa: E402
from tasks.problems import load_pool  # noqa: E402

K, PROBLEMS = 8, 400


def avg_at_k(model, tokenizer, problems) -> np.ndarray:
    torch.manual_seed(0)
    rates = []
    with torch.no_grad():
        for i in range(0, len(problems), 50):
            chunk = problems[i : i + 50]
            enc = tokenizer([p.prompt for p in chunk for _ in range(K)], return_tensors="pt", padding=True,
                            add_special_tokens=False)
            bos = torch.full((enc.input_ids.shape[0], 1), tokenizer.bos_token_id)
            ids = torch.cat([bos, enc.input_ids], 1)
            attn = torch.cat([torch.ones_like(bos), enc.attention_mask], 1)
            out = model.generate(input_ids=ids, attention_mask=attn, do_sample=True, temperature=1.0, top_k=0,
                                 max_new_tokens=8, pad_token_id=tokenizer.pad_token_id,
                                 eos_token_id=tokenizer.eos_token_id)
            texts = tokenizer.batch_decode(out[:, ids.shape[1] :], skip_special_tokens=True)
            rates += [np.mean([texts[j * K + k].strip() == p.answer.strip() for k in range(K)])
                      for j, p in enumerate(chunk)]
    return np.array(rates)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("settings", nargs="*", metavar="KEY=VALUE", help="base params (YAML values)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--load", help="a saved model folder instead of training one")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    data = DataParams()
    pool = load_pool(data, size=data.size, seed=data.seed)
    tokenizer = char_tokenizer()
    seconds = 0.0
    if args.load:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(args.load)
    else:
        base = BaseParams(**{k: yaml.safe_load(v) for k, v in (s.split("=", 1) for s in args.settings)})
        train = disjoint(load_pool(data, size=base.train_size, seed=base.train_seed), {p.problem_id for p in pool})
        model = tiny_llama(len(tokenizer), base.hidden_size, base.num_layers, base.num_heads, base.intermediate_size,
                           base.max_positions, tokenizer.pad_token_id, tokenizer.bos_token_id,
                           tokenizer.eos_token_id, seed=base.seed)
        start = time.perf_counter()
        train_supervised(model, tokenizer, [(p.prompt, p.answer) for p in train], base.steps, base.batch_size,
                         base.lr, base.seed, label_smoothing=base.label_smoothing)
        seconds = time.perf_counter() - start
    model.eval()
    r = avg_at_k(model, tokenizer, pool[:PROBLEMS])
    print(json.dumps({"settings": args.settings, "threads": args.threads, "load": args.load,
                      "train_seconds": round(seconds, 1), "mean_avg_at_8": round(float(r.mean()), 3),
                      "easy_share": round(float(((r >= 0.3) & (r <= 0.6)).mean()), 3),
                      "hard_share": round(float((r <= 1 / 16).mean()), 3)}))


if __name__ == "__main__":
    main()
