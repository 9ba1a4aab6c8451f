"""A sharded run (FSDP2 over 2 CPU processes, gloo) is the one-process run (science §1, §3):
the same rollouts, the same update, the same ``steps`` and ``evals`` rows, and a sharded run
paused at a checkpoint resumes to the same end."""

from __future__ import annotations

import contextlib
import glob
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from unittest.mock import patch

import numpy as np
import pandas as pd
import pytest
import torch

from rollscale.core.problems.sets import reasoning_gym_problems
from rollscale.core.rollouts import SamplingConfig
from rollscale.lm.models import add_lora, char_tokenizer, tiny_llama
from rollscale.train.checkpoint import RunStore
from rollscale.train.manifest import check_file, read_manifest
from rollscale.train.distributed import Ranks, destroy_ranks, group_rows, init_ranks
from rollscale.train.online_noise import noise_figures
from rollscale.train.run_config import RunConfig
from rollscale.train.trainer import GRPOTrainer

WORLD = 2
# compared to float tolerance: a rank's micro-batches are padded to other widths than one process's
RTOL, ATOL = 1e-5, 1e-6
COLUMNS = ["c", "c_tokens", "reward_mean", "loss", "policy_loss", "kl", "entropy", "clip_frac", "grad_norm",
           "n_tokens", "rollouts_generated", "groups_trained", "response_len_mean"]


def odd_length_reward(completion: str, gold: str) -> float:
    """A reward the untrained tiny model gets about half the time (mixed groups, a real update)."""
    return float(len(completion) % 2 == 1)


def _config(**update) -> RunConfig:
    # 4 steps of 4 prompts x 4 rollouts; KL on (the sharded reference), two PPO epochs (clip_frac > 0),
    # small micro-batches so the ranks run different numbers of them; gradient noise (§6) every 2 steps
    return RunConfig(n=4, b_problem=4, c_max=64, seed=3, eval_per_doubling=0, eval_every=2, eval_k=2, checkpoint_every=2, noise_every=2,
                     sampling=SamplingConfig(temperature=1.0, max_new_tokens=6),
                     train=dict(lr_base=1e-2, b_base=16, warmup_steps=0, kl_coef=0.05, entropy_coef=0.0,
                                zero_var_filter=False, overlong_filter=False, ppo_epochs=2,
                                micro_batch_tokens=40)).model_copy(update=update)


def _problems(n: int = 24):
    return reasoning_gym_problems("chain_sum", n, 0, dict(min_terms=2, max_terms=2, min_digits=1, max_digits=1),
                                  prompt_style="expression")


def _model():
    return tiny_llama(len(char_tokenizer()), hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                      max_positions=32)


def _trainer(ranks: Ranks | None, lora: bool = False, **update) -> GRPOTrainer:
    problems = _problems()
    if lora:
        torch.manual_seed(0)  # the adapters' initial values, the same in every process
    model = add_lora(_model(), 4, 8, 0.0, ["q_proj", "v_proj"]) if lora else _model()
    return GRPOTrainer(model, char_tokenizer(), problems[:16], problems[16:], _config(**update), reward=odd_length_reward,
                       use_chat_template=False, ranks=ranks, lora=lora)


RULES = (("pods", {"m": 2}), ("dynamic", {}))


def _full_params(trainer: GRPOTrainer, trainable_only: bool = False) -> dict[str, torch.Tensor]:
    return {name: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
            for name, p in trainer.model.named_parameters() if p.requires_grad or not trainable_only}


