"""The code deps of ``dvc.yaml``, computed rather than kept by hand (``rollscale deps``).

DVC is the only judge of what reruns, so a stage must list every project file
it runs: a code change DVC cannot see would leave a stale result. A stage runs
its entry point (``python -m flows <stage>``: ``flows/__main__.py`` and
``flows/<stage>.py``) and every project file those import, followed through the
source at module level and inside functions (which load only when the code
runs). A *plugin package* (its ``__init__.py`` sets ``PLUGIN_PACKAGE = True``)
finds its modules at run time, so it is listed as one folder: a module added
there is a dep without editing ``dvc.yaml``. A module that loads plugin packages
by name (:mod:`rollscale.registry`) says so with a literal ``PLUGIN_PACKAGES``
tuple of their dotted names, which counts as importing them.

The other deps of a stage (``data``, the upstream ``artifacts/...`` folders)
say where its inputs come from; they are kept as written, before the code deps.
Plain functions over files; no DVC.
"""

from __future__ import annotations

import ast
import difflib
import functools
from collections.abc import Callable
from pathlib import Path

import yaml

__all__ = ["CODE_ROOTS", "PLUGIN_MARKER", "PROJECT_TEMPLATE", "STAMP_FOLDER", "code_deps", "deps_diff", "imported_by",
           "is_plugin_package", "render_dvc_yaml", "render_project_template", "stage_files"]

# top-level folders of the project's own source: deps inside them are computed
CODE_ROOTS = ("flows", "tasks", "rollscale")
PLUGIN_MARKER = "PLUGIN_PACKAGE"


def _module_file(root: Path, name: str) -> Path | None:
    """The file of project module ``name`` (a package's __init__.py), or None when not the project's."""
    if name.split(".")[0] not in CODE_ROOTS:
        return None
    base = root.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


@functools.cache
def is_plugin_package(folder: Path) -> bool:
    """Whether ``folder`` is a package whose ``__init__.py`` sets ``PLUGIN_PACKAGE = True``."""
    init = folder / "__init__.py"
    if not init.is_file():
        return False
    for node in ast.parse(init.read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == PLUGIN_MARKER for t in node.targets):
            return isinstance(node.value, ast.Constant) and node.value.value is True
    return False


