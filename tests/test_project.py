"""A study folder of the user's own (issue 32, "a project folder of the user's own"): `rollscale init`
in an empty folder outside the repository writes what the stages need there, and `rollscale check`,
`status` and a stage run in it from the installed code; outside any study, one line says to run init."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rollscale.pipeline.init.project import DVCIGNORE, _with_data_dep, write_code_stamps
from rollscale.pipeline.stages.deps import PROJECT_TEMPLATE, STAMP_FOLDER
from tests.verl_data import write_verl_table

REPO = Path(__file__).resolve().parents[1]


def rollscale(folder: Path, *args: str) -> subprocess.CompletedProcess:
    """The installed command in ``folder``, with nothing of the repository on the path: this venv's
    python and dvc first on PATH (dvc.yaml's commands run `python -m flows ...`)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    return subprocess.run([sys.executable, "-m", "rollscale.pipeline.cli", *args], cwd=folder, env=env,
                          capture_output=True, text=True)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """An empty folder outside the repository, with a tiny model and a verl table, after `rollscale init`."""
    from rollscale.lm.models import char_tokenizer, tiny_llama

    root = tmp_path_factory.mktemp("mystudy")
    assert not root.is_relative_to(REPO)
    write_verl_table(root / "arith.parquet", rows=40)
    tok = char_tokenizer()
    tiny_llama(len(tok), hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64).save_pretrained(root / "tiny")
    tok.save_pretrained(root / "tiny")
    # 40 problems settle no key at the tolerance: init writes the study only with --force, and says so first
    r = rollscale(root, "init", "--model", "tiny", "--data", "arith.parquet", "--force")
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.startswith("init: cannot answer"), r.stdout
    assert "this folder is the study's" in r.stdout
    return root


def test_status_and_study_outside_a_study_say_to_run_init(tmp_path):
    for args in (["status"], ["study"], ["run", "base"]):
        r = rollscale(tmp_path, *args)
        assert r.returncode != 0
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
        assert "no study in" in lines[0] and "rollscale init" in lines[0]


def test_init_writes_the_study_folder(folder):
    assert {"params.yaml", "dvc.yaml", ".dvcignore", ".dvc"} <= {p.name for p in folder.iterdir()}
    assert not (folder / "flows").exists()
    stages = yaml.safe_load((folder / "dvc.yaml").read_text())["stages"]
    assert list(stages) == list(yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"])
    # the data file is the dep of the stages that read the pool; the params section `data` stays
    assert stages["profile"]["deps"][0] == "arith.parquet" and "data" in stages["profile"]["params"]
    # a real model's base watches the settings that change the model only (issue 32, part 6)
    assert stages["base"]["params"] == ["model", "base"] and "arith.parquet" not in stages["base"]["deps"]
    for stage, body in stages.items():  # no code file of the repository: a stamp of the installed code
        assert not any(d.startswith(("flows/", "tasks/", "rollscale/")) for d in body["deps"])
        assert (folder / STAMP_FOLDER / stage).is_file()
    assert write_code_stamps(folder) == []  # written once: unchanged code leaves them as they are


def test_check_status_and_a_stage_run_in_the_users_folder(folder):
    r = rollscale(folder, "check")  # the verdict init wrote it with
    assert r.returncode == 2 and "no study resolves" in r.stdout, r.stdout + r.stderr
    r = rollscale(folder, "study", "--stages", "base", "--no-check")
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert "study: base ran" in r.stdout
    assert (folder / "dvc.lock").is_file() and (folder / "artifacts" / "base").is_dir()
    r = rollscale(folder, "status")
    assert r.returncode == 0, r.stderr
    base = next(line for line in r.stdout.splitlines() if line.strip().startswith("base"))
    assert "done" in base
    # a data setting leaves base done (it changes no model); profile reads the pool
    params = yaml.safe_load((folder / "params.yaml").read_text())
    (folder / "params.yaml").write_text(yaml.safe_dump({**params, "data": {**params["data"], "limit": 30}}))
    r = rollscale(folder, "status")
    base = next(line for line in r.stdout.splitlines() if line.strip().startswith("base"))
    assert "done" in base, r.stdout
    # a changed stamp (a new rollscale version's code) makes the stage stale, as a code change in a clone
    (folder / STAMP_FOLDER / "base").write_text("# older code\n0\n")
    assert write_code_stamps(folder) == ["base"]


def test_template_data_dep_is_the_file_or_dropped():
    text = PROJECT_TEMPLATE.read_text()
    with_file = yaml.safe_load(_with_data_dep(text, "my.parquet"))["stages"]
    dropped = yaml.safe_load(_with_data_dep(text, None))["stages"]
    for stage in ("base", "profile"):
        assert "my.parquet" in with_file[stage]["deps"] and "data" not in with_file[stage]["deps"]
        assert "data" not in dropped[stage]["deps"] and "data" in dropped[stage]["params"]


def test_dvcignore_patterns_are_the_repositorys():
    ours = {line for line in DVCIGNORE.splitlines() if line and not line.startswith("#")}
    assert ours <= set((REPO / ".dvcignore").read_text().splitlines())