def _runs(store_root: str, ranks: Ranks | None) -> dict:
    """What the tests compare, from one process or one launch of 2: a run paused after 2 steps (its
    checkpoint), then resumed by a fresh trainer to the end; the same run uninterrupted; the Gram
    matrices (science §6) the noise steps measured; one LoRA step."""
    grams: list[np.ndarray] = []

    def record(gram, *args):
        grams.append(gram.copy())
        return noise_figures(gram, *args)

    out = {}
    with patch("rollscale.train.trainer.noise_figures", record):
        first = _trainer(ranks)
        out["paused"] = first.run(RunStore(os.path.join(store_root, "run")), budget=32).status
        del first
        second = _trainer(ranks)
        result = second.run(RunStore(os.path.join(store_root, "run")))
        out |= {"status": result.status, "steps": result.steps, "params": _full_params(second), "grams": list(grams)}
        if ranks is not None:  # bit-identical resume: the same launch's uninterrupted run
            straight = _trainer(ranks)
            straight.run(RunStore(os.path.join(store_root, "straight")))
            out["straight"] = _full_params(straight)
    lora = _trainer(ranks, lora=True)
    out["lora_row"], out["lora"] = lora.train_step(), _full_params(lora, trainable_only=True)
    # allocation rules that pick rollouts (PODS) or draw more prompts (dynamic sampling): one step each
    for rule, args in RULES:
        stepped = _trainer(ranks, rule=rule, rule_args=args)
        out[f"{rule}_row"], out[rule] = stepped.train_step(), _full_params(stepped)
    return out


def _rank_main(root: str) -> None:
    """A rank of the fixture's one torchrun launch: the runs the tests compare, then a long run that
    the fixture stops with Ctrl-C."""
    torch.set_num_threads(1)
    ranks = init_ranks("cpu")
    try:
        out = _runs(os.path.join(root, "sharded"), ranks)
        if ranks.leader:
            torch.save(out, os.path.join(root, "sharded.tmp"))
            os.replace(os.path.join(root, "sharded.tmp"), os.path.join(root, "sharded.pt"))
        _trainer(ranks, c_max=64 * 100, noise_every=0).run(RunStore(os.path.join(root, "long")))
    finally:
        destroy_ranks()


@pytest.fixture(scope="module")
def both_runs(tmp_path_factory):
    """The one-process runs here; the 2-process ones in one ``torchrun`` launch (gloo), which, once
    they are done and its long run has a checkpoint, gets Ctrl-C (SIGINT to torchrun and its ranks)."""
    root = tmp_path_factory.mktemp("sharded")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        one = _runs(str(root / "one"), None)
    finally:
        torch.set_num_threads(threads)
    launch = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone",
                               f"--nproc_per_node={WORLD}", "-m", "tests.test_distributed", str(root)],
                              cwd=Path(__file__).resolve().parents[1], env=dict(os.environ, OMP_NUM_THREADS="1"))
    try:
        _wait(lambda: launch.poll() is not None or ((root / "sharded.pt").exists() and _newest(root / "long") >= 2),
              600, "the 2-process runs and a checkpoint of the long one")
        assert launch.poll() is None, f"the 2-process launch ended early (status {launch.returncode}; errors above)"
        ranks = _descendants(launch.pid)
        t0 = time.monotonic()
        for pid in [launch.pid, *ranks]:
            os.kill(pid, signal.SIGINT)
        launch.wait(60)
        _wait(lambda: not any(map(_alive, ranks)), 60, "every rank to stop after Ctrl-C")
        ctrl_c = {"seconds": time.monotonic() - t0, "status": launch.returncode, "ranks": len(ranks)}
    finally:
        if launch.poll() is None:
            launch.kill()
    return root, one, torch.load(root / "sharded.pt", weights_only=False), ctrl_c


def test_group_rows_split_whole_groups():
    assert group_rows([2, 3, 1], Ranks(0, 2)).tolist() == [0, 1, 5]
    assert group_rows([2, 3, 1], Ranks(1, 2)).tolist() == [2, 3, 4]
    assert group_rows([4], Ranks(1, 2)).tolist() == []


