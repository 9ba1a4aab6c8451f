"""Tests of the GRPO step (science §3)."""

import math

import numpy as np
import pytest
import torch

from rollscale.config import TrainParams
from rollscale.core.grpo.loss import grpo_loss
from rollscale.core.grpo.logprobs import token_logprobs, token_logprobs_and_entropy
from rollscale.core.grpo.losses.advantages import group_advantages, nonzero_variance_mask
from rollscale.core.grpo.losses.aggregation import loss_normalizers
from rollscale.core.grpo.losses.regularizers import k3_kl
from rollscale.core.grpo.shaping import overlong_filter_mask, overlong_penalty, sqrt_scaled_lr, warmup_factor

MODES = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]


def _loss(**settings) -> TrainParams:
    """The loss settings (``TrainParams``) with the regularisers and their filter off unless given."""
    return TrainParams(**{"kl_coef": 0.0, "entropy_coef": 0.0, "zero_var_filter": False, **settings})


# ---------------------------------------------------------------- advantages


def test_group_advantages_binary_group():
    a = group_advantages([1.0, 0.0, 0.0, 1.0])
    # mean 0.5; sample std = sqrt(4 * 0.25 / 3) = sqrt(1/3)
    expected = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    np.testing.assert_allclose(a, [expected, -expected, -expected, expected], rtol=1e-12)


def test_group_advantages_real_rewards_and_eps():
    a = group_advantages([3.0, 1.0, 2.0], eps=0.0)
    # mean 2, sample std = sqrt((1 + 1 + 0) / 2) = 1
    np.testing.assert_allclose(a, [1.0, -1.0, 0.0], rtol=1e-12)


def test_group_advantages_zero_variance_is_exactly_zero():
    a = group_advantages([[0.1, 0.1, 0.1], [1.0, 0.0, 0.0]])
    assert a.shape == (2, 3)
    assert np.all(a[0] == 0.0)
    assert a[1, 0] > 0 > a[1, 1]
    assert np.all(group_advantages([0.7, 0.7], eps=0.0) == 0.0)
    assert np.all(group_advantages([0.1] * 5, scale="none") == 0.0)


def test_group_advantages_scale_none_is_dr_grpo():
    np.testing.assert_allclose(group_advantages([1.0, 0.0, 0.0], scale="none"), [2 / 3, -1 / 3, -1 / 3], rtol=1e-12)


def test_group_advantages_single_rollout_is_zero():
    assert np.all(group_advantages([5.0]) == 0.0)
    assert np.all(group_advantages([[5.0], [2.0]]) == 0.0)


@pytest.mark.parametrize(
    "bad, kwargs",
    [
        (np.zeros((2, 2, 2)), {}),
        (np.array(5.0), {}),
        ([1.0, float("nan")], {}),
        ([1.0, float("inf")], {}),
        ([1.0, 0.0], {"scale": "std"}),
        ([1.0, 0.0], {"eps": -1.0}),
        (np.zeros((2, 0)), {}),
    ],
)
def test_group_advantages_rejects_bad_input(bad, kwargs):
    with pytest.raises(ValueError):
        group_advantages(bad, **kwargs)


def test_nonzero_variance_mask():
    flags = nonzero_variance_mask([[1, 1, 1], [0, 1, 0]])
    assert flags.dtype == bool
    np.testing.assert_array_equal(flags, [[False] * 3, [True] * 3])


# ---------------------------------------------------------------- loss config


@pytest.mark.parametrize(
    "kwargs",
    [
        {"agg_mode": "sum"},
        {"policy_loss": "gspo"},
        {"advantage_scale": "std"},
        {"kl_coef": -1.0},
        {"entropy_coef": float("nan")},
        {"tis_cap": -1.0},
    ],
)
def test_loss_settings_validation(kwargs):
    # the loss reads the validated TrainParams: its bounds and names are checked there, once
    with pytest.raises(ValueError):
        _loss(**kwargs)


def test_token_sum_norm_needs_max_new_tokens():
    new, old = _on_policy_batch()
    with pytest.raises(ValueError, match="max_new_tokens"):
        grpo_loss(new, old, ADV, MASK, _loss(agg_mode="seq-mean-token-sum-norm"))
    with pytest.raises(ValueError, match="max_new_tokens"):
        loss_normalizers(MASK, max_new_tokens=0)


