"""Settings that look valid but would destroy or mislead (issue 23, part 2), through the CLI as a
user runs it: `rollscale check` and every stage refuse them with one message naming the key,
path or file, and a sweep never takes ended runs out of the tables because of params alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.test_errors import short

REPO = Path(__file__).resolve().parents[1]
STAGES = ("base", "profile", "bucket", "measure", "sweep", "fit", "report")


def cli(root: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "rollscale.pipeline.cli", "--artifacts", str(root / "artifacts"),
                           *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def params_file(root: Path, text: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "params.yaml").write_text(text)
    return root / "params.yaml"


def _empty_jsonl(root: Path) -> str:
    (root / "empty.jsonl").write_text("")
    return f"data: {{source: gsm8k, path: {root / 'empty.jsonl'}}}\n"


def _not_a_model(root: Path) -> str:
    (root / "weights").mkdir()
    (root / "weights" / "notes.txt").write_text("no config.json here")
    return f"model: {{kind: hf, name_or_path: {root / 'weights'}}}\n"


# nine levels of nine aliases: a few hundred bytes that expand to billions of values
YAML_BOMB = "".join(["a0: &a0 [x, x, x, x, x, x, x, x, x]\n"] + [
    f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 10)]) + "sweep: {c_max: 100}\n"

# (params text or a function of the folder that writes it, what the one message must name)
BAD = {
    "empty seeds": ("sweep: {seeds: []}\n", "sweep.seeds"),
    "empty n": ("sweep: {n: []}\n", "sweep.n"),
    "empty rules": ("sweep: {rules: []}\n", "sweep.rules"),
    "empty b_problem": ("sweep: {b_problem: []}\n", "sweep.b_problem"),
    "empty measure n": ("measure: {n: []}\n", "measure.n"),
    "empty run_status": ("fit: {run_status: []}\n", "fit.run_status"),
    "bool for int": ("sweep: {c_max: true}\n", "sweep.c_max"),
    "bool for float": ("sampling: {temperature: no}\n", "sampling.temperature"),
    "bool in a list of numbers": ("sweep: {n: [4, true]}\n", "sweep.n"),
    "bool in bucket bounds": ("bucket: {easy: [0.3, true]}\n", "bucket.easy"),
    "duplicate section": ("sweep: {c_max: 100}\nfit: {bin_width: 0.1}\nsweep: {c_max: 200}\n", "sweep is given twice"),
    "duplicate key": ("sweep:\n  c_max: 100\n  seeds: [0]\n  c_max: 200\n", "sweep.c_max is given twice (line 2 and line 4)"),
    "empty file": ("", "the file is empty"),
    "only comments": ("# all defaults?\n", "the file is empty"),
    "a list": ("- sweep\n", "expected a mapping of sections"),
    "missing local model": ("model: {kind: hf, name_or_path: ./models/qwen/v2}\n", "./models/qwen/v2 not found"),
    "not a hub id": ("model: {kind: hf, name_or_path: my model}\n", "neither a local model folder nor a hub id"),
    "folder that is not a model": (_not_a_model, "is a folder without config.json"),
    "empty data file": (_empty_jsonl, "empty.jsonl is empty"),
    # issue 42, case 5: the search's settings against each other (a fresh sweep started 3 seeds a key)
    "seeds_min above seeds_max": ("sweep: {search: {method: decision, seeds_min: 5, seeds_max: 2}}\n",
                                  "sweep.search.seeds_min (5) is above sweep.search.seeds_max (2)"),
    "seeds_min above the seeds listed": ("sweep: {seeds: [0, 1], search: {method: decision, seeds_min: 3}}\n",
                                         "sweep.search.seeds_min (3) is more than the 2 seed(s) of sweep.seeds"),
    "key_min above key_max": ("sweep: {search: {key_min: 16, key_max: 4}}\n",
                              "sweep.search.key_min (16) is above sweep.search.key_max (4)"),
    # issue 55, cases 6-8: nonsense accepted, sizes that cannot fit (a MemoryError in check), a YAML bomb (a hang)
    "infinite lr": ("base: {lr: .inf}\n", "base.lr: Input should be a finite number"),
    "nan temperature": ("sampling: {temperature: .nan}\n", "sampling.temperature: Input should be a finite number"),
    "base steps past memory": ("base: {steps: 1000000000}\n", "base.steps: Input should be less than or equal to "
                               "10000000"),
    "c_max past memory": ("sweep: {c_max: 1000000000000}\n", "sweep.c_max at most 640,000,000"),
    "yaml bomb": (YAML_BOMB, "its aliases (*name) expand to 4,412,961,520 values"),
    "alias into itself": ("sweep: &s {n: [4, *s]}\n", "an alias (*name) refers to the value it is in"),
}


@pytest.mark.parametrize("case", BAD)
def test_check_rejects_settings_that_would_destroy_or_mislead(tmp_path, case, monkeypatch, capsys):
    """`rollscale check`'s own code, called as the command calls it (the command's process, which adds
    nothing to what check says, is started once below: one process per case cost ~2 s of CPU each)."""
    from rollscale.pipeline import cli as rollscale_cli

    text, named = BAD[case]
    root = tmp_path / "p"
    root.mkdir()
    path = params_file(root, text(root) if callable(text) else text)
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code = rollscale_cli.main(["--artifacts", str(root / "artifacts"), "check", "--params", str(path)])
    out, err = capsys.readouterr()
    assert code == 2, (case, out[-500:], err)
    assert named in short(err), err


def test_the_check_command_rejects_them_in_its_own_process(tmp_path):
    """The command a user types (`python -m rollscale.pipeline.cli check`): the same one message and exit 2."""
    text, named = BAD["duplicate key"]
    root = tmp_path / "p"
    path = params_file(root, text)
    r = cli(root, "check", "--params", str(path))
    assert r.returncode == 2, (r.stdout[-500:], r.stderr)
    assert named in short(r.stderr), r.stderr


def test_every_stage_rejects_them_before_any_work(tmp_path):
    """The stages share load_params: `python -m flows <stage>` (dvc.yaml's command) and `rollscale run`
    refuse a key given twice, a boolean for a number and an empty list, naming the key, and write nothing
    (each stage gets one of the three cases)."""
    cases = [("sweep:\n  c_max: 100\n  c_max: 200\n", "sweep.c_max is given twice"),
             ("fit: {bootstrap_resamples: on}\n", "fit.bootstrap_resamples"), ("sweep: {seeds: []}\n", "sweep.seeds")]
    procs = {}
    for i, stage in enumerate(STAGES):
        text, named = cases[i % len(cases)]
        path = params_file(tmp_path / stage, text)
        procs[stage] = named, subprocess.Popen(
            [sys.executable, "-m", "flows", stage, "--params", str(path), "--artifacts", str(tmp_path / stage / "artifacts")],
            cwd=REPO, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    for stage, (named, proc) in procs.items():
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 2 and named in short(err), (stage, err[-2000:])
        assert not (tmp_path / stage / "artifacts").exists()
    r = cli(tmp_path / "base", "run", "sweep", "--params", str(tmp_path / "base" / "params.yaml"))
    assert r.returncode == 2 and "sweep.c_max is given twice" in short(r.stderr)


def test_base_refuses_a_model_folder_that_is_not_one_and_keeps_the_model_ref(tmp_path):
    root = tmp_path / "p"
    root.mkdir()
    path = params_file(root, _not_a_model(root))
    ref = root / "artifacts" / "base" / "model_ref.json"
    ref.parent.mkdir(parents=True)
    ref.write_text('{"name_or_path": "earlier"}')
    r = cli(root, "run", "base", "--params", str(path))
    assert r.returncode == 2 and f"{root / 'weights'} is a folder without config.json" in short(r.stderr)
    assert ref.read_text() == '{"name_or_path": "earlier"}'


@pytest.mark.slow
def test_a_data_file_without_problems_is_named(tmp_path):
    """A JSONL file of blank lines passes `check` (it is not empty) and the stage that reads it names it."""
    root = tmp_path / "p"
    root.mkdir()
    (root / "blank.jsonl").write_text("\n\n  \n")
    path = params_file(root, f"data: {{source: gsm8k, path: {root / 'blank.jsonl'}}}\n")
    r = cli(root, "run", "base", "--params", str(path))
    assert r.returncode == 2 and f"{root / 'blank.jsonl'}: no problems (no rows)" in short(r.stderr)


# ---------------------------------------------------------------------------- sweep: never archive by params alone


def _fake_study(root: Path) -> None:
    """The files the sweep reads before training (model ref, profile, buckets) and one ended run of an
    earlier grid; the model ref points nowhere, so a sweep that gets as far as training fails fast."""
    from rollscale.core.problems.problem import Problem

    art = root / "artifacts"
    (art / "base").mkdir(parents=True)
    (art / "base" / "model_ref.json").write_text(json.dumps({"name_or_path": str(root / "no-model")}))
    problems = [Problem.create("t", f"{i}+1=", str(i + 1), "numeric") for i in range(6)]
    profile = pd.DataFrame({"problem_id": [p.problem_id for p in problems], "source": "t",
                            "prompt": [p.prompt for p in problems], "answer": [p.answer for p in problems],
                            "reward": "numeric", "avg_at_k": 0.5})
    (art / "profile").mkdir()
    profile.to_parquet(art / "profile" / "profile.parquet")
    (art / "bucket").mkdir()
    pd.DataFrame({"problem_id": profile["problem_id"], "bucket": "easy",
                  "split": ["train"] * 4 + ["val"] * 2}).to_parquet(art / "bucket" / "buckets.parquet")
    old = art / "sweep" / "runs" / "np16_nr4_uniform_s7"
    old.mkdir(parents=True)
    (old / "identity.json").write_text(json.dumps({"config_hash": "earlier grid"}))
    (old / "done.json").write_text(json.dumps({"status": "finished"}))


@pytest.mark.slow
def test_sweep_never_archives_ended_runs_because_of_params(tmp_path):
    """Issue 23: a grid change moved every finished run to archive/ and emptied the tables. Now the
    sweep refuses, naming the runs, unless asked with --archive-stale (which says what it moves)."""
    root = tmp_path / "p"
    _fake_study(root)
    path = params_file(root, yaml.safe_dump({"workers": 1, "sweep": {"n": [2], "b_problem": [2], "seeds": [0],
                                                                      "c_max": 8}}))
    old = root / "artifacts" / "sweep" / "runs" / "np16_nr4_uniform_s7"
    r = cli(root, "run", "sweep", "--params", str(path))
    assert r.returncode == 2, r.stderr[-2000:]
    message = short(r.stderr)
    assert "would move 1 ended runs" in message and "np16_nr4_uniform_s7" in message and "--archive-stale" in message
    assert (old / "done.json").exists() and not (root / "artifacts" / "sweep" / "archive").exists()

    r = cli(root, "run", "sweep", "--archive-stale", "--params", str(path))
    archived = list((root / "artifacts" / "sweep" / "archive").glob("np16_nr4_uniform_s7-*"))
    assert len(archived) == 1 and (archived[0] / "done.json").exists() and not old.exists()
    assert "sweep: archiving np16_nr4_uniform_s7" in r.stdout, r.stdout[-2000:]