def test_two_process_run_equals_one_process_run(both_runs):
    root, one, two, _ = both_runs
    assert (one["paused"], one["status"], one["steps"]) == ("paused", "finished", 4)
    assert (two["paused"], two["status"], two["steps"]) == ("paused", "finished", 4)
    a, b = RunStore(root / "one" / "run").rows("steps"), RunStore(root / "sharded" / "run").rows("steps")
    assert list(b["step"]) == [1, 2, 3, 4]
    # the same rollouts (C counts every rank's once) and the same update, to float tolerance
    pd.testing.assert_frame_equal(a[COLUMNS], b[COLUMNS], check_exact=False, rtol=RTOL, atol=ATOL)
    assert (a["reward_mean"].between(0.05, 0.95)).all() and (a["clip_frac"] > 0).any() and (a["kl"].iloc[1:] > 0).all()
    ea, eb = RunStore(root / "one" / "run").rows("evals"), RunStore(root / "sharded" / "run").rows("evals")
    assert list(eb["step"]) == [0, 2, 4]
    np.testing.assert_allclose(ea.select_dtypes("number").drop(columns=[c for c in ea if c.startswith("t_")]),
                               eb.select_dtypes("number").drop(columns=[c for c in eb if c.startswith("t_")]),
                               rtol=RTOL, atol=ATOL)
    # parameters after 4 updates, the last two after a sharded pause and resume
    # (AdamW divides by the gradients' RMS, so rounding in near-zero gradients reaches the weights
    # more than the rows; measured: at most 7e-6 here, against updates of up to 4 x lr = 0.04)
    for name, p in one["params"].items():
        torch.testing.assert_close(two["params"][name], p, rtol=0, atol=2e-5, msg=name)


