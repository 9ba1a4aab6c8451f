"""Placement (issue: real scale): a stage on ``device: cpu`` never touches CUDA code
paths; ``auto`` picks CUDA only when present; Ray runs ask for a GPU when the model is on one."""

import pytest
import torch
from tokenizers import decoders

from rollscale.config import parse_params
from rollscale.core.problems.sets import reasoning_gym_problems
from rollscale.lm.models import char_tokenizer, tiny_llama
from rollscale.core.rollouts import SamplingConfig
from rollscale.train.checkpoint import RunStore
from rollscale.train.run_config import RunConfig
from rollscale.train.trainer import GRPOTrainer
from tasks.models import resolve_device
from tasks.ray_sweep import gpus_per_run, worker_env

_CUDA_ENTRY_POINTS = ("is_available", "device_count", "current_device", "init", "synchronize",
                      "get_rng_state_all", "set_rng_state_all", "get_rng_state", "set_rng_state",
                      "max_memory_allocated", "empty_cache", "_lazy_init")


@pytest.fixture
def no_cuda(monkeypatch):
    """Every CUDA entry point raises: touching one fails the test."""
    def forbidden(*args, **kwargs):
        raise AssertionError("a CPU stage touched a CUDA code path")
    for name in _CUDA_ENTRY_POINTS:
        monkeypatch.setattr(torch.cuda, name, forbidden)


def test_cpu_stage_never_touches_cuda(no_cuda, tmp_path):
    torch.set_num_threads(1)
    assert resolve_device("cpu") == "cpu"
    tok = char_tokenizer()
    tok.backend_tokenizer.decoder = decoders.Fuse()
    problems = reasoning_gym_problems("chain_sum", 40, 0, dict(min_terms=2, max_terms=2, min_digits=1, max_digits=1),
                                      prompt_style="expression")
    model = tiny_llama(len(tok), hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_positions=32)
    cfg = RunConfig(n=4, b_problem=2, c_max=16, eval_per_doubling=0, eval_every=1, checkpoint_every=1, noise_every=1,
                    sampling=SamplingConfig(temperature=1.0, max_new_tokens=3), train=dict(kl_coef=0.01))
    trainer = GRPOTrainer(model.to(resolve_device("cpu")), tok, problems[:30], problems[30:], cfg,
                          use_chat_template=False, reward=lambda text, gold: float(len(text) % 2))
    result = trainer.run(RunStore(tmp_path))  # sampling, update, noise, eval, checkpoints, RNG states
    assert result.status == "finished" and result.steps == 2
    # and a resume from those checkpoints (RNG restore) stays on the CPU path too
    again = GRPOTrainer(tiny_llama(len(tok), hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
                                   max_positions=32), tok, problems[:30], problems[30:], cfg, use_chat_template=False)
    again.load_checkpoint(RunStore(tmp_path).latest())
    assert again.step == 2


def test_auto_and_cuda_devices(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == "cpu"
    with pytest.raises(RuntimeError, match="model.device"):
        resolve_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == "cuda" and resolve_device("cuda") == "cuda"
    assert parse_params({}).model.device == "auto"


def test_ray_gpus_default_follows_the_model_device(monkeypatch):
    sweep = parse_params({}).sweep
    assert sweep.ray_gpus_per_run is None
    assert gpus_per_run(sweep, "auto", cluster_gpus=4) == 1 and gpus_per_run(sweep, "cuda", 0) == 1
    assert gpus_per_run(sweep, "auto", cluster_gpus=0) == 0 and gpus_per_run(sweep, "cpu", cluster_gpus=4) == 0
    set_half = parse_params({"sweep": {"ray_gpus_per_run": 0.5}}).sweep
    assert gpus_per_run(set_half, "cpu", 0) == 0.5
    monkeypatch.setenv("HF_HOME", "/models/hf")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.setenv("UNRELATED_SECRET", "x")
    env = worker_env("http://api")
    assert env["HF_HOME"] == "/models/hf" and env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert "UNRELATED_SECRET" not in env and env["PREFECT_API_URL"] == "http://api"
