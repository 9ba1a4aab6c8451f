"""The noise probe inside TRL's GRPOTrainer (science §6): logged numbers equal
rollscale's own on the same batch, and training is unchanged by the probe."""


import numpy as np
import pytest
import torch

trl = pytest.importorskip("trl", reason="trl is not installed (pip install 'rollscale[trl]')")

from datasets import Dataset  # noqa: E402

from rollscale.core.noise.gram import naive_gram  # noqa: E402
from rollscale.core.noise.estimators import decompose  # noqa: E402
from rollscale.core.problems.rewards import numeric_reward  # noqa: E402
from rollscale.integrations.trl import add_noise_probe, grpo_loss_terms, rollout_groups  # noqa: E402
from rollscale.lm.models import char_tokenizer, tiny_llama  # noqa: E402

ARCH = dict(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, max_positions=32)
PROMPTS = [(f"{a}+{b}=", str(a + b)) for a, b in [(1, 2), (3, 4), (2, 2), (5, 1), (7, 1), (4, 4), (6, 3), (2, 5)]]


def reward(completions, answer, **_):
    return [numeric_reward(c, a) for c, a in zip(completions, answer, strict=True)]


def make_trainer(tmp_path, loss_type="dapo", beta=0.0, steps=3, lora=False):
    torch.manual_seed(0)
    tok = char_tokenizer()
    model_dir = tmp_path / "model"
    if not model_dir.exists():  # a saved model, so TRL can load its own reference copy for the KL term
        tiny_llama(len(tok), **ARCH).save_pretrained(model_dir)
    data = Dataset.from_dict({"prompt": [p for p, _ in PROMPTS], "answer": [a for _, a in PROMPTS]})
    args = trl.GRPOConfig(
        output_dir=str(tmp_path), per_device_train_batch_size=8, num_generations=4, max_completion_length=4,
        max_steps=steps, logging_steps=1, report_to=[], use_cpu=True, seed=0, learning_rate=5e-3,
        loss_type=loss_type, beta=beta, save_strategy="no", gradient_checkpointing=False, bf16=False, temperature=1.0, disable_tqdm=True,
    )
    peft = None
    if lora:
        from peft import LoraConfig

        peft = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], bias="none")
    trainer = trl.GRPOTrainer(model=str(model_dir), reward_funcs=reward, args=args, train_dataset=data,
                              processing_class=tok, peft_config=peft)
    return trainer


def losses(trainer):
    return [row["loss"] for row in trainer.state.log_history if "loss" in row]


def test_probe_logs_rollscale_numbers_and_keeps_the_trajectory(tmp_path):
    torch.set_num_threads(1)
    plain = make_trainer(tmp_path / "plain")
    plain.train()
    probed = make_trainer(tmp_path / "probed")
    probe = add_noise_probe(probed, noise_every=2)
    expected = []
    real = probe.measure

    def checked(model, inputs, step):
        # rollscale's own numbers on the same batch and weights: a Gram from one autograd.grad per rollout
        groups = rollout_groups(inputs["prompt_ids"], inputs["prompt_mask"])
        gram = naive_gram(model, grpo_loss_terms(probed, model, inputs), len(groups))
        expected.append(decompose(gram, groups))
        return real(model, inputs, step)

    probe.measure = checked
    probed.train()
    assert losses(probed) == losses(plain) and len(losses(plain)) == 3
    assert [row["grad_norm"] for row in probed.state.log_history if "loss" in row] == [
        row["grad_norm"] for row in plain.state.log_history if "loss" in row]
    assert [s for s, _ in probe.history] == [0, 2]
    logged = [row for row in probed.state.log_history if "noise/crs" in row]
    assert [row["step"] for row in logged] == [1, 3]  # TRL logs after the optimizer step
    for row, want in zip(logged, expected, strict=True):
        assert want.n == 4 and want.n_prompts == 2
        for name in ("b_simple", "prompt_noise", "rollout_noise", "rho_icc", "k_crit", "crs"):
            assert row[f"noise/{name}"] == pytest.approx(getattr(want, name), rel=1e-4, abs=1e-9), name
    assert "rollouts per prompt" in probe.last_recommendation


def test_loss_terms_sum_to_trl_loss_and_gram_to_its_gradient(tmp_path):
    """The per-rollout terms are TRL's own loss split by rollout: they sum to
    compute_loss and the Gram's total equals |grad of TRL's loss|^2 (full and LoRA)."""
    torch.set_num_threads(1)
    for loss_type, lora in (("dapo", False), ("grpo", False), ("dapo", True)):
        trainer = make_trainer(tmp_path / f"{loss_type}{lora}", loss_type=loss_type, beta=0.04, steps=1, lora=lora)
        captured = {}
        real = trainer.compute_loss

        def spy(model, inputs, *a, **k):
            captured.setdefault("inputs", inputs)
            return real(model, inputs, *a, **k)

        trainer.compute_loss = spy
        trainer.train()
        inputs = captured["inputs"]
        model = trainer.model
        model.train()
        n = inputs["completion_ids"].shape[0]
        terms = grpo_loss_terms(trainer, model, inputs)
        model.zero_grad()
        loss = real(model, inputs)
        total = terms(torch.arange(n))
        assert total.sum().item() == pytest.approx(loss.item(), rel=1e-5, abs=1e-7)
        loss.backward()
        g2 = sum(float((p.grad.double() ** 2).sum()) for p in model.parameters() if p.grad is not None)
        model.zero_grad()
        from rollscale.core.noise.gram import gram_matrix

        gram = gram_matrix(model, terms, n)
        assert gram.sum() == pytest.approx(g2, rel=1e-5)