# ---------------------------------------------------------------- aggregation

# Three rollouts of three token slots, on-policy (ratio = 1) so the policy loss of a
# token is -A_i. Row 0 has 2 tokens, row 1 has 3, row 2 is masked out (e.g. overlong).
ADV = torch.tensor([1.0, -2.0, 3.0])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])


def _on_policy_batch():
    logp = torch.log(torch.tensor([[0.5, 0.2, 0.9], [0.3, 0.3, 0.1], [0.6, 0.6, 0.6]]))
    return logp.clone().requires_grad_(True), logp.clone()


# token losses: row 0: -1, -1; row 1: +2, +2, +2; row 2: masked.
HAND_LOSS = {
    "token-mean": (-1 - 1 + 2 + 2 + 2) / 5,  # 0.8
    "seq-mean-token-mean": ((-1 - 1) / 2 + (2 + 2 + 2) / 3) / 2,  # (-1 + 2) / 2 = 0.5; 2 non-empty rows
    "seq-mean-token-sum": ((-1 - 1) + (2 + 2 + 2)) / 2,  # 2.0
    "seq-mean-token-sum-norm": ((-1 - 1) + (2 + 2 + 2)) / (2 * 4),  # max_new_tokens = 4: 0.5
}
HAND_PER_ROLLOUT = {
    "token-mean": [-2 / 5, 6 / 5, 0.0],
    "seq-mean-token-mean": [-1 / 2, 2 / 2, 0.0],
    "seq-mean-token-sum": [-2 / 2, 6 / 2, 0.0],
    "seq-mean-token-sum-norm": [-2 / 8, 6 / 8, 0.0],
}
# Per-token weights of each mode: the gradient at ratio 1 is -A_i * w_it.
HAND_WEIGHTS = {
    "token-mean": [[1 / 5, 1 / 5, 0], [1 / 5, 1 / 5, 1 / 5], [0, 0, 0]],
    "seq-mean-token-mean": [[1 / 4, 1 / 4, 0], [1 / 6, 1 / 6, 1 / 6], [0, 0, 0]],
    "seq-mean-token-sum": [[1 / 2, 1 / 2, 0], [1 / 2, 1 / 2, 1 / 2], [0, 0, 0]],
    "seq-mean-token-sum-norm": [[1 / 8, 1 / 8, 0], [1 / 8, 1 / 8, 1 / 8], [0, 0, 0]],
}


@pytest.mark.parametrize("mode", MODES)
def test_aggregation_modes_hand_computed(mode):
    new, old = _on_policy_batch()
    out = grpo_loss(new, old, ADV, MASK, _loss(agg_mode=mode), max_new_tokens=4)
    assert out.loss.item() == pytest.approx(HAND_LOSS[mode], abs=1e-6)
    np.testing.assert_allclose(out.per_rollout.detach().numpy(), HAND_PER_ROLLOUT[mode], atol=1e-6)
    assert out.policy_loss == pytest.approx(HAND_LOSS[mode], abs=1e-6)
    assert out.n_tokens == 5
    assert out.clip_frac == 0.0
    assert math.isnan(out.kl) and math.isnan(out.entropy)


