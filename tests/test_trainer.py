"""Tests of the GRPO training loop: learning, compute accounting per allocation
rule, resume equivalence, non-finite losses, corrupt checkpoints, LoRA
(science §1, §3, §4, §5)."""

import copy
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pytest
import torch
from tokenizers import decoders

import rollscale.train.step as step_module
import rollscale.train.trainer as trainer_module
from rollscale.core.fit import schedule as evaluation_schedule
from rollscale.train.checkpoint import RunStore
from rollscale.lm.models import add_lora, char_tokenizer, tiny_llama, train_supervised
from rollscale.core.problems.sets import reasoning_gym_problems
from rollscale.core.rollouts import SamplingConfig
from rollscale.config import TrainParams
from rollscale.train.run_config import RunConfig, config_hash, readable_run_id
from rollscale.train.step import NonFiniteLossError
from rollscale.train.trainer import GRPOTrainer

ARCH = dict(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128, max_positions=32)
SAMPLING = SamplingConfig(temperature=1.0, max_new_tokens=4)  # answers have at most 2 characters + EOS
WALL_TIMES = ["t_generate", "t_score", "t_train", "t_eval"]


@dataclass
class Warm:
    tokenizer: object
    state: dict
    problems: list

    def model(self):
        model = tiny_llama(len(self.tokenizer), **ARCH)
        model.load_state_dict(copy.deepcopy(self.state))
        return model.eval()


@pytest.fixture(scope="module")
def warm():
    """The tiny model warm-started on one-digit sums to a partial skill (mixed rewards)."""
    threads = torch.get_num_threads()
    # One thread: on a shared 2-core machine two threads contend and run ~20x slower.
    torch.set_num_threads(1)
    tok = char_tokenizer()
    # models.char_tokenizer sets no decoder, so decode() joins characters with spaces ("1 2")
    # and answers of two characters never verify; fuse them.
    tok.backend_tokenizer.decoder = decoders.Fuse()
    problems = reasoning_gym_problems(
        "chain_sum", 3000, 0, dict(min_terms=2, max_terms=2, min_digits=1, max_digits=1), prompt_style="expression"
    )
    model = tiny_llama(len(tok), **ARCH)
    train_supervised(model, tok, [(tok.bos_token + p.prompt, p.answer) for p in problems], steps=300,
                     batch_size=64, lr=3e-3)
    yield Warm(tok, copy.deepcopy(model.state_dict()), problems)
    torch.set_num_threads(threads)


# the loss and optimizer settings these tests start from (regularisers and filters off)
TRAIN = dict(lr_base=1e-3, b_base=16, warmup_steps=0, kl_coef=0.0, entropy_coef=0.0, zero_var_filter=False,
             overlong_filter=False)


def _config(**overrides) -> RunConfig:
    """A RunConfig; overrides of ``sweep.train`` settings (TrainParams fields) go into ``train``,
    and the rule's own arguments (m, n_pilot, ...: not RunConfig fields) into ``rule_args``."""
    train = dict(TRAIN, **{k: v for k, v in overrides.items() if k in TrainParams.model_fields})
    base = dict(n=4, b_problem=4, c_max=16 * 6, sampling=SAMPLING, eval_per_doubling=0, eval_every=2, eval_k=4,
                checkpoint_every=3,
                train=train)
    base.update({k: v for k, v in overrides.items() if k in RunConfig.model_fields})
    rule_args = {k: v for k, v in overrides.items() if k not in TrainParams.model_fields | RunConfig.model_fields}
    return RunConfig(**base, rule_args=rule_args)


def _trainer(warm, config, model=None, lora=False, train=None):
    train = warm.problems[:40] if train is None else train
    return GRPOTrainer(model if model is not None else warm.model(), warm.tokenizer, train,
                       warm.problems[150:182], config, use_chat_template=False, lora=lora)


def _numeric(df: pd.DataFrame) -> pd.DataFrame:
    return df.drop(columns=[c for c in WALL_TIMES if c in df.columns]).select_dtypes("number")


# ---------------------------------------------------------------- config


