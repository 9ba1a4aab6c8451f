"""dvc.yaml's code deps are what `rollscale deps` computes (rollscale.pipeline.stages.deps): DVC is the
only judge of what reruns, so a code change it cannot see would leave a stale result.

One test imports every entry point in a fresh interpreter and checks that the project files in
``sys.modules`` are all among the files the source reading finds, so it misses nothing Python
actually loads; another does so for each stage of a whole study as DVC ran it (tests/test_dvc.py's build).
A stage depends on no plugin of a registry it never reads: an edit to the forecast or the report leaves
``base``, ``profile``, ``bucket`` and ``measure`` current."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rollscale.pipeline.stages.deps import CODE_ROOTS, code_deps, deps_diff, is_plugin_package, render_dvc_yaml, \
    stage_files
from rollscale.registry import PLUGIN_PACKAGES, SAMPLING_ENGINES, SEARCH_METHODS

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


# the stages before the sweep: none of them runs a search method, the forecast or the report
BEFORE_SWEEP = ("base", "profile", "bucket", "measure")


@pytest.mark.parametrize("stage", BEFORE_SWEEP)
def test_the_stages_before_the_sweep_depend_on_no_search_method_forecast_or_report(stage):
    deps = STAGES[stage]["deps"]
    assert "rollscale/core/search/methods" not in deps
    assert not [d for d in deps if d.startswith(("rollscale/core/search", "rollscale/report", "rollscale/sweep/rungs"))
                or d == "rollscale/core/fit/forecast.py"], deps
    assert "rollscale/core/search/methods" in STAGES["sweep"]["deps"]


def _calls_on(tree: ast.AST, names: set[str]) -> set[str]:
    """The registries of ``names`` whose ``get`` or ``items`` (what imports an entry) the module calls."""
    return {node.func.value.id for node in ast.walk(tree) if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute) and node.func.attr in ("get", "items")
            and isinstance(node.func.value, ast.Name) and node.func.value.id in names}


def test_code_that_loads_a_lazy_registrys_entry_names_its_package():
    """A lazy registry's name check imports nothing, so it makes no stage depend on the package; the code that
    loads an entry (``get``, ``items``) is inside the package or names it in a ``PLUGIN_PACKAGES`` literal, which
    makes its stages depend on the folder. Else an edited method would leave the sweep current."""
    lazy = {"SAMPLING_ENGINES": SAMPLING_ENGINES, "SEARCH_METHODS": SEARCH_METHODS}
    assert all(r.lazy for r in lazy.values()) and not set(PLUGIN_PACKAGES) & {p for r in lazy.values() for p in r.plugins}
    unnamed, loaders = [], 0
    for path in sorted(p for root in CODE_ROOTS for p in (REPO / root).rglob("*.py")):
        tree = ast.parse(path.read_text())
        named = [e.value for node in tree.body if isinstance(node, ast.Assign)
                 and any(isinstance(t, ast.Name) and t.id == "PLUGIN_PACKAGES" for t in node.targets)
                 for e in node.value.elts]
        for name in _calls_on(tree, set(lazy)):
            loaders += 1
            package = lazy[name].plugins[0]
            inside = path.parent == REPO.joinpath(*package.split(".")) and is_plugin_package(path.parent)
            if not inside and package not in named:
                unnamed.append(f"{path.relative_to(REPO)} loads a {lazy[name].kind} without naming {package}")
    assert loaders >= 2 and not unnamed, unnamed


def _loaded_by_stage(root: Path) -> dict[str, set[str]]:
    """The project files each stage's processes loaded in the traced build (tests/test_dvc.py), relative to it."""
    from tests.test_dvc import LOADED_MODULES

    procs = {r["pid"]: r for r in (json.loads(f.read_text()) for f in (root / LOADED_MODULES).glob("*.json"))}
    loaded: dict[str, set[str]] = {}
    for record in procs.values():
        p, stage = record, None
        while p is not None and stage is None:
            argv = p["argv"]
            if argv and str(argv[0]).endswith("flows/__main__.py") and len(argv) > 1:
                stage = argv[1]
            p = procs.get(p["ppid"])
        if stage is None:
            continue
        cwd = Path(record["cwd"])
        loaded.setdefault(stage, set()).update(
            Path(f).relative_to(cwd).as_posix() for f in record["files"]
            if Path(f).is_relative_to(cwd) and Path(f).relative_to(cwd).parts[0] in CODE_ROOTS)
    return loaded


@pytest.mark.slow
def test_each_stage_run_by_dvc_loads_only_files_its_deps_cover_and_every_plugin_package_it_lists(dvc_study):
    """The whole study as `dvc repro` ran it (tests/test_dvc.py's build, every process tracing the modules it
    loaded): what each stage's processes loaded is covered by its deps in dvc.yaml, and each plugin package its
    deps list is one the stage loaded a module of, or one that a module it loaded loads entries of by name (the
    report names a search method only when there was a search; this study's is a grid): no plugin of a registry
    the stage never reads."""
    root, _ = dvc_study
    stages = yaml.safe_load((root / "dvc.yaml").read_text())["stages"]
    loaded = _loaded_by_stage(root)
    assert set(loaded) == set(stages), sorted(loaded)
    for stage, files in loaded.items():
        deps = [d for d in stages[stage]["deps"] if Path(d).parts[0] in CODE_ROOTS]
        uncovered = sorted(f for f in files if not any(f == d or f.startswith(d + "/") for d in deps))
        assert not uncovered, f"stage {stage} loaded files its deps miss: {uncovered}"
        named = {p.replace(".", "/") for f in files for node in ast.parse((root / f).read_text()).body
                 if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "PLUGIN_PACKAGES"
                                                         for t in node.targets) for p in ast.literal_eval(node.value)}
        unread = [d for d in deps if (root / d).is_dir() and d not in named
                  and not any(f.startswith(d + "/") for f in files)]
        assert not unread, f"stage {stage} lists plugin packages it never loaded: {unread}"
    assert not any(f.startswith("rollscale/core/search") for s in BEFORE_SWEEP for f in loaded[s])


@pytest.mark.slow
def test_editing_the_forecast_or_the_report_leaves_the_stages_before_the_sweep_current(tmp_path, tmp_path_factory):
    import shutil

    from tests.shared_builds import built_once
    from tests.test_dvc import build_study, run, study_env

    # a copy of the study as built: the worker's `dvc_study` copy is edited and rerun by other tests before this one
    root, env = tmp_path / "study", study_env()
    shutil.copytree(built_once(tmp_path_factory, "dvc-study", build_study), root, symlinks=True,
                    copy_function=shutil.copy2)
    edited = [root / "rollscale" / "core" / "fit" / "forecast.py", root / "rollscale" / "report" / "base.py"]
    originals = {f: f.read_text() for f in edited}
    try:
        for f in edited:
            f.write_text(originals[f] + "\n# an edit\n")
        r = run(["dvc", "status", "--json"], root, env)
        assert r.returncode == 0, r.stderr
        stale = set(json.loads(r.stdout))
        assert {"sweep", "fit", "report"} <= stale and not stale & set(BEFORE_SWEEP), sorted(stale)
    finally:
        for f, text in originals.items():
            f.write_text(text)