@pytest.mark.parametrize("mode", MODES)
def test_gradient_at_ratio_one_is_policy_gradient(mode):
    new, old = _on_policy_batch()
    out = grpo_loss(new, old, ADV, MASK, _loss(agg_mode=mode), max_new_tokens=4)
    out.loss.backward()
    # d/d logp of -A * exp(logp - old) at logp = old is -A: the aggregated -A_i * grad logp.
    expected = -ADV[:, None] * torch.tensor(HAND_WEIGHTS[mode])
    torch.testing.assert_close(new.grad, expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize("mode", MODES)
def test_masked_out_rollout_contributes_nothing(mode):
    new, old = _on_policy_batch()
    cfg = _loss(agg_mode=mode, kl_coef=0.1, entropy_coef=0.01)
    ref = old - 0.3
    ent = torch.ones(3, 3)
    base = grpo_loss(new, old, ADV, MASK, cfg, logp_ref=ref, entropy=ent, max_new_tokens=4)
    # change everything about the masked-out row 2
    new2 = new.detach().clone()
    new2[2] = torch.tensor([-5.0, -0.1, -2.0])
    new2.requires_grad_(True)
    adv2 = ADV.clone()
    adv2[2] = -7.0
    ent2 = ent.clone()
    ent2[2] = 9.0
    other = grpo_loss(new2, old, adv2, MASK, cfg, logp_ref=ref, entropy=ent2, max_new_tokens=4)
    assert other.loss.item() == pytest.approx(base.loss.item(), abs=1e-7)
    assert other.per_rollout[2].item() == 0.0
    other.loss.backward()
    assert torch.all(new2.grad[2] == 0)


def test_non_finite_values_on_masked_tokens_are_harmless():
    new = torch.tensor([[-0.5, float("-inf")], [-1.0, -2.0]], requires_grad=True)
    old = torch.tensor([[-0.5, float("nan")], [-1.0, -2.0]])
    ref = torch.tensor([[-0.7, float("inf")], [-1.0, -2.0]])
    ent = torch.tensor([[0.3, float("nan")], [0.2, 0.1]], requires_grad=True)
    mask = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    cfg = _loss(kl_coef=0.1, entropy_coef=0.01)
    out = grpo_loss(new, old, torch.tensor([1.0, -1.0]), mask, cfg, logp_ref=ref, entropy=ent)
    assert torch.isfinite(out.loss) and math.isfinite(out.kl) and math.isfinite(out.entropy)
    out.loss.backward()
    assert torch.all(torch.isfinite(new.grad)) and torch.all(torch.isfinite(ent.grad))
    assert new.grad[0, 1] == 0 and ent.grad[0, 1] == 0


def test_overlong_filter_mask_feeds_the_loss_mask():
    keep = overlong_filter_mask([False, False, True])
    np.testing.assert_array_equal(keep, [True, True, False])
    assert keep.dtype == bool
    token_mask = torch.ones(3, 3) * torch.from_numpy(keep).float()[:, None]
    new, old = _on_policy_batch()
    out = grpo_loss(new, old, ADV, token_mask, _loss())
    # rows 0 and 1 have 3 tokens each: (-1 * 3 + 2 * 3) / 6
    assert out.loss.item() == pytest.approx(0.5, abs=1e-6)
    assert out.per_rollout[2].item() == 0.0
    with pytest.raises(ValueError):
        overlong_filter_mask([[True]])
    with pytest.raises(ValueError):
        overlong_filter_mask([0, 2])


@pytest.mark.parametrize("mode", MODES)
def test_per_rollout_sums_to_loss_random(mode):
    g = torch.Generator().manual_seed(0)
    n, t = 7, 5
    new = (torch.randn(n, t, generator=g) * 0.3 - 1).requires_grad_(True)
    old = new.detach() + torch.randn(n, t, generator=g) * 0.3
    ref = new.detach() + torch.randn(n, t, generator=g) * 0.3
    ent = torch.rand(n, t, generator=g).requires_grad_(True)
    adv = torch.randn(n, generator=g)
    mask = (torch.rand(n, t, generator=g) > 0.3).float()
    mask[3] = 0.0
    cfg = _loss(agg_mode=mode, kl_coef=0.2, entropy_coef=0.05, clip_higher=True, zero_var_filter=True)
    reg = torch.tensor([True, False, True, True, False, True, True])
    out = grpo_loss(new, old, adv, mask, cfg, logp_ref=ref, entropy=ent, regularize=reg, max_new_tokens=t)
    assert out.per_rollout.shape == (n,)
    assert out.per_rollout.sum().item() == out.loss.item()
    # each rollout's term depends only on that rollout's tokens
    (g_new,) = torch.autograd.grad(out.per_rollout[0], new, retain_graph=True)
    assert torch.all(g_new[1:] == 0)
    assert out.per_rollout[3].item() == 0.0


# ---------------------------------------------------------------- clipping


def _single_token(ratio: float, adv: float, cfg: TrainParams):
    old = torch.tensor([[math.log(0.4)]])
    new = (old + math.log(ratio)).clone().requires_grad_(True)
    out = grpo_loss(new, old, torch.tensor([adv]), torch.ones(1, 1), cfg)
    out.loss.backward()
    return out, new.grad.item()


def test_clip_higher_leaves_ratio_below_1_28_unclipped():
    # ratio 1.25 with a positive advantage: clipped at 1.2 by symmetric clipping ...
    out, grad = _single_token(1.25, 1.0, _loss())
    assert out.loss.item() == pytest.approx(-1.2, abs=1e-6)
    assert out.clip_frac == 1.0
    assert grad == 0.0
    # ... but not with clip-higher's 1.28: loss -ratio * A, gradient -A * ratio
    out, grad = _single_token(1.25, 1.0, _loss(clip_higher=True))
    assert out.loss.item() == pytest.approx(-1.25, abs=1e-6)
    assert out.clip_frac == 0.0
    assert grad == pytest.approx(-1.25, abs=1e-6)
    # above 1.28 it is clipped again
    out, _ = _single_token(1.3, 1.0, _loss(clip_higher=True))
    assert out.loss.item() == pytest.approx(-1.28, abs=1e-6)


def test_clip_low_with_negative_advantage():
    # ratio 0.75, A = -1: -min(-0.75, -0.8) = 0.8 (the clipped term is active)
    out, grad = _single_token(0.75, -1.0, _loss(clip_higher=True))
    assert out.loss.item() == pytest.approx(0.8, abs=1e-6)
    assert out.clip_frac == 1.0
    assert grad == 0.0
    # ratio 0.75 with positive advantage is never clipped (pessimistic min keeps ratio * A)
    out, _ = _single_token(0.75, 1.0, _loss())
    assert out.loss.item() == pytest.approx(-0.75, abs=1e-6)
    assert out.clip_frac == 0.0


# ---------------------------------------------------------------- KL and entropy


def test_k3_matches_formula_and_is_nonnegative():
    g = torch.Generator().manual_seed(1)
    new = torch.randn(50, 8, generator=g) * 2
    ref = torch.randn(50, 8, generator=g) * 2
    k3 = k3_kl(new, ref)
    d = (ref - new).double()
    torch.testing.assert_close(k3.double(), torch.exp(d) - d - 1, rtol=1e-5, atol=1e-6)
    assert torch.all(k3 >= 0)
    assert torch.all(k3_kl(new, new) == 0)
    # one worked value: ref - new = log 0.5 -> 0.5 - log 0.5 - 1
    v = k3_kl(torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)]))
    assert v.item() == pytest.approx(0.5 + math.log(2) - 1, abs=1e-7)