def test_run_config_ids_and_derived_values():
    assert readable_run_id(_config(n=8, b_problem=32)) == "np32_nr8_uniform_s0"
    assert _config(n=16, b_problem=32, rule="pods", m=4, seed=3).run_id == "np32_nr16_pods_m4_s3"
    assert _config(n=8, rule="pilot", n_pilot=2).run_id == "np4_nr8_pilot_p2_pf2_s0"
    assert _config(rule="dynamic").run_id == "np4_nr4_dynamic_d16_s0"
    assert _config(run_id="mine").run_id == "mine"
    cfg = _config(n=8, b_problem=4, c_max=100, lr_base=1e-4, b_base=8)
    assert cfg.nominal_steps == 100 // 32
    assert cfg.lr == pytest.approx(1e-4 * math.sqrt(32 / 8))
    # PODS scales the learning rate by the rollouts it trains on, b_problem * m
    assert _config(n=8, rule="pods", m=2, lr_base=1e-4, b_base=8).lr == pytest.approx(1e-4)
    assert RunConfig.from_dict(cfg.to_dict()) == cfg
    assert config_hash(cfg) == config_hash(RunConfig.from_dict(cfg.to_dict()))
    assert config_hash(cfg) != config_hash(_config(n=8, b_problem=4, c_max=100, lr_base=2e-4, b_base=8))


@pytest.mark.parametrize("overrides, field", [
    (dict(n=1), "n"),
    (dict(b_problem=0), "b_problem"),
    (dict(c_max=0), "c_max"),
    (dict(rule="greedy"), "rule"),
    (dict(rule="pods"), "m"),
    (dict(rule="pods", m=4), "m"),
    (dict(m=2), "m"),
    (dict(rule="pilot"), "n_pilot"),
    (dict(rule="pilot", n_pilot=2, pool_factor=0.5), "pool_factor"),
    (dict(rule="dynamic", max_draws=2), "max_draws"),
    (dict(advantage_scale="std"), "advantage_scale"),
    (dict(agg_mode="sum"), "agg_mode"),
    (dict(tis_cap=-1.0), "tis_cap"),
    (dict(micro_batch_tokens=0), "micro_batch_tokens"),
    (dict(ppo_epochs=0), "ppo_epochs"),
    (dict(kl_coef=-1.0), "kl_coef"),
    (dict(lr_base=0.0), "lr_base"),
    (dict(grad_clip=-1.0), "grad_clip"),
    (dict(warmup_steps=-1), "warmup_steps"),
    (dict(eval_every=0), "eval_every"),
    (dict(checkpoint_every=0), "checkpoint_every"),
    (dict(overlong_penalty_cache=9), "overlong_penalty_cache"),
    (dict(sampling=SamplingConfig(temperature=0.0)), "temperature"),
    (dict(overlong_filter="maybe"), "overlong_filter"),
    (dict(run_id="a/b"), "run_id"),
])
def test_run_config_rejects_bad_fields(overrides, field):
    with pytest.raises(ValueError, match=field):
        _config(**overrides)


def test_trainer_rejects_bad_arguments(warm):
    model = warm.model()
    with pytest.raises(ValueError, match="peft"):
        GRPOTrainer(model, warm.tokenizer, warm.problems[:4], warm.problems[4:8], _config(), lora=True)
    with pytest.raises(ValueError, match="train_problems"):
        GRPOTrainer(model, warm.tokenizer, [], warm.problems[4:8], _config())
    with pytest.raises(ValueError, match="config"):
        GRPOTrainer(model, warm.tokenizer, warm.problems[:4], warm.problems[4:8], {"n": 4})


# ---------------------------------------------------------------- learning and evaluation


def test_warm_start_rewards_are_mixed_and_eval_row(warm):
    row = _trainer(warm, _config(eval_k=8)).evaluate()
    assert 0.1 < row["avg_at_k"] < 0.9
    assert row["worst_at_k"] <= row["avg_at_k"] <= row["best_at_k"]
    assert row["n_problems"] == 32 and row["k"] == 8 and row["step"] == 0 and row["c"] == 0
    assert 0 < row["avg_at_k_se"] < 0.2 and 0 <= row["greedy"] <= 1
    one = _trainer(warm, _config(eval_k=1)).evaluate()
    assert one["best_at_k"] == one["worst_at_k"] == one["avg_at_k"]


