"""Gradient noise measured inside GRPO steps (science §6): the online logger of
sweep runs and the measure stage's numbers."""

import copy

import numpy as np
import pandas as pd
import pytest
import torch

from rollscale.train.checkpoint import RunStore
from rollscale.lm.models import char_tokenizer, tiny_llama, train_supervised
from rollscale.core.noise.correlation import k_sat_null
from rollscale.core.noise.ema import EmaNoiseScale
from rollscale.core.problems.sets import reasoning_gym_problems
from rollscale.core.rollouts import SamplingConfig
from rollscale.train.run_config import RunConfig
from rollscale.train.trainer import GRPOTrainer

ARCH = dict(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, max_positions=32)
NOISE_COLUMNS = ["b_simple", "b_simple_ema", "b_naive", "prompt_noise", "rollout_noise", "rho_icc", "k_sat_icc", "k_crit", "crs"]


@pytest.fixture(scope="module")
def warm():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    tok = char_tokenizer()
    problems = reasoning_gym_problems("chain_sum", 2000, 0, dict(min_terms=2, max_terms=2, min_digits=1, max_digits=1),
                                      prompt_style="expression")
    model = tiny_llama(len(tok), **ARCH)
    train_supervised(model, tok, [(tok.bos_token + p.prompt, p.answer) for p in problems], steps=150,
                     batch_size=64, lr=3e-3, label_smoothing=0.2)
    yield tok, copy.deepcopy(model.state_dict()), problems
    torch.set_num_threads(threads)


def make_trainer(warm, **overrides):
    tok, state, problems = warm
    model = tiny_llama(len(tok), **ARCH)
    model.load_state_dict(copy.deepcopy(state))
    train = dict(lr_base=1e-3, b_base=24, warmup_steps=0, kl_coef=1e-3, entropy_coef=1e-3, zero_var_filter=True,
                 overlong_filter=False)
    cfg = dict(n=6, b_problem=4, c_max=24 * 4, noise_every=1, eval_per_doubling=0, eval_every=2, eval_k=2, checkpoint_every=2,
               train=train, sampling=SamplingConfig(temperature=1.0, max_new_tokens=4))
    cfg.update(overrides)
    return GRPOTrainer(model.eval(), tok, problems[:60], problems[100:110], RunConfig(**cfg), use_chat_template=False)


def test_steps_carry_noise_and_prompt_rows_carry_the_null(warm):
    trainer = make_trainer(warm)
    row = trainer.train_step()
    for col in NOISE_COLUMNS:
        assert col in row
    assert row["noise_n"] == 6 and row["b_simple"] == row["b_simple_ema"]  # one step: EMA = the step's value
    assert row["trace_sigma"] > 0 and np.isfinite(row["rho_icc"]) and 0 <= row["rho_icc"] <= 1
    assert row["crs"] == min(row["k_sat_icc"], row["k_crit"])
    prompts = pd.DataFrame(trainer.last_noise_prompts)
    assert k_sat_null(6) == 4
    assert len(prompts) == 4 and (prompts["k_sat_null"] == 4).all()
    mixed = prompts["pass_rate"].between(0, 1, inclusive="neither")
    assert prompts.loc[mixed, "rho_split"].notna().all()  # zero-variance groups have no gradient: NaN
    assert prompts.loc[~mixed, "rho_split"].isna().all()
    # later steps' smoothed B_simple divides the EMAs of the steps' pieces (science §6.2), not
    # the step's own ratio (inf whenever a step's |G|^2 estimate is <= 0)
    smoothed = []
    wide = make_trainer(warm, b_problem=12, c_max=72 * 6)  # more groups with mixed rewards: |G|^2 > 0
    ema = EmaNoiseScale(wide.config.noise_ema)
    first = wide.train_step()
    ema.update(first["trace_sigma"], first["g_norm2"])
    for _ in range(4):
        later = wide.train_step()
        assert later["b_simple_ema"] == pytest.approx(ema.update(later["trace_sigma"], later["g_norm2"]))
        smoothed.append(later["b_simple_ema"] != later["b_simple"])
    assert any(smoothed)


def test_noise_every_skips_steps(warm):
    trainer = make_trainer(warm, noise_every=2)
    assert "b_simple" not in trainer.train_step()
    assert "b_simple" in trainer.train_step()


def test_trainer_gram_equals_naive_per_rollout_gradients(warm):
    """The trainer's loss terms give each rollout's own gradient (science §6.1): the hook
    Gram equals one autograd.grad per rollout, also when the terms are computed in chunks."""
    import rollscale.train.online_noise as tm
    from rollscale.core.noise.gram import naive_gram

    trainer = make_trainer(warm)
    seen = {}
    real = tm.gram_matrix

    def spy(model, fn, n, *a, **k):
        gram = real(model, fn, n, *a, **k)
        seen["gram"], seen["naive"] = gram, naive_gram(model, fn, n)
        seen["chunked"] = real(model, fn, n, chunk_size=5)
        return gram

    tm.gram_matrix = spy
    try:
        trainer.train_step()
    finally:
        tm.gram_matrix = real
    scale = np.abs(seen["naive"]).max()
    assert scale > 0
    np.testing.assert_allclose(seen["gram"], seen["naive"], atol=1e-4 * scale)
    np.testing.assert_allclose(seen["chunked"], seen["naive"], atol=1e-4 * scale)


def test_resume_with_noise_equals_straight_run(warm, tmp_path):
    """The EMA of B_simple is part of the checkpoint: a killed and resumed run logs the same rows."""
    wall = ["t_generate", "t_score", "t_train", "t_noise"]
    make_trainer(warm).run(RunStore(tmp_path / "straight"))

    class Kill(Exception):
        pass

    def kill_at_step_3(row):
        if row["step"] == 3:
            raise Kill

    with pytest.raises(Kill):
        make_trainer(warm).run(RunStore(tmp_path / "resumed"), on_step=kill_at_step_3)
    make_trainer(warm).run(RunStore(tmp_path / "resumed"))  # a fresh model, as after a crash
    a = RunStore(tmp_path / "straight").rows("steps").drop(columns=wall)
    b = RunStore(tmp_path / "resumed").rows("steps").drop(columns=wall)
    assert a["b_simple_ema"].notna().all() and len(a) == 4
    pd.testing.assert_frame_equal(a.reset_index(drop=True), b.reset_index(drop=True))