def test_kl_requires_reference_and_entropy_requires_entropy():
    new, old = _on_policy_batch()
    with pytest.raises(ValueError, match="logp_ref"):
        grpo_loss(new, old, ADV, MASK, _loss(kl_coef=0.1))
    with pytest.raises(ValueError, match="entropy"):
        grpo_loss(new, old, ADV, MASK, _loss(entropy_coef=0.1))
    with pytest.raises(ValueError, match="regularize"):
        grpo_loss(new, old, ADV, MASK, _loss(kl_coef=0.1, zero_var_filter=True), logp_ref=old)


def test_bad_shapes_rejected():
    new, old = _on_policy_batch()
    with pytest.raises(ValueError, match="advantages"):
        grpo_loss(new, old, ADV[:2], MASK, _loss())
    with pytest.raises(ValueError, match="mask"):
        grpo_loss(new, old, ADV, MASK[:, :2], _loss())
    with pytest.raises(ValueError, match="mask"):
        grpo_loss(new, old, ADV, MASK * 2, _loss())
    with pytest.raises(ValueError, match="logp_new"):
        grpo_loss(new[0], old, ADV, MASK, _loss())


def test_zero_variance_filter_on_regularizers():
    # two rollouts of two tokens, zero advantages (so only regularizers remain)
    new = torch.log(torch.tensor([[0.5, 0.5], [0.5, 0.5]]))
    ref = torch.log(torch.tensor([[0.25, 0.25], [0.25, 0.25]]))
    ent = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    adv = torch.zeros(2)
    mask = torch.ones(2, 2)
    k3 = 0.5 + math.log(2) - 1  # per token, ref - new = log 0.5
    cfg = _loss(kl_coef=0.5, entropy_coef=0.1, zero_var_filter=True)
    out = grpo_loss(new, new, adv, mask, cfg, logp_ref=ref, entropy=ent, regularize=torch.tensor([True, False]))
    # token-mean over all 4 tokens, regularizers only on rollout 0
    expected = (0.5 * k3 * 2 - 0.1 * (1.0 + 2.0)) / 4
    assert out.loss.item() == pytest.approx(expected, abs=1e-6)
    assert out.per_rollout[1].item() == 0.0
    # stats still describe every masked-in token
    assert out.kl == pytest.approx(k3, abs=1e-6)
    assert out.entropy == pytest.approx(2.5, abs=1e-6)
    # filter off: both rollouts regularized (the flags are ignored)
    cfg_off = _loss(kl_coef=0.5, entropy_coef=0.1, zero_var_filter=False)
    out_off = grpo_loss(new, new, adv, mask, cfg_off, logp_ref=ref, entropy=ent, regularize=torch.tensor([True, False]))
    expected_off = (0.5 * k3 * 4 - 0.1 * (1.0 + 2.0 + 3.0 + 4.0)) / 4
    assert out_off.loss.item() == pytest.approx(expected_off, abs=1e-6)