def test_sharded_checkpoints_resume_bit_identical_and_load_in_one_process(both_runs):
    """Checkpoints written by every rank with torch.distributed.checkpoint (no model.pt gathered on
    rank 0); pausing and resuming from them ends bit-identical to the uninterrupted 2-process run;
    one process reads the 2-process checkpoint (another number of ranks) to the same weights."""
    root, one, two, _ = both_runs
    ckpt = RunStore(root / "sharded" / "run").latest()
    assert ckpt.step == 4 and ckpt.shards is not None
    assert sorted(p.name for p in ckpt.path.iterdir()) == ["MANIFEST.json", "shards", "state.json"]
    assert sorted(p.name for p in ckpt.shards.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    for name, p in two["straight"].items():
        assert torch.equal(two["params"][name], p), name
    reader = _trainer(None)
    reader.load_checkpoint(ckpt)
    assert (reader.step, reader.c) == (4, 64)
    for name, p in reader.model.named_parameters():
        assert torch.equal(p.detach(), two["params"][name]), name
    exp_avg = [s["exp_avg"] for s in reader.optimizer.state.values()]
    assert len(exp_avg) == len(two["params"]) and all(float(t.abs().sum()) > 0 for t in exp_avg)


def test_two_process_gram_equals_one_process_gram(both_runs):
    """Gradient noise (science §6) in a sharded run: the Gram matrix over all of the step's rollouts,
    each rank's share of the parameters summed over ranks, equals the one-process matrix."""
    root, one, two, _ = both_runs
    assert len(one["grams"]) == len(two["grams"]) == 2  # steps 2 and 4 (noise_every: 2)
    for k1, k2 in zip(one["grams"], two["grams"]):
        assert k1.shape == (16, 16) and np.all(np.diag(k1) >= 0) and np.abs(k1).max() > 0
        np.testing.assert_allclose(k2, k1, rtol=1e-5, atol=1e-6 * np.abs(k1).max())
    a, b = RunStore(root / "one" / "run").rows("steps"), RunStore(root / "sharded" / "run").rows("steps")
    noise = ["trace_sigma", "g_norm2", "b_simple", "rollout_noise", "prompt_noise"]
    np.testing.assert_allclose(b[noise].to_numpy(float), a[noise].to_numpy(float), rtol=1e-5, equal_nan=True)


def test_two_process_halves_equal_one_process_halves(both_runs):
    """The noise along training (science §6.4) in a sharded run: the two halves' inner products over the
    ranks' shards equal the one-process ones, full fine-tuning and LoRA."""
    root, one, two, _ = both_runs
    a, b = RunStore(root / "one" / "run").rows("steps"), RunStore(root / "sharded" / "run").rows("steps")
    halves = ["half_dot", "half_diff2"]
    assert np.isfinite(a[halves].to_numpy(float)).all() and (a["half_diff2"] > 0).all()
    np.testing.assert_allclose(b[halves].to_numpy(float), a[halves].to_numpy(float), rtol=1e-4,
                               atol=1e-5 * float(a["half_diff2"].max()))
    sizes = ["half_prompts_a", "half_prompts_b", "half_rollouts_a", "half_rollouts_b"]
    assert (a[sizes].to_numpy() == [2, 2, 8, 8]).all() and (b[sizes].to_numpy() == a[sizes].to_numpy()).all()
    for column in halves:
        np.testing.assert_allclose(two["lora_row"][column], one["lora_row"][column], rtol=1e-4, err_msg=column)


def test_two_process_lora_step_equals_one_process_step(both_runs):
    """LoRA over 2 processes (the frozen base sharded too): the adapters after one step and the
    step's row equal the one-process step's."""
    _, one, two, _ = both_runs
    assert set(one["lora"]) == set(two["lora"]) and all("lora_" in name for name in one["lora"])
    for name, p in one["lora"].items():
        torch.testing.assert_close(two["lora"][name], p, rtol=0, atol=2e-5, msg=name)
    assert any(not torch.equal(p, two["lora"][name]) for name, p in _trainer(None, lora=True).trainable.items())
    for column in COLUMNS:
        np.testing.assert_allclose(two["lora_row"][column], one["lora_row"][column], rtol=RTOL, atol=ATOL, err_msg=column)


@pytest.mark.parametrize("rule", [rule for rule, _ in RULES])
def test_two_process_step_of_an_allocation_rule_equals_one_process_step(both_runs, rule):
    """Issue 30: every rank sees every sampled group and the rule is seeded alike on all of them, so PODS
    keeps and dynamic sampling draws the same rollouts as in one process: same step row, same weights."""
    _, one, two, _ = both_runs
    for name, p in one[rule].items():
        torch.testing.assert_close(two[rule][name], p, rtol=0, atol=2e-5, msg=name)
    for column in COLUMNS:
        np.testing.assert_allclose(two[f"{rule}_row"][column], one[f"{rule}_row"][column], rtol=RTOL, atol=ATOL,
                                   err_msg=column)


@pytest.mark.parametrize("settings, message", [
    ({"sweep": {"devices_per_run": 2}, "sampling": {"backend": "hf-paged"}, "workers": 2}, "sampling.backend: hf or vllm"),
    ({"sweep": {"devices_per_run": 4}, "workers": 2}, "workers >= 4"),
    ({"sweep": {"devices_per_run": 2}, "sampling": {"backend": "vllm"}, "workers": 4}, "set workers: 2"),
])
def test_devices_per_run_refuses_what_a_sharded_run_cannot_do(settings, message):
    from rollscale.config import parse_params

    with pytest.raises(ValueError, match=message):
        parse_params(settings)
    assert parse_params({"sweep": {"devices_per_run": 2, "noise_every": 5}}).sweep.devices_per_run == 2
    vllm = parse_params({"sweep": {"devices_per_run": 2}, "sampling": {"backend": "vllm"}, "workers": 2})
    assert (vllm.sampling.backend, vllm.workers) == ("vllm", 2)  # one engine per rank


def _descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (Linux /proc; each thread's children)."""
    out, todo = [], [pid]
    while todo:
        parent = todo.pop()
        for task in glob.glob(f"/proc/{parent}/task/*/children"):
            with contextlib.suppress(OSError), open(task) as fh:
                kids = [int(k) for k in fh.read().split()]
                out += kids
                todo += kids
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _rank_pids(rank: int | None = None) -> list[int]:
    """The pids of this test's sharded-run ranks (all, or the one with RANK=rank)."""
    found = []
    for pid in _descendants(os.getpid()):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/environ", "rb") as fh:
            env = dict(kv.split(b"=", 1) for kv in fh.read().split(b"\0") if b"=" in kv)
            if b"tasks.sharded_run" in open(f"/proc/{pid}/cmdline", "rb").read() and b"RANK" in env:
                if rank is None or env[b"RANK"] == str(rank).encode():
                    found.append(pid)
    return [pid for pid in found if _alive(pid)]


def _newest(run_dir: Path) -> int:
    """The newest committed checkpoint's step, without hashing it (cheap to poll)."""
    return max([s for s, path in RunStore(run_dir).checkpoint_dirs() if (path / "MANIFEST.json").exists()], default=0)


def _wait(condition, timeout: float, what: str) -> float:
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.2)  # polling must not take the ranks' CPU (2 cores)
    return time.monotonic() - start


def test_ctrl_c_stops_every_rank_in_seconds(both_runs):
    """SIGINT to torchrun and its ranks (what Ctrl-C sends the sweep's process group) during a
    2-process run: torchrun exits non-zero and no rank is left, within seconds."""
    root, _, _, ctrl_c = both_runs
    assert ctrl_c["ranks"] == WORLD and ctrl_c["status"] != 0 and ctrl_c["seconds"] < 15
    assert _newest(root / "long") >= 2 and RunStore(root / "long").latest() is not None


def test_a_killed_rank_stops_the_run_and_the_rerun_resumes(tmp_path):
    """The sweep worker's torchrun launch (``tasks.sweep.train_run``, 2 devices) of a long run: a
    SIGKILL of rank 1 after a checkpoint ends the run (the worker raises, no rank left); the rerun,
    here in one process (DCP reshards the 2-process checkpoint), resumes from that checkpoint,
    pauses at a budget with the runs row saying so, and the committed rows hold each step once."""
    import threading

    from rollscale.config import SamplingParams
    from rollscale.lm.models import ModelRef
    from tasks.sweep import train_run

    tok, model = char_tokenizer(), _model()
    model.save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    problems, run_dir = _problems(), tmp_path / "run"
    store = RunStore(run_dir)
    args = (ModelRef(str(tmp_path / "model"), chat_template=False, fingerprint="tiny"), _config(c_max=64 * 100, noise_every=0),
            "easy", problems[:16], problems[16:], str(run_dir), None, "cpu", None,
            SamplingParams(temperature=1.0, max_new_tokens=6))
    outcome: list = []
    thread = threading.Thread(target=lambda: outcome.append(_call(train_run.fn, *args, None, devices=2)))
    thread.start()
    _wait(lambda: _newest(run_dir) >= 2 or not thread.is_alive(), 300, "the first checkpoint")
    os.kill(_rank_pids(1)[0], signal.SIGKILL)
    stopped = _wait(lambda: not thread.is_alive(), 60, "the run to end after rank 1 was killed")
    assert isinstance(outcome[0], RuntimeError) and "resumes from its last checkpoint" in str(outcome[0])
    assert _rank_pids() == [] and stopped < 30
    killed = store.latest()
    committed = read_manifest(killed.path)["parts"]

    result = train_run.fn(*args, killed.state["c"] + 32, devices=1)
    assert (result.status, result.c, result.steps) == ("paused", killed.state["c"] + 32, killed.step + 2)
    assert pd.read_parquet(run_dir / "run.parquet")["status"].tolist() == ["paused"]
    assert all(check_file(run_dir / name, meta) is None for name, meta in committed.items())  # rows kept as committed
    rows = store.rows("steps")  # each step once, C counting 16 rollouts a step
    assert list(rows["step"]) == list(range(1, result.steps + 1)) and list(rows["c"]) == [16 * s for s in rows["step"]]


def _call(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except Exception as err:  # the test thread reports what the worker raised
        return err


if __name__ == "__main__":  # a rank of the fixture's torchrun launch
    _rank_main(sys.argv[1])