def test_reward_rises_on_a_fixed_problem_set(warm):
    problems = warm.problems[:16]
    cfg = _config(n=16, b_problem=16, c_max=16 * 16 * 40, lr_base=1e-3, b_base=256, eval_every=100,
                  checkpoint_every=100)
    trainer = _trainer(warm, cfg, train=problems)
    rows = [trainer.train_step() for _ in range(cfg.nominal_steps)]
    rewards = np.array([r["reward_mean"] for r in rows])
    first, last = rewards[:5].mean(), rewards[-5:].mean()
    assert last > first + 0.2, (first, last)
    assert rows[-1]["epochs"] == 40.0 and rows[-1]["c"] == 40 * 256


# ---------------------------------------------------------------- compute accounting


@pytest.mark.parametrize("rule, extra, n, increment", [
    ("uniform", {}, 4, lambda r: 3 * 4),
    ("pilot", dict(n_pilot=2, pool_factor=2.0), 6, lambda r: 6 * 2 + 3 * (6 - 2)),
    ("pods", dict(m=3), 8, lambda r: 3 * 8),
    ("dynamic", dict(max_draws=9), 4, lambda r: r["draws"] * 4),
    ("variance", {}, 4, lambda r: 3 * 4),
])
def test_compute_accounting_per_rule(warm, tmp_path, rule, extra, n, increment):
    cfg = _config(rule=rule, n=n, b_problem=3, c_max=50, eval_every=100, checkpoint_every=100, **extra)
    trainer = _trainer(warm, cfg)
    rows = []
    result = trainer.run(RunStore(tmp_path), on_step=rows.append)
    assert result.status == "finished"
    c, drawn, tokens = 0, 0, 0
    for row in rows:
        assert row["rollouts_generated"] == increment(row)
        c += increment(row)
        drawn += row["draws"]
        assert row["c"] == c
        new_tokens = row["c_tokens"] - tokens
        # every rollout has 1..max_new_tokens tokens
        assert row["rollouts_generated"] <= new_tokens <= row["rollouts_generated"] * SAMPLING.max_new_tokens
        tokens = row["c_tokens"]
        assert row["epochs"] == pytest.approx(drawn / 40)
    # the run stops at the first step that reaches the budget
    assert rows[-1]["c"] >= cfg.c_max > rows[-2]["c"]
    assert result.c == rows[-1]["c"] and result.steps == len(rows)
    if rule == "uniform":
        assert all(r["draws"] == 3 and r["rollouts_trained"] == 12 for r in rows)
    if rule == "pilot":
        assert all(r["draws"] == 6 and r["pilot_rollouts"] == 12 and r["rollouts_trained"] == 18 for r in rows)
    if rule == "pods":
        assert all(r["rollouts_trained"] == 3 * 3 and r["m"] == 3 for r in rows)
    if rule == "variance":  # uniform's budget, all trained, in groups of at least 2
        assert all(r["draws"] == 3 and r["rollouts_trained"] == 12 and r["groups_trained"] == 3 for r in rows)
    if rule == "dynamic":
        assert all(r["draws"] >= 3 and r["c"] for r in rows)
        assert all(r["rollouts_trained"] == 4 * r["groups_trained"] for r in rows)
        assert all(r["zero_var_frac_trained"] == 0 for r in rows if r["updated"])


def test_dynamic_step_with_no_informative_group_counts_c_and_skips_update(warm):
    cfg = _config(rule="dynamic", max_draws=6)
    trainer = GRPOTrainer(warm.model(), warm.tokenizer, warm.problems[:40], warm.problems[150:160], cfg,
                          reward=lambda completion, gold: 0.0, use_chat_template=False)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    row = trainer.train_step()
    assert row["draws"] == 6 and row["c"] == 6 * 4 and row["groups_trained"] == 0
    assert not row["updated"] and math.isnan(row["loss"]) and row["zero_var_frac"] == 1.0
    assert all(torch.equal(p, q) for p, q in zip(trainer.model.parameters(), before))