def test_entropy_bonus_gradient_flows():
    ent = torch.tensor([[1.0, 2.0]], requires_grad=True)
    new = torch.zeros(1, 2)
    out = grpo_loss(new, new, torch.zeros(1), torch.ones(1, 2), _loss(entropy_coef=0.1), entropy=ent)
    out.loss.backward()
    torch.testing.assert_close(ent.grad, torch.tensor([[-0.05, -0.05]]))


def test_empty_mask_gives_zero_loss():
    new = torch.zeros(2, 3, requires_grad=True)
    out = grpo_loss(new, new.detach(), torch.ones(2), torch.zeros(2, 3), _loss(agg_mode="seq-mean-token-mean"))
    assert out.loss.item() == 0.0 and out.n_tokens == 0
    out.loss.backward()
    assert torch.all(new.grad == 0)


# ---------------------------------------------------------------- overlong, lr


def test_overlong_penalty_dapo():
    pen = overlong_penalty([0, 6, 7, 8, 10, 11], max_new_tokens=10, cache_len=4)
    # soft window (6, 10]: (10 - 4 - L) / 4
    np.testing.assert_allclose(pen, [0.0, 0.0, -0.25, -0.5, -1.0, -1.0])
    with pytest.raises(ValueError):
        overlong_penalty([1], max_new_tokens=10, cache_len=11)
    with pytest.raises(ValueError):
        overlong_penalty([-1], max_new_tokens=10, cache_len=4)


def test_sqrt_scaled_lr_and_warmup():
    assert sqrt_scaled_lr(1e-4, 256, 64) == pytest.approx(2e-4)
    assert sqrt_scaled_lr(1e-4, 16, 64) == pytest.approx(0.5e-4)
    with pytest.raises(ValueError):
        sqrt_scaled_lr(1e-4, 0, 64)
    assert [warmup_factor(s, 4) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert warmup_factor(0, 0) == 1.0
    with pytest.raises(ValueError):
        warmup_factor(-1, 4)


# ---------------------------------------------------------------- log-probs from a model


@pytest.fixture(scope="module")
def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=24, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=4, intermediate_size=64, max_position_embeddings=64)
    model = LlamaForCausalLM(cfg)
    model.eval()
    return model


def _padded_batch(prompts, completions, pad_id=0):
    p_width = max(len(p) for p in prompts)
    c_width = max(len(c) for c in completions)
    ids, attn, cmask = [], [], []
    for p, c in zip(prompts, completions):
        lp, lc = p_width - len(p), c_width - len(c)
        ids.append([pad_id] * lp + p + c + [pad_id] * lc)
        attn.append([0] * lp + [1] * (len(p) + len(c)) + [0] * lc)
        cmask.append([1] * len(c) + [0] * lc)
    return torch.tensor(ids), torch.tensor(attn), torch.tensor(cmask)


PROMPTS = [[1, 5, 7], [1, 9, 3, 4, 11, 2], [1, 6]]
COMPLETIONS = [[12, 13, 2], [8], [3, 3, 4, 5, 2]]


