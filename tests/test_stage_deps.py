"""dvc.yaml's code deps are what `rollscale deps` computes (rollscale.pipeline.stages.deps): DVC is the
only judge of what reruns, so a code change it cannot see would leave a stale result.

One test imports every entry point in a fresh interpreter and checks that the project files in
``sys.modules`` are all among the files the source reading finds, so it misses nothing Python
actually loads."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rollscale.pipeline.stages.deps import code_deps, deps_diff, render_dvc_yaml, stage_files
from rollscale.registry import PLUGIN_PACKAGES

REPO = Path(__file__).resolve().parents[1]
STAGES = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
PROBE = """
import importlib, json, sys
importlib.import_module("flows.__main__")
for stage in sys.argv[1:]:
    importlib.import_module("flows." + stage)
print(json.dumps(sorted({m.__file__ for m in list(sys.modules.values()) if getattr(m, "__file__", None)})))
"""


def test_dvc_yaml_deps_are_the_computed_ones():
    assert deps_diff(REPO) == "", "dvc.yaml deps are stale: run `rollscale deps --write`"


@pytest.mark.parametrize("stage", list(STAGES))
def test_stage_deps_cover_every_project_file_it_imports(stage):
    deps = [REPO / d for d in STAGES[stage].get("deps", []) if not str(d).startswith("artifacts")]
    files = stage_files(REPO, stage)
    assert REPO / "rollscale" / "config" / "study.py" in files and REPO / "rollscale" / "pipeline" / "stages" / "specs.py" in files
    uncovered = sorted(str(f.relative_to(REPO)) for f in files
                       if not any(f == d or f.is_relative_to(d) for d in deps))
    assert not uncovered, f"dvc.yaml stages.{stage}.deps miss: {uncovered}"


def test_stages_that_read_the_problem_pool_watch_the_data_folder():
    readers = [s for s in STAGES if REPO / "tasks" / "problems.py" in stage_files(REPO, s)]
    assert "base" in readers and "profile" in readers
    assert all("data" in STAGES[s]["deps"] for s in readers)
    assert (REPO / "data").is_dir()  # DVC fails a stage whose dep is missing


def _project(tmp_path: Path, deps: list[str]) -> Path:
    """A project with one stage whose flow imports a plugin package (modules found at run time)."""
    for folder in ("flows", "rollscale", "rollscale/rules"):
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "flows" / "__main__.py").write_text("import rollscale\n")
    (tmp_path / "flows" / "train.py").write_text("def run():\n    from rollscale.rules import names\n")
    (tmp_path / "rollscale" / "rules" / "__init__.py").write_text(
        "PLUGIN_PACKAGE = True  # its modules register themselves when loaded\n"
        "def names():\n    import importlib, pkgutil\n    return [m.name for m in pkgutil.iter_modules(__path__)]\n")
    (tmp_path / "rollscale" / "rules" / "uniform.py").write_text("from rollscale import checks\n")
    (tmp_path / "rollscale" / "checks.py").write_text("")
    (tmp_path / "dvc.yaml").write_text("# the study\nstages:\n  train:\n    cmd: python -m flows train\n    deps:\n"
                                       + "".join(f"      - {d}\n" for d in deps) + "    outs:\n      - artifacts/train\n")
    return tmp_path


def test_a_plugin_package_is_one_folder_dep_and_its_modules_imports_are_followed(tmp_path):
    root = _project(tmp_path, ["data", "artifacts/base", "flows/old.py"])
    assert code_deps(root, "train") == ["flows/__init__.py", "flows/__main__.py", "flows/train.py",
                                        "rollscale/__init__.py", "rollscale/checks.py", "rollscale/rules"]
    text = render_dvc_yaml(root)
    # the data-flow deps stay first and as written, the stale code dep is gone, comments survive
    assert text.startswith("# the study\n") and "flows/old.py" not in text
    assert yaml.safe_load(text)["stages"]["train"]["deps"][:3] == ["data", "artifacts/base", "flows/__init__.py"]
    assert deps_diff(root) != ""
    (root / "dvc.yaml").write_text(text)
    assert deps_diff(root) == ""
    (root / "rollscale" / "rules" / "pods.py").write_text("")  # a new rule: no dvc.yaml edit
    assert deps_diff(root) == ""


def test_a_module_that_names_plugin_packages_loads_them(tmp_path):
    """rollscale/registry.py imports its plugin packages by name: its PLUGIN_PACKAGES literal
    counts as an import, so every stage that loads it depends on their folders."""
    root = _project(tmp_path, ["data"])
    (root / "flows" / "train.py").write_text("def run():\n    from rollscale import registry\n")
    (root / "rollscale" / "registry.py").write_text('PLUGIN_PACKAGES = ("rollscale.rules",)\n')
    assert code_deps(root, "train") == ["flows/__init__.py", "flows/__main__.py", "flows/train.py",
                                        "rollscale/__init__.py", "rollscale/checks.py", "rollscale/registry.py",
                                        "rollscale/rules"]


def test_a_module_edited_after_a_reading_is_read_again(tmp_path):
    """Each file's imports are parsed once per version (a process reading the seven stages parses a shared module
    once): an edit in the same process is seen."""
    root = _project(tmp_path, ["data"])
    before = code_deps(root, "train")
    assert "rollscale/registry.py" not in before
    (root / "rollscale" / "registry.py").write_text("")
    train = root / "flows" / "train.py"
    train.write_text(train.read_text() + "from rollscale import registry\n")
    assert code_deps(root, "train") == sorted([*before, "rollscale/registry.py"])


@pytest.mark.parametrize("stage", list(STAGES))
def test_the_registries_plugin_packages_are_folder_deps(stage):
    """A new rule, loss or engine is a new module of its package: every stage that validates
    params lists the package's folder, and .dvcignore keeps __pycache__ out of the folder's hash."""
    assert REPO / "rollscale" / "registry.py" in stage_files(REPO, stage)
    for package in PLUGIN_PACKAGES:
        assert package.replace(".", "/") in STAGES[stage]["deps"]
    assert "__pycache__" in (REPO / ".dvcignore").read_text().split()


def test_rollscale_deps_exits_1_when_stale_and_write_fixes_it(tmp_path):
    root = _project(tmp_path, ["data"])
    env = {"PATH": "", "PYTHONPATH": str(REPO)}
    run = [str(Path(sys.executable).parent / "rollscale"), "deps"]  # not -m: the folder's own rollscale/ would shadow
    stale = subprocess.run(run, cwd=root, env=env, text=True, capture_output=True, timeout=120)
    assert stale.returncode == 1 and "+      - rollscale/rules" in stale.stdout and "--write" in stale.stdout
    assert subprocess.run([*run, "--write"], cwd=root, env=env, capture_output=True, timeout=120).returncode == 0
    fresh = subprocess.run(run, cwd=root, env=env, text=True, capture_output=True, timeout=120)
    assert fresh.returncode == 0 and "rollscale/rules" in (root / "dvc.yaml").read_text()


@pytest.mark.slow
def test_source_reading_finds_every_project_file_python_loads():
    env = {"PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PATH": "", "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, "-c", PROBE, *STAGES], cwd=REPO, env=env, text=True, capture_output=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    loaded = {Path(f) for f in json.loads(r.stdout) if Path(f).is_absolute() and Path(f).is_relative_to(REPO)}
    loaded = {f for f in loaded if ".venv" not in f.parts}
    read = set().union(*(stage_files(REPO, s) for s in STAGES))
    assert loaded and not loaded - read, sorted(str(f) for f in loaded - read)