def test_reward_must_be_zero_or_one(warm):
    trainer = GRPOTrainer(warm.model(), warm.tokenizer, warm.problems[:8], warm.problems[8:10], _config(),
                          reward=lambda completion, gold: 0.5, use_chat_template=False)
    with pytest.raises(ValueError, match="0 or 1"):
        trainer.train_step()


def test_run_reports_progress_and_evals(warm, tmp_path):
    cfg = _config(c_max=16 * 3, eval_every=2, checkpoint_every=2)
    progress, evals = [], []
    result = _trainer(warm, cfg).run(RunStore(tmp_path), on_eval=evals.append,
                                     progress=lambda c, c_max: progress.append((c, c_max)))
    assert result.status == "finished" and result.c == 48
    assert progress == [(16, 48), (32, 48), (48, 48)]
    assert [e["step"] for e in evals] == [0, 2, 3]  # step 0, every 2 steps, the end
    assert [e["c"] for e in evals] == [0, 32, 48]
    assert list(RunStore(tmp_path).rows("evals")["step"]) == [0, 2, 3]
    assert RunStore(tmp_path).done() == {"status": "finished", "error": None, "steps": 3, "c": 48,
                                         "c_tokens": result.c_tokens, "run_id": cfg.run_id,
                                         "config_hash": config_hash(cfg)}


# ---------------------------------------------------------------- resume


class Kill(Exception):
    """Stands in for the process being killed."""


def _killed_then_resumed(warm, cfg, root, kill_at, lora_factory=None, corrupt=None):
    def make_model():
        return lora_factory(warm.model()) if lora_factory else warm.model()

    def kill(row):
        if row["step"] == kill_at:
            raise Kill

    first = _trainer(warm, cfg, model=make_model(), lora=lora_factory is not None)
    with pytest.raises(Kill):
        first.run(RunStore(root), on_step=kill)
    assert RunStore(root).done()["status"] == "failed"
    del first
    if corrupt is not None:
        corrupt(root)
    second = _trainer(warm, cfg, model=make_model(), lora=lora_factory is not None)
    result = second.run(RunStore(root))
    return second, result


def _assert_same_run(straight_store, resumed_store, straight_model, resumed_model):
    for kind in ("steps", "evals"):
        a, b = straight_store.rows(kind), resumed_store.rows(kind)
        assert list(b["step"]) == list(a["step"])
        assert b["step"].is_unique
        # on CPU with fixed seeds the resumed run repeats the straight one bit for bit
        pd.testing.assert_frame_equal(_numeric(a), _numeric(b), check_exact=True)
    for (name, p), (_, q) in zip(straight_model.named_parameters(), resumed_model.named_parameters()):
        assert torch.equal(p, q), name


@pytest.mark.parametrize("rule, extra", [
    ("uniform", dict(kl_coef=0.05, entropy_coef=0.01, warmup_steps=3)),
    ("pilot", dict(n_pilot=2, c_max=(8 * 2 + 4 * 2) * 6)),
    # its per-prompt counts are checkpointed state: 60 draws of 40 problems, revisits in steps 5 and 6
    ("variance", dict(decay=0.9, b_problem=10, c_max=40 * 6)),
])
def test_resume_equals_straight_run(warm, tmp_path, rule, extra):
    cfg = _config(rule=rule, **extra)  # 6 steps, checkpoints at 3 and 6, evals at 0, 2, 4, 6
    straight = _trainer(warm, cfg)
    result = straight.run(RunStore(tmp_path / "straight"))
    assert result.status == "finished" and result.steps == 6
    resumed, result = _killed_then_resumed(warm, cfg, tmp_path / "resumed", kill_at=5)
    assert result.status == "finished" and result.steps == 6 and RunStore(tmp_path / "resumed").done()["status"] == "finished"
    _assert_same_run(RunStore(tmp_path / "straight"), RunStore(tmp_path / "resumed"), straight.model, resumed.model)
    steps = RunStore(tmp_path / "straight").rows("steps")
    assert list(steps["step"]) == [1, 2, 3, 4, 5, 6]
    assert list(RunStore(tmp_path / "straight").rows("evals")["step"]) == [0, 2, 4, 6]
    # a finished run is not trained again
    again = _trainer(warm, cfg)
    assert again.run(RunStore(tmp_path / "straight")).steps == 6
    assert len(RunStore(tmp_path / "straight").rows("steps")) == 6