def _unpadded_reference(model, prompt, completion, temperature=1.0):
    seq = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(seq).logits[0].double() / temperature
    rows = logits[len(prompt) - 1 : len(prompt) + len(completion) - 1]
    logp_all = torch.log_softmax(rows, dim=-1)
    logp = logp_all[torch.arange(len(completion)), torch.tensor(completion)]
    ent = -(logp_all.exp() * logp_all).sum(-1)
    return logp, ent


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_token_logprobs_match_unpadded_computation(tiny_llama, temperature):
    ids, attn, cmask = _padded_batch(PROMPTS, COMPLETIONS)
    with torch.no_grad():
        logp, ent = token_logprobs_and_entropy(tiny_llama, ids, attn, cmask, temperature=temperature)
    assert logp.shape == cmask.shape and ent.shape == cmask.shape
    for i, (p, c) in enumerate(zip(PROMPTS, COMPLETIONS)):
        ref_logp, ref_ent = _unpadded_reference(tiny_llama, p, c, temperature)
        np.testing.assert_allclose(logp[i, : len(c)].numpy(), ref_logp.numpy(), atol=1e-5)
        np.testing.assert_allclose(ent[i, : len(c)].numpy(), ref_ent.numpy(), atol=1e-5)
        assert torch.all(logp[i, len(c):] == 0) and torch.all(ent[i, len(c):] == 0)
    assert torch.all(ent[cmask.bool()] > 0)
    assert torch.all(ent[cmask.bool()] <= math.log(24) + 1e-5)


@pytest.mark.parametrize("temperature,position_chunk", [(1.0, 256), (0.7, 2)])
def test_reference_logprobs_are_the_policy_logprobs_as_constants(tiny_llama, temperature, position_chunk):
    # token_logprobs (the KL reference's call) skips the entropy and autograd, not a number
    ids, attn, cmask = _padded_batch(PROMPTS, COMPLETIONS)
    tiny_llama.train()
    logp, _ = token_logprobs_and_entropy(tiny_llama, ids, attn, cmask, temperature=temperature)
    ref = token_logprobs(tiny_llama, ids, attn, cmask, temperature=temperature, position_chunk=position_chunk)
    assert logp.requires_grad and not ref.requires_grad
    np.testing.assert_allclose(ref.numpy(), logp.detach().numpy(), atol=1e-6)
    assert torch.all(ref[~cmask.bool()] == 0)
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(tiny_llama, ids, attn, cmask, temperature=-1.0)


def test_default_position_ids_also_match_for_rotary_models(tiny_llama):
    # Documents why passing position ids is safe but not required for Llama:
    # rotary embeddings depend on relative positions only, so left padding with
    # default position ids gives the same log-probs up to rounding.
    ids, attn, _ = _padded_batch(PROMPTS, COMPLETIONS)
    with torch.no_grad():
        default = torch.log_softmax(tiny_llama(input_ids=ids, attention_mask=attn).logits, -1)
        explicit = torch.log_softmax(
            tiny_llama(input_ids=ids, attention_mask=attn,
                       position_ids=(attn.cumsum(1) - 1).clamp(min=0)).logits, -1)
    real = attn.bool()
    np.testing.assert_allclose(default[real].numpy(), explicit[real].numpy(), atol=1e-5)


def test_token_logprobs_gradients_flow(tiny_llama):
    ids, attn, cmask = _padded_batch(PROMPTS, COMPLETIONS)
    tiny_llama.zero_grad()
    logp, ent = token_logprobs_and_entropy(tiny_llama, ids, attn, cmask)
    assert logp.requires_grad and ent.requires_grad
    (logp.sum() + ent.sum()).backward()
    grads = [p.grad for p in tiny_llama.parameters() if p.grad is not None]
    assert grads and any(g.abs().sum() > 0 for g in grads)
    tiny_llama.zero_grad()
    _, ent_nograd = token_logprobs_and_entropy(tiny_llama, ids, attn, cmask, entropy_grad=False)
    assert not ent_nograd.requires_grad


def test_token_logprobs_rejects_bad_shapes(tiny_llama):
    ids, attn, cmask = _padded_batch(PROMPTS, COMPLETIONS)
    with pytest.raises(ValueError, match="attention_mask"):
        token_logprobs_and_entropy(tiny_llama, ids, attn[:, 1:], cmask)
    with pytest.raises(ValueError, match="completion"):
        token_logprobs_and_entropy(tiny_llama, ids, attn, torch.ones(3, ids.shape[1]))
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs_and_entropy(tiny_llama, ids, attn, cmask, temperature=0.0)
