"""Gram matrix by hooks equals the per-rollout autograd reference (science §6.1)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from peft import LoraConfig, get_peft_model
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from rollscale.core.noise.gram import gram_matrix, naive_gram, trainable_parameters

N_ROLLOUTS = 12
PROMPT_LEN, COMPLETION_LEN = 6, 5


def tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=24,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        intermediate_size=128,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(cfg).float()
    # RMSNorm weights start at 1; move them so their gradients are generic
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.1 * torch.randn_like(p))
    return model


def grpo_batch() -> dict[str, torch.Tensor]:
    """Left-padded prompts, right-padded completions of varying lengths, fixed advantages."""
    gen = torch.Generator().manual_seed(1)
    width = PROMPT_LEN + COMPLETION_LEN
    ids = torch.randint(3, 24, (N_ROLLOUTS, width), generator=gen)
    attn = torch.ones(N_ROLLOUTS, width, dtype=torch.long)
    comp = torch.zeros(N_ROLLOUTS, width)
    for i in range(N_ROLLOUTS):
        pl, cl = 2 + i % 5, 1 + i % 4
        attn[i, : PROMPT_LEN - pl] = 0
        ids[i, : PROMPT_LEN - pl] = 0
        attn[i, PROMPT_LEN + cl :] = 0
        ids[i, PROMPT_LEN + cl :] = 0
        comp[i, PROMPT_LEN : PROMPT_LEN + cl] = 1.0
    adv = torch.tensor([1.2, -0.7, 0.3, -1.5, 0.9, -0.2, 0.5, -1.1, 1.6, -0.4, 0.05, -0.8])
    return {"ids": ids, "attn": attn, "mask": comp[:, 1:], "adv": adv}


def loss_terms(model: nn.Module, batch: dict[str, torch.Tensor]):
    """GRPO-like token-mean terms: -A_i sum_t mask_it logp_it / total masked tokens."""
    total = batch["mask"].sum()

    def fn(idx: torch.Tensor) -> torch.Tensor:
        ids = batch["ids"][idx]
        logits = model(input_ids=ids, attention_mask=batch["attn"][idx]).logits
        logp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]
        return -batch["adv"][idx] * (batch["mask"][idx] * logp).sum(1) / total

    return fn


def assert_gram_close(k: np.ndarray, ref: np.ndarray) -> None:
    assert k.shape == ref.shape and k.dtype == np.float64
    scale = np.abs(ref).max()
    assert scale > 0
    np.testing.assert_allclose(k, ref, rtol=0, atol=1e-4 * scale)


@pytest.fixture(scope="module")
def full_case():
    model = tiny_llama()
    batch = grpo_batch()
    fn = loss_terms(model, batch)
    return model, fn, naive_gram(model, fn, N_ROLLOUTS)


@pytest.fixture(scope="module")
def lora_case():
    model = get_peft_model(
        tiny_llama(), LoraConfig(r=4, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    )
    # peft starts B at 0, which would make every A-gradient 0
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.1)
    fn = loss_terms(model, grpo_batch())
    return model, fn, naive_gram(model, fn, N_ROLLOUTS)


def test_reference_is_not_degenerate(full_case):
    _, _, ref = full_case
    # distinct rollouts, negative advantages present: off-diagonal entries of both signs
    off = ref[~np.eye(N_ROLLOUTS, dtype=bool)]
    assert (off > 0).any() and (off < 0).any()
    assert np.all(np.diag(ref) > 0)


@pytest.mark.parametrize("method", ["auto", "materialize", "tokens"])
def test_full_parameter_tied_matches_naive(full_case, method):
    model, fn, ref = full_case
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert_gram_close(gram_matrix(model, fn, N_ROLLOUTS, method=method), ref)
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("targets", ["outputs", "parameters"])
def test_either_backward_target(full_case, lora_case, targets):
    for model, fn, ref in (full_case, lora_case):
        assert_gram_close(gram_matrix(model, fn, N_ROLLOUTS, grad_targets=targets), ref)
        assert_gram_close(gram_matrix(model, fn, N_ROLLOUTS, chunk_size=5, grad_targets=targets), ref)
        assert all(p.grad is None for p in model.parameters())


def test_tied_weight_counts_both_uses(full_case):
    """Leaving out the shared embedding/LM-head weight changes K by its (summed) part."""
    model, fn, ref = full_case
    name = "model.embed_tokens.weight"
    without = gram_matrix(model, fn, N_ROLLOUTS, exclude=[name])
    assert_gram_close(without, naive_gram(model, fn, N_ROLLOUTS, exclude=[name]))
    assert np.abs(ref - without).max() > 1e-2 * np.abs(ref).max()


def test_lora_matches_naive(lora_case):
    model, fn, ref = lora_case
    names = [n for n, _ in trainable_parameters(model)]
    assert len(names) == 8 and all("lora_" in n for n in names)
    assert_gram_close(gram_matrix(model, fn, N_ROLLOUTS), ref)


@pytest.mark.parametrize(
    ("method", "chunk_size"),
    [("auto", 1), ("auto", 12), ("auto", 50), ("materialize", 5), ("tokens", 5)],
)
def test_chunked_equals_unchunked(full_case, method, chunk_size):
    model, fn, ref = full_case
    k = gram_matrix(model, fn, N_ROLLOUTS, chunk_size=chunk_size, method=method)
    assert_gram_close(k, ref)
    assert_gram_close(k, gram_matrix(model, fn, N_ROLLOUTS, method=method))


@pytest.mark.parametrize("method", ["materialize", "tokens"])
def test_small_working_budget(full_case, method):
    """A tiny budget forces the row-sliced and sample-blocked paths."""
    model, fn, ref = full_case
    k = gram_matrix(model, fn, N_ROLLOUTS, chunk_size=7, method=method, budget_bytes=1 << 16)
    assert_gram_close(k, ref)


def test_lora_chunked(lora_case):
    model, fn, ref = lora_case
    assert_gram_close(gram_matrix(model, fn, N_ROLLOUTS, chunk_size=5), ref)


class SmallNet(nn.Module):
    """Padding-index embedding, a biased Linear used twice, nn.RMSNorm, a tied head."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 8, padding_idx=0)
        self.mix = nn.Linear(8, 8)
        self.norm = nn.RMSNorm(8, eps=1e-5)
        self.head = nn.Linear(8, 10, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.emb(ids)
        h = h + torch.tanh(self.mix(h))
        h = self.norm(torch.tanh(self.mix(h)))
        return self.head(h)


def small_case(model: nn.Module):
    torch.manual_seed(3)
    ids = torch.randint(0, 10, (7, 5))
    ids[:, 0] = 0  # padding tokens are present
    w = torch.randn(7, 5, 10)

    def fn(idx: torch.Tensor) -> torch.Tensor:
        return (model(ids[idx]) * w[idx]).sum(dim=(1, 2))

    return fn


@pytest.mark.parametrize("method", ["auto", "materialize", "tokens"])
def test_small_net_matches_naive(method):
    torch.manual_seed(2)
    model = SmallNet()
    with torch.no_grad():
        model.norm.weight.add_(0.1 * torch.randn(8))
    fn = small_case(model)
    ref = naive_gram(model, fn, 7)
    assert_gram_close(gram_matrix(model, fn, 7, method=method), ref)
    assert_gram_close(gram_matrix(model, fn, 7, chunk_size=3, method=method), ref)


class WithLayerNorm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.ln = nn.LayerNorm(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln(self.lin(x))


def test_uncovered_parameter_raises_and_exclude_works():
    torch.manual_seed(0)
    model = WithLayerNorm()
    x, w = torch.randn(5, 3, 4), torch.randn(5, 3, 4)

    def fn(idx: torch.Tensor) -> torch.Tensor:
        return (model(x[idx]) * w[idx]).sum(dim=(1, 2))

    with pytest.raises(ValueError, match=r"ln\.weight.*ln\.bias"):
        gram_matrix(model, fn, 5)
    excl = ["ln.weight", "ln.bias"]
    assert_gram_close(gram_matrix(model, fn, 5, exclude=excl), naive_gram(model, fn, 5, exclude=excl))
    with pytest.raises(ValueError, match="exclude"):
        gram_matrix(model, fn, 5, exclude=["nope"])


def test_bad_loss_terms_raise():
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    x = torch.randn(4, 3)
    with pytest.raises(ValueError, match="shape"):
        gram_matrix(model, lambda idx: model(x[idx]).sum(), 4)
    # rows flattened away from the batch dimension: per-rollout capture is impossible
    with pytest.raises(ValueError, match="leading dimension"):
        gram_matrix(model, lambda idx: model(x[idx].reshape(-1, 2, 3)[0]).sum(-1).repeat(2), 4)
    with pytest.raises(ValueError, match="chunk_size"):
        gram_matrix(model, lambda idx: model(x[idx]).sum(-1), 4, chunk_size=0)
    with pytest.raises(ValueError, match="method"):
        gram_matrix(model, lambda idx: model(x[idx]).sum(-1), 4, method="fast")