def test_budget_schedule_evaluations_and_resume(warm, tmp_path):
    # science §9.1: 1 budget per doubling from c_max / 64: 1.5, 3, 6, 12, 24, 48, 96 rollouts; B = 16 a step
    cfg = _config(eval_per_doubling=1)
    assert config_hash(cfg) != config_hash(_config())  # a different schedule is a different run
    straight = _trainer(warm, cfg)
    assert straight.run(RunStore(tmp_path / "straight")).steps == 6
    # C = 16: crosses 1.5, 3, 6, 12; 32: 24; 48: 48; 96: the last. Step 0, 1, 2, 3, 6
    assert list(RunStore(tmp_path / "straight").rows("evals")["step"]) == [0, 1, 2, 3, 6]
    assert evaluation_schedule.evaluation_steps(96, 16, 1) == [0, 1, 2, 3, 6]
    resumed, result = _killed_then_resumed(warm, cfg, tmp_path / "resumed", kill_at=5)
    assert result.status == "finished"
    _assert_same_run(RunStore(tmp_path / "straight"), RunStore(tmp_path / "resumed"), straight.model, resumed.model)


def test_a_run_paused_at_a_budget_is_the_run_whose_c_max_it_is(warm, tmp_path):
    """Science §9.4: a search's run paused at a rung's budget is the grid's run to that budget (grid replays and the
    simulated searches read a grid's runs cut at each rung, rollscale.core.search.state.truncate), so nothing before
    a run's c_max may depend on it (a learning rate decaying to c_max would): weights and rows bit for bit."""
    to_96 = _trainer(warm, _config(eval_per_doubling=2, warmup_steps=3))
    assert to_96.run(RunStore(tmp_path / "to_96")).status == "finished"
    longer = _trainer(warm, _config(c_max=16 * 12, eval_per_doubling=2, warmup_steps=3))
    assert longer.run(RunStore(tmp_path / "paused"), budget=16 * 6).status == "paused"
    assert list(RunStore(tmp_path / "paused").rows("evals")["step"]) == [0, 1, 2, 3, 5, 6]
    _assert_same_run(RunStore(tmp_path / "to_96"), RunStore(tmp_path / "paused"), to_96.model, longer.model)


def test_resume_after_corrupt_checkpoint(warm, tmp_path):
    cfg = _config(c_max=16 * 5, checkpoint_every=2)  # checkpoints at 2 and 4
    straight = _trainer(warm, cfg)
    straight.run(RunStore(tmp_path / "straight"))

    def truncate_newest(root):
        path = root / "ckpt-000004" / "model.pt"
        path.write_bytes(path.read_bytes()[:100])

    with pytest.warns(RuntimeWarning, match="ckpt-000004.*using .*ckpt-000002"):
        resumed, result = _killed_then_resumed(warm, cfg, tmp_path / "resumed", kill_at=5, corrupt=truncate_newest)
    assert result.status == "finished"
    _assert_same_run(RunStore(tmp_path / "straight"), RunStore(tmp_path / "resumed"), straight.model, resumed.model)


def test_resume_with_a_different_config_is_refused(warm, tmp_path):
    cfg = _config(c_max=16 * 2, checkpoint_every=1, run_id="r")
    _trainer(warm, cfg).run(RunStore(tmp_path))
    other = _config(c_max=16 * 2, checkpoint_every=1, run_id="r", lr_base=5e-4)
    with pytest.raises(ValueError, match="different config"):
        _trainer(warm, other).run(RunStore(tmp_path))


# ---------------------------------------------------------------- failures


