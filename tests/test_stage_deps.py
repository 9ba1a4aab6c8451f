"""Every stage's dvc.yaml deps cover every project file the stage imports (issue: DVC is the
only judge of what reruns, so a code change it cannot see would leave a stale result).

A stage's files are those its entry point (``python -m flows <stage>``: flows/__main__.py and
flows/<stage>.py) imports, followed through the project's source, at module level and inside
functions (which load only when the code runs). One test imports every entry point in a fresh
interpreter and checks that the project files in ``sys.modules`` are all among them, so the
source reading misses nothing Python actually loads."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rollscale.registry import PLUGIN_PACKAGES

REPO = Path(__file__).resolve().parents[1]
REGISTRY = REPO / "rollscale" / "registry.py"
STAGES = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
PROBE = """
import importlib, json, sys
importlib.import_module("flows.__main__")
for stage in sys.argv[1:]:
    importlib.import_module("flows." + stage)
print(json.dumps(sorted({m.__file__ for m in list(sys.modules.values()) if getattr(m, "__file__", None)})))
"""


def project_file(name: str) -> Path | None:
    """The file of project module ``name`` (a package's __init__.py), or None when not the project's."""
    base = REPO.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def imported_by(path: Path) -> set[Path]:
    """Project files that ``path`` imports anywhere in its source (module level or in functions)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            parts = name.split(".")
            for i in range(1, len(parts) + 1):  # a package import also runs its __init__
                file = project_file(".".join(parts[:i]))
                if file:
                    found.add(file)
    return found


def plugin_files() -> set[Path]:
    """The files of the registries' plugin packages (rollscale/registry.py imports them by name
    when a name is looked up, which no import statement shows; dvc.yaml lists their folders)."""
    return {f for package in PLUGIN_PACKAGES for f in REPO.joinpath(*package.split(".")).glob("*.py")}


def stage_files(stage: str) -> set[Path]:
    """The project files stage ``stage`` runs: its entry point and what they import, transitively."""
    todo = {REPO / "flows" / "__main__.py", REPO / "flows" / "__init__.py", REPO / "flows" / f"{stage}.py"}
    seen: set[Path] = set()
    while todo:
        f = todo.pop()
        seen.add(f)
        todo |= imported_by(f) - seen
        if f == REGISTRY:
            todo |= plugin_files() - seen
    return seen


@pytest.mark.parametrize("stage", list(STAGES))
def test_stage_deps_cover_every_project_file_it_imports(stage):
    deps = [REPO / d for d in STAGES[stage].get("deps", []) if not str(d).startswith("artifacts")]
    files = stage_files(stage)
    assert REPO / "rollscale" / "config.py" in files and REPO / "rollscale" / "pipeline" / "stages.py" in files
    uncovered = sorted(str(f.relative_to(REPO)) for f in files
                       if not any(f == d or f.is_relative_to(d) for d in deps))
    assert not uncovered, f"dvc.yaml stages.{stage}.deps miss: {uncovered}"


@pytest.mark.parametrize("stage", list(STAGES))
def test_plugin_packages_are_folder_deps(stage):
    """A new rule, loss or engine is a new module of its package: the stage's deps name the
    folder, so the module needs no dvc.yaml edit (.dvcignore keeps __pycache__ out of its hash)."""
    if REGISTRY in stage_files(stage):
        for package in PLUGIN_PACKAGES:
            assert package.replace(".", "/") in STAGES[stage]["deps"], f"stages.{stage}.deps: add the folder {package}"
    assert "__pycache__" in (REPO / ".dvcignore").read_text().split()


def test_stages_that_read_the_problem_pool_watch_the_data_folder():
    readers = [s for s in STAGES if REPO / "tasks" / "problems.py" in stage_files(s)]
    assert "base" in readers and "profile" in readers
    assert all("data" in STAGES[s]["deps"] for s in readers)
    assert (REPO / "data").is_dir()  # DVC fails a stage whose dep is missing


@pytest.mark.slow
def test_source_reading_finds_every_project_file_python_loads():
    env = {"PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PATH": "", "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, "-c", PROBE, *STAGES], cwd=REPO, env=env, text=True, capture_output=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    loaded = {Path(f) for f in json.loads(r.stdout) if Path(f).is_absolute() and Path(f).is_relative_to(REPO)}
    loaded = {f for f in loaded if ".venv" not in f.parts}
    read = set().union(*(stage_files(s) for s in STAGES))
    assert loaded and not loaded - read, sorted(str(f) for f in loaded - read)


def test_no_library_module_imports_flows_or_tasks():
    for path in (REPO / "rollscale").rglob("*.py"):
        bad = {f for f in imported_by(path) if f.relative_to(REPO).parts[0] in ("flows", "tasks")}
        assert not bad, f"{path.relative_to(REPO)} imports {sorted(str(b) for b in bad)}"
