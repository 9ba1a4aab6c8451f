"""Checks every sampling engine must pass (used by test_engines.py and test_engines_vllm.py)."""

from __future__ import annotations

import torch

from rollscale.lm.engines.base import prompt_ids
from rollscale.lm.models import char_tokenizer, render_prompt, tiny_llama
from rollscale.core.rollouts import SamplingConfig

PROMPT_TEXTS = ["1+2=", "33*4=", "(7-5)*9="]
SAMPLED = SamplingConfig(temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=6)
GREEDY = SamplingConfig(temperature=0.0, max_new_tokens=6)


def tiny(seed: int = 0):
    """The tiny Llama (head_dim 32) and its character tokenizer, float32, eval mode."""
    torch.manual_seed(seed)
    tokenizer = char_tokenizer()
    model = tiny_llama(len(tokenizer.get_vocab()), seed=seed)
    model.eval()
    return model, tokenizer


def prompts(tokenizer) -> list[str]:
    return [render_prompt(tokenizer, t, use_chat_template=False) for t in PROMPT_TEXTS]


def token_lists(groups) -> list[list[list[int]]]:
    return [[r.token_ids for r in g] for g in groups]


def check_seeds(engine, tokenizer) -> None:
    """Per-request seeds: samples differ across prompts/samples and across call seeds, repeat on rerun."""
    first = engine.sample(prompts(tokenizer), 4, SAMPLED, seed=11)
    again = engine.sample(prompts(tokenizer), 4, SAMPLED, seed=11)
    other = engine.sample(prompts(tokenizer), 4, SAMPLED, seed=12)
    assert token_lists(first) == token_lists(again)
    assert token_lists(first) != token_lists(other)
    for group in first:  # four samples of one prompt are not copies of one another
        assert len({tuple(r.token_ids) for r in group}) > 1
    # the same prompt at another position in the call is another request: its own samples
    same_prompt = engine.sample([prompts(tokenizer)[0]] * 2, 4, SAMPLED, seed=11)
    assert token_lists(same_prompt)[0] != token_lists(same_prompt)[1]


def hf_greedy(model, ids: list[int], max_new_tokens: int, end_ids) -> list[int]:
    """Argmax decoding by full forward passes (no cache, no padding): the reference."""
    out = list(ids)
    with torch.no_grad():
        for _ in range(max_new_tokens):
            token = int(model(torch.tensor([out])).logits[0, -1].argmax())
            out.append(token)
            if token in end_ids:
                break
    return out[len(ids):]


def teacher_forced_logprobs(model, ids: list[int], completion: list[int], temperature: float = 1.0) -> list[float]:
    with torch.no_grad():
        logits = model(torch.tensor([ids + completion])).logits[0].float() / temperature
    logp = torch.log_softmax(logits, -1)
    return [float(logp[len(ids) - 1 + k, t]) for k, t in enumerate(completion)]


def max_logprob_gap(engine, model, tokenizer, config: SamplingConfig = SAMPLED) -> float:
    """Largest |engine logprob - HF teacher-forced logprob| over a call's sampled tokens."""
    return logprob_gap(engine.sample(prompts(tokenizer), 3, config, seed=5), model, tokenizer, config)


def logprob_gap(groups, model, tokenizer, config: SamplingConfig = SAMPLED) -> float:
    ids = prompt_ids(tokenizer, prompts(tokenizer))
    gaps = []
    for i, group in enumerate(groups):
        for r in group:
            assert r.logprobs is not None and len(r.logprobs) == r.n_tokens
            ref = teacher_forced_logprobs(model, ids[i], r.token_ids, config.temperature or 1.0)
            gaps += [abs(a - b) for a, b in zip(ref, r.logprobs)]
    return max(gaps)


def optimizer_step(model, tokenizer, lr: float = 0.05) -> None:
    """One AdamW step that changes the greedy continuations (a supervised loss on a fixed answer)."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr)
    ids = torch.tensor([tokenizer("<s>1+2=3+3+3+3</s>", add_special_tokens=False)["input_ids"]])
    model.train()
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    model.eval()


def check_greedy_follows_updates(engine, model, tokenizer) -> None:
    """After an optimizer step and sync_weights the engine's greedy tokens are HF's on the new weights."""
    texts = prompts(tokenizer)
    ids = prompt_ids(tokenizer, texts)
    before = token_lists(engine.sample(texts, 1, GREEDY, seed=0))
    optimizer_step(model, tokenizer)
    engine.sync_weights(model)
    after = token_lists(engine.sample(texts, 1, GREEDY, seed=0))
    reference = [[hf_greedy(model, p, GREEDY.max_new_tokens, engine.eos_ids)] for p in ids]
    assert after == reference
    assert after != before  # the step changed the policy, so a stale engine would fail above


def odd_length(completion: str, gold: str) -> float:
    """A stand-in verifier with mixed rewards on an untrained model (advantages are non-zero,
    so every step moves the policy): 1 for an odd-length completion."""
    return float(len(completion) % 2)


def odd_problems():
    """(train, val) arithmetic problems scored by :func:`odd_length`."""
    import dataclasses

    from rollscale.core.problems.sets import reasoning_gym_problems

    problems = reasoning_gym_problems("chain_sum", 60, 0, dict(min_terms=2, max_terms=2, min_digits=1, max_digits=1),
                                      prompt_style="expression")
    problems = [dataclasses.replace(p, reward="tests.engine_checks:odd_length") for p in problems]
    return problems[:40], problems[40:]


def run_setup(tmp_path):
    """A saved tiny model and :func:`odd_problems`, for a sweep run (tasks.sweep.train_run)."""
    from rollscale.lm.models import ModelRef

    model, tokenizer = tiny()
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    ref = ModelRef(str(tmp_path / "model"), chat_template=False, fingerprint="tiny")
    return (ref, *odd_problems())


def run_config(**train):
    from rollscale.train.run_config import RunConfig

    """Three steps of 4 prompts x 8 rollouts, every group trained (the filters off), a large rate."""
    return RunConfig(n=8, b_problem=4, c_max=96, sampling=SamplingConfig(temperature=1.0, max_new_tokens=8),
                     eval_per_doubling=0, eval_every=2, eval_k=2, checkpoint_every=2,
                     train=dict(lr_base=0.05, b_base=32, warmup_steps=0, micro_batch_tokens=128, zero_var_filter=False,
                                overlong_filter=False, **train))
