"""The layers of docs/architecture.md, checked: the import contract of pyproject.toml
([tool.importlinter], run with import-linter), no module using another's private names, and
no library module over 400 lines."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LIBRARY = REPO / "rollscale"
MAX_LINES = 400
# modules allowed over the limit for now; the test fails once one is not, so an entry cannot outlive its fix
OVER_LIMIT: set[str] = set()
# attributes of other libraries that have no public accessor, with why
FOREIGN_PRIVATE = {
    ("rollscale/integrations/trl.py", "_metrics"),  # TRL's GRPOTrainer keeps the metrics it logs only there
    ("rollscale/pipeline/interrupts.py", "_exit"),  # os._exit: the one way to end without waiting on threads
    ("rollscale/pipeline/runtime/server.py", "_exit"),  # likewise, once the server has stopped
}


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).parent / "lint-imports"
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([str(exe), "--no-cache", "--no-logo", "--config", str(root / "pyproject.toml")], cwd=root,
                          env=env, text=True, capture_output=True, timeout=120)


def test_import_contract_holds():
    r = lint_imports(REPO)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "7 kept, 0 broken" in r.stdout


def _copy_project(dest: Path) -> Path:
    for folder in ("rollscale", "tasks", "flows"):
        shutil.copytree(REPO / folder, dest / folder, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", dest / "pyproject.toml")
    return dest


LATE = "\n\ndef _late():\n    {}\n"  # an import inside a function counts like one at the top


@pytest.mark.parametrize("edits, broken", [
    # up the layers: core may not reach the pipeline
    ({"rollscale/core/checks.py": LATE.format("from rollscale.pipeline.query import storage")}, "The library's layers"),
    # config imports no library layer
    ({"rollscale/config/sections.py": "\nfrom rollscale.core import checks\n"}, "The library's layers"),
    # the report never imports the trainer, nor the sweep (its sibling)
    ({"rollscale/report/base.py": "\nimport rollscale.train.checkpoint\n"}, "The report reads the study's tables"),
    ({"rollscale/report/base.py": "\nimport rollscale.sweep.grid\n"}, "The library's layers"),
    # one run never reaches the sweep over runs
    ({"rollscale/train/trainer.py": LATE.format("from rollscale.sweep import rungs")}, "The library's layers"),
    # the library never imports tasks or flows
    ({"rollscale/sweep/grid.py": LATE.format("import tasks.sweep")}, "flows > tasks > the library"),
    # the science's parts: the fits never read the search, noise never reads the fits,
    # problems read no other part of core, the shared vocabulary reads nothing of core
    ({"rollscale/core/fit/curves.py": LATE.format("from rollscale.core.search import state")}, "The science's parts"),
    ({"rollscale/core/noise/ema.py": LATE.format("from rollscale.core.fit import sigmoid")}, "The science's parts"),
    ({"rollscale/core/problems/buckets.py": LATE.format("from rollscale.core.grpo import shaping")}, "The science's parts"),
    ({"rollscale/core/metrics.py": LATE.format("from rollscale.core.problems import problem")}, "The science's parts"),
    # a circle between two modules of one package
    # the user's commands: check never reaches init (init sizes a study from check's models, not the reverse)
    ({"rollscale/pipeline/check/lr.py": LATE.format("from rollscale.pipeline.init import values")}, "The user's commands"),
    # the config tree's leaves import nothing of the tree
    ({"rollscale/config/keys.py": LATE.format("from rollscale.config import sections")}, "The config tree"),
    ({"rollscale/core/noise/gram.py": LATE.format("from rollscale.core.noise import ema"),
      "rollscale/core/noise/ema.py": LATE.format("from rollscale.core.noise import gram")}, "No import cycle"),
])
def test_the_contract_breaks_on_an_import_against_the_layers(tmp_path, edits, broken):
    root = _copy_project(tmp_path)
    for module, text in edits.items():
        (root / module).write_text((root / module).read_text() + text)
    r = lint_imports(root)
    assert r.returncode != 0 and f"{broken}" in r.stdout and "BROKEN" in r.stdout, r.stdout[-3000:]


def _private_uses(path: Path, root: Path = REPO) -> list[str]:
    """Private names of other rollscale modules that ``path`` imports or reads (``x._name``,
    ``x`` not self or cls)."""
    rel = path.relative_to(root).as_posix()
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("rollscale"):
            found += [f"{rel}:{node.lineno}: imports {node.module}.{a.name}" for a in node.names
                      if a.name.startswith("_") and not a.name.startswith("__")]
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            owner = node.value
            if not (isinstance(owner, ast.Name) and owner.id in ("self", "cls")) and (rel, node.attr) not in FOREIGN_PRIVATE:
                found.append(f"{rel}:{node.lineno}: reads {ast.unparse(owner)}.{node.attr}")
    return found


def test_no_library_module_uses_another_modules_private_names():
    found = [use for path in sorted(LIBRARY.rglob("*.py")) for use in _private_uses(path)]
    assert not found, "make the name public where it is defined:\n" + "\n".join(found)


def test_the_private_name_check_sees_imports_and_attributes(tmp_path):
    path = tmp_path / "probe.py"
    path.write_text("from rollscale.core.noise.signal import _block_gram\n\n\ndef f(store, self):\n"
                    "    return store._parts(), self._fine\n")
    assert [u.split(": ", 1)[1] for u in _private_uses(path, tmp_path)] == [
        "imports rollscale.core.noise.signal._block_gram", "reads store._parts"]


def test_no_library_module_is_over_400_lines():
    long = {p.relative_to(REPO).as_posix(): n for p in LIBRARY.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not set(long) - OVER_LIMIT, f"split these by concern: {long}"
    assert not OVER_LIMIT - set(long), f"no longer over {MAX_LINES} lines: remove {OVER_LIMIT - set(long)} from OVER_LIMIT"


def test_loading_the_run_store_loads_no_query_engine():
    # the run store writes through rollscale.files, not the pipeline's storage module (which holds DuckDB)
    probe = "import sys, rollscale.train.checkpoint; print('duckdb' in sys.modules, 'rollscale.pipeline' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                       text=True, capture_output=True, timeout=120)
    assert r.stdout.split() == ["False", "False"], r.stderr[-2000:]


def prefix_families(folder: Path) -> dict[str, list[str]]:
    """Modules of one folder that share the first word of their name (``check.py``, ``check_lr.py``,
    ``check_memory.py``): three or more are a package waiting to be made."""
    families: dict[str, list[str]] = {}
    for path in sorted(folder.glob("*.py")):
        if path.stem != "__init__":
            families.setdefault(path.stem.split("_")[0], []).append(path.stem)
    return {word: stems for word, stems in families.items() if len(stems) >= 3}


def test_no_folder_has_a_prefix_family_of_three_modules():
    folders = [p for top in ("rollscale", "tasks", "flows") for p in [REPO / top, *(REPO / top).rglob("*")]
               if p.is_dir() and p.name != "__pycache__"]
    found = {f.relative_to(REPO).as_posix(): fam for f in folders if (fam := prefix_families(f))}
    assert not found, f"group these into a package each: {found}"


def test_the_prefix_family_check_sees_a_family(tmp_path):
    for stem in ("check", "check_lr", "check_memory", "stages", "stage_time"):
        (tmp_path / f"{stem}.py").write_text("")
    assert prefix_families(tmp_path) == {"check": ["check", "check_lr", "check_memory"]}


def test_every_package_of_the_library_says_what_it_holds():
    silent = [p.relative_to(REPO).as_posix() for p in LIBRARY.rglob("__init__.py")
              if ast.get_docstring(ast.parse(p.read_text())) is None]
    assert not silent, f"give these a docstring saying what the package holds: {silent}"