def _named_plugin_packages(node: ast.AST) -> list[str]:
    """The dotted names of a module-level ``PLUGIN_PACKAGES = ("a.b", ...)`` (packages loaded by name)."""
    if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "PLUGIN_PACKAGES" for t in node.targets) \
            and isinstance(node.value, (ast.Tuple, ast.List)):
        return [e.value for e in node.value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return []


def imported_by(root: Path, path: Path) -> set[Path]:
    """Project files that ``path`` imports anywhere in its source (module level or in functions),
    and the plugin packages it names in ``PLUGIN_PACKAGES``."""
    stat = path.stat()
    return set(_imported_by(root, path, stat.st_mtime_ns, stat.st_size))


# one parse per file and version: the seven stages share most of their modules, and `init` walked the ~150 of them
# 738 times (6.5 of its 7 CPU-s with --pilot 0); the file's mtime and size in the key, so an edited file is read again
@functools.lru_cache(maxsize=4096)
def _imported_by(root: Path, path: Path, mtime_ns: int, size: int) -> frozenset[Path]:
    found = set()
    tree = ast.parse(path.read_text(), filename=str(path))
    names = [name for node in tree.body for name in _named_plugin_packages(node)]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    for name in names:
        parts = name.split(".")
        for i in range(1, len(parts) + 1):  # a package import also runs its __init__
            file = _module_file(root, ".".join(parts[:i]))
            if file:
                found.add(file)
    return frozenset(found)


def _plugin_modules(path: Path) -> set[Path]:
    """Every module of the plugin package ``path`` belongs to (it may load any of them), else none."""
    folder = path.parent
    return set(folder.rglob("*.py")) if is_plugin_package(folder) else set()


def stage_files(root: str | Path, stage: str) -> set[Path]:
    """The project files stage ``stage`` runs: its entry point and what they import, transitively."""
    root = Path(root).resolve()
    todo = {root / "flows" / "__main__.py", root / "flows" / "__init__.py", root / "flows" / f"{stage}.py"}
    missing = sorted(str(f.relative_to(root)) for f in todo if not f.is_file())
    if missing:
        raise FileNotFoundError(f"stage {stage!r}: no entry point {', '.join(missing)}")
    seen: set[Path] = set()
    while todo:
        f = todo.pop()
        seen.add(f)
        todo |= (imported_by(root, f) | _plugin_modules(f)) - seen
    return seen


def code_deps(root: str | Path, stage: str) -> list[str]:
    """The sorted code deps of ``stage`` as ``dvc.yaml`` lists them: files, and a plugin
    package's folder in place of its files."""
    root = Path(root).resolve()
    deps = set()
    for f in stage_files(root, stage):
        folder = next((p for p in f.parents if p != root and is_plugin_package(p)), None)
        # the outermost plugin package holds all of it
        while folder is not None and is_plugin_package(folder.parent) and folder.parent != root:
            folder = folder.parent
        deps.add((folder or f).relative_to(root).as_posix())
    return sorted(deps)


def _is_code(dep: str) -> bool:
    return Path(dep).parts[0] in CODE_ROOTS


def _rewrite_code_deps(text: str, code: Callable[[str], list[str]]) -> str:
    """``dvc.yaml`` text with each stage's code deps replaced by ``code(stage)``; the other deps
    (data, upstream outputs) and everything else kept as written."""
    stages = (yaml.safe_load(text) or {}).get("stages") or {}
    lines = text.splitlines(keepends=True)
    out: list[str] = []
    stage = None
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.rstrip("\n")
        if stripped.startswith("  ") and not stripped.startswith("   ") and stripped.endswith(":"):
            stage = stripped.strip()[:-1]
        out.append(line)
        i += 1
        if stage in stages and stripped == "    deps:":
            kept = []
            while i < len(lines) and lines[i].startswith("      - "):
                dep = lines[i].strip()[2:]
                if not _is_code(dep):
                    kept.append(dep)
                i += 1
            out += [f"      - {d}\n" for d in [*kept, *code(stage)]]
    return "".join(out)


def render_dvc_yaml(root: str | Path) -> str:
    """``dvc.yaml`` with each stage's code deps as computed; everything else kept as written."""
    root = Path(root).resolve()
    return _rewrite_code_deps((root / "dvc.yaml").read_text(), lambda stage: code_deps(root, stage))


# the dvc.yaml that `rollscale init` writes into a study folder of the user's own, kept with the
# package (a wheel has no repository dvc.yaml): the repository's stages, each watching a stamp
# of the installed code it runs (rollscale.pipeline.init.project) in place of the code's files
PROJECT_TEMPLATE = Path(__file__).with_name("study_dvc.yaml")
STAMP_FOLDER = ".rollscale/code"
PROJECT_HEADER = """\
# The study, stage by stage, written by `rollscale init` (the stages of rollscale's own dvc.yaml).
# Each command runs one stage of the installed rollscale (`python -m flows <stage>`). DVC alone
# decides what reruns: deps are the data, the upstream stages' outputs and a stamp of the installed
# code each stage runs (.rollscale/code/<stage>, refreshed by `rollscale study`, `run` and `status`:
# a new rollscale version reruns the stages whose code changed); params the sections each reads.
"""


def render_project_template(root: str | Path) -> str:
    """:data:`PROJECT_TEMPLATE`'s text from the repository's ``dvc.yaml`` at ``root``."""
    text = render_dvc_yaml(root)
    body = text[text.index("stages:"):]
    return PROJECT_HEADER + _rewrite_code_deps(body, lambda stage: [f"{STAMP_FOLDER}/{stage}"])


def deps_diff(root: str | Path) -> str:
    """A unified diff from ``dvc.yaml`` (and the packaged study template, when ``root`` is the
    repository holding it) to what :func:`render_dvc_yaml` writes; empty when up to date."""
    root = Path(root).resolve()
    pairs = [(root / "dvc.yaml", render_dvc_yaml(root))]
    if PROJECT_TEMPLATE.is_relative_to(root):
        pairs.append((PROJECT_TEMPLATE, render_project_template(root)))
    out = []
    for path, new in pairs:
        old = path.read_text() if path.exists() else ""
        name = path.relative_to(root).as_posix()
        out += difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                    name, f"{name} (computed deps)")
    return "".join(out)