@pytest.mark.parametrize("checkpoint_every", [2, 10])
def test_non_finite_loss_fails_the_run_and_keeps_last_checkpoint(warm, tmp_path, monkeypatch, checkpoint_every):
    real_loss, real_update = step_module.grpo_loss, trainer_module.policy_update
    updates = []

    def counting_update(*args, **kwargs):  # a step's passes (its two halves' micro-batches, science §6.4) are one update
        updates.append(1)
        return real_update(*args, **kwargs)

    def nan_at_step_3(*args, **kwargs):
        out = real_loss(*args, **kwargs)
        if len(updates) == 3:
            out.loss = out.loss * float("nan")
        return out

    monkeypatch.setattr(trainer_module, "policy_update", counting_update)
    monkeypatch.setattr(step_module, "grpo_loss", nan_at_step_3)
    cfg = _config(checkpoint_every=checkpoint_every, eval_every=100, run_id="nanrun")
    trainer = _trainer(warm, cfg)
    weights_before = [p.detach().clone() for p in trainer.model.parameters()]
    store = RunStore(tmp_path)
    steps_seen = []

    def remember(row):
        steps_seen.append(row["step"])
        if row["step"] == 2:
            weights_before[:] = [p.detach().clone() for p in trainer.model.parameters()]

    result = trainer.run(store, on_step=remember)
    assert result.status == "failed" and "step 3" in result.error and "nanrun" in result.error
    assert result.steps == 2 and steps_seen == [1, 2]
    # the failed step changed nothing
    assert all(torch.equal(p, q) for p, q in zip(trainer.model.parameters(), weights_before))
    latest = store.latest()
    assert latest.step == 2 and latest.state["c"] == 32
    done = store.done()
    assert done["status"] == "failed" and "step 3" in done["error"]
    assert list(store.rows("steps")["step"]) == [1, 2]
    with pytest.raises(NonFiniteLossError, match="step 3"):
        # calling the step directly raises the error itself
        updates[:] = [1, 1]  # the next update is the third
        trainer.train_step()


# ---------------------------------------------------------------- overlong filter


def test_overlong_filter_masks_truncated_rollouts(warm):
    one_token = SamplingConfig(temperature=1.0, max_new_tokens=1)  # every rollout is cut before its EOS
    row = _trainer(warm, _config(sampling=one_token, overlong_filter=True)).train_step()
    assert row["trunc_frac"] == 1.0 and row["n_tokens"] == 0 and row["grad_norm"] == 0.0
    row = _trainer(warm, _config(sampling=one_token)).train_step()
    assert row["n_tokens"] == 16


# ---------------------------------------------------------------- LoRA


def _lora(model):
    return add_lora(model, r=4, alpha=8, dropout=0.0, target_modules=["q_proj", "v_proj"])


def test_lora_trains_adapters_only_with_kl_to_the_base(warm, tmp_path):
    cfg = _config(n=8, b_problem=4, c_max=32 * 4, kl_coef=0.1, lr_base=2e-2, b_base=32, checkpoint_every=2)
    model = _lora(warm.model())
    base_before = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    lora_before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    trainer = _trainer(warm, cfg, model=model, lora=True)
    assert trainer.ref_model is None  # the reference is the model with adapters disabled
    rows = []
    result = trainer.run(RunStore(tmp_path), on_step=rows.append)
    assert result.status == "finished" and len(rows) == 4
    assert rows[0]["kl"] < 1e-7  # adapters start at zero: policy == reference
    assert rows[-1]["kl"] > 1e-6
    for n, p in model.named_parameters():
        if n in base_before:
            assert torch.equal(p, base_before[n]), n
    assert any(not torch.equal(p, lora_before[n]) for n, p in model.named_parameters() if n in lora_before)
    saved = RunStore(tmp_path).latest().model_state()
    assert set(saved) == set(lora_before) and all("lora_" in n for n in saved)


def test_lora_resume_equals_straight_run(warm, tmp_path):
    cfg = _config(kl_coef=0.1, lr_base=2e-2)
    straight = _trainer(warm, cfg, model=_lora(warm.model()), lora=True)
    straight.run(RunStore(tmp_path / "straight"))
    resumed, result = _killed_then_resumed(warm, cfg, tmp_path / "resumed", kill_at=4, lora_factory=_lora)
    assert result.status == "finished"
    _assert_same_run(RunStore(tmp_path / "straight"), RunStore(tmp_path / "resumed"), straight.model, resumed.model)
