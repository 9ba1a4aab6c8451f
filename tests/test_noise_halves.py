"""The noise along training from each step's two random halves of prompts (science §6.4): the step keeps
both halves' mean gradients without changing the update, and the pooled estimates are unbiased."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from rollscale.train.step import (Halves, batch_normalizers, half_weights, micro_batch, micro_batch_loss,
                                  policy_update, split_halves)
from tests.test_step import AGG_MODES, _batch, _model, _ref_fn, _settings


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_split_halves_by_prompt():
    halves = split_halves([3, 3, 3, 3, 3], np.random.default_rng(0))
    assert halves.prompts == (2, 3) and halves.rows.shape == (15,)
    per_prompt = halves.rows.reshape(5, 3)
    assert (per_prompt == per_prompt[:, :1]).all()  # a prompt's rollouts stay together
    assert int(per_prompt[:, 0].sum()) == 3
    assert split_halves([4], np.random.default_rng(0)) is None
    seen = {tuple(split_halves([1] * 4, np.random.default_rng(s)).rows) for s in range(40)}
    assert len(seen) == 6  # every 2-of-4 split occurs: the halves are random


def _settings_for(mode: str, **train):
    return _settings(0.9, max_new_tokens=7, agg_mode=mode, kl_coef=0.1, entropy_coef=0.05, zero_var_filter=True,
                     grad_clip=1.0, **train)


def _halves(n_prompts: int, n: int, seed: int = 0) -> Halves:
    return split_halves([n] * n_prompts, np.random.default_rng(seed))


@pytest.mark.parametrize("lora", [False, True])
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum-norm"])
def test_halves_leave_the_update_unchanged(mode, lora):
    """The optimizer sees the same total gradient: two AdamW steps (two PPO epochs) with and without the
    halves end at the same weights, and the loss columns agree."""
    batch = _batch(12, seed=2)
    out = {}
    for on in (False, True):
        model = _model(lora)
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=0.01)
        settings = _settings_for(mode, micro_batch_tokens=30, ppo_epochs=2)
        row = policy_update(model, opt, params, batch, settings, pad_id=0, ref_logprobs=_ref_fn(model, lora),
                            halves=_halves(4, 3) if on else None)
        out[on] = (row, [p.detach().clone() for p in params])
    # the halves' passes sum the gradient in another order: float rounding, which AdamW's division by the
    # gradients' RMS carries into the weights (as in the sharded run's test); updates are up to 2 x lr = 0.02
    for a, b in zip(out[False][1], out[True][1]):
        torch.testing.assert_close(b, a, rtol=0, atol=2e-5)
    for column in ("loss", "kl", "entropy", "grad_norm", "clip_frac"):
        assert out[True][0][column] == pytest.approx(out[False][0][column], rel=1e-5, abs=1e-7), column
    assert np.isfinite(out[True][0]["half_dot"]) and out[True][0]["half_diff2"] > 0
    assert "half_dot" not in out[False][0]


def _half_gradient(model, batch, rows, settings, ref) -> list[torch.Tensor]:
    """The gradient of the rows' share of the full-batch loss, one pass (no micro-batching)."""
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = None
    norm = batch_normalizers(batch, settings.max_new_tokens)
    mb = micro_batch(batch, np.asarray(rows), 0, torch.device("cpu"))
    micro_batch_loss(model, mb, settings, norm, ref)[0].loss.backward()
    grads = [p.grad.detach().clone() for p in params]
    for p in params:
        p.grad = None
    return grads


@pytest.mark.parametrize("lora", [False, True])
@pytest.mark.parametrize("mode", AGG_MODES)
def test_half_columns_are_the_halves_mean_gradients(mode, lora):
    """``<g_a, g_b>`` and ``|g_a - g_b|^2`` equal those of each half's share of the loss divided by its share
    of the normaliser, computed directly, with the halves cut across several micro-batches."""
    batch = _batch(12, seed=3)
    halves = _halves(4, 3, seed=1)
    settings = _settings_for(mode, micro_batch_tokens=30)
    model = _model(lora)
    ref = _ref_fn(model, lora)
    direct = copy.deepcopy(model)
    wa, wb = half_weights(batch, halves, settings.train.agg_mode)
    assert wa + wb == pytest.approx(1.0) and wa > 0 and wb > 0
    ga = [g / wa for g in _half_gradient(direct, batch, np.flatnonzero(halves.rows == 0), settings, ref)]
    gb = [g / wb for g in _half_gradient(direct, batch, np.flatnonzero(halves.rows == 1), settings, ref)]
    dot = sum(float((a.double() * b.double()).sum()) for a, b in zip(ga, gb))
    diff2 = sum(float(((a.double() - b.double()) ** 2).sum()) for a, b in zip(ga, gb))
    params = [p for p in model.parameters() if p.requires_grad]
    row = policy_update(model, torch.optim.SGD(params, lr=0.0), params, batch, settings, pad_id=0,
                        ref_logprobs=ref, halves=halves)
    scale = sum(float((a.double() ** 2).sum()) for a in ga)
    assert row["half_dot"] == pytest.approx(dot, abs=1e-5 * scale)
    assert row["half_diff2"] == pytest.approx(diff2, rel=1e-4)
    assert (row["half_prompts_a"], row["half_prompts_b"]) == (2, 2)
    assert (row["half_rollouts_a"], row["half_rollouts_b"]) == (6, 6)
