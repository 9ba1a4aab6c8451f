"""Registries: what params.yaml may name (allocation rules, advantage estimators, policy losses,
loss aggregations, sampling engines, search methods, forecast forms), each filled by the modules that define
the entries.

A leaf: it imports nothing from the library. Each registry knows its *plugin packages* by dotted
name and imports them on first use, the way entry points are found: every module of such a
package registers its entries with a decorator when it is imported, so adding a rule, a loss
or an engine is one new module in its package (nothing else lists it). verl's
``register_adv_est`` / ``register_policy_loss`` are the model.

Two kinds of discovery:

- eager (rules, losses): the first lookup imports every module of the plugin packages. Their
  modules are imported when ``params.yaml`` is validated, so they keep heavy imports (torch)
  out of module level: tensors have methods for everything a loss needs.
- lazy (engines, search methods, forecast forms): the entries a module's decorators name, else one named after
  it (``hf_paged.py`` is "hf-paged"); the names are read from the package's folder and sources without importing
  anything, and :meth:`Registry.get`
  imports only the module asked for (vLLM loads only when chosen; a search method's fits only when
  the sweep searches). Checking a name (params validation) reads the folder, so a stage that only
  validates params does not run, and does not depend on, any module of a lazy registry.
"""

from __future__ import annotations

import ast
import difflib
import functools
import importlib
import importlib.util
import pkgutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Generic, TypeVar

from rollscale.parsing import PARSE_LOCK

T = TypeVar("T")


class RegistryError(ValueError):
    """An unknown name, or a name registered twice."""


def closest_hint(name: object, valid: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` for the valid name closest to ``name``, or ``""``."""
    close = difflib.get_close_matches(str(name), list(valid), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def _module_paths(package: str) -> dict[str, Path]:
    """Dotted name -> file of the modules in ``package`` (not private ``_x`` ones), found by walking the folders
    from its top-level package: nothing is imported, not even the packages above it (a name check of a lazy
    registry runs no project code)."""
    top, *rest = package.split(".")
    spec = importlib.util.find_spec(top)
    if spec is not None and spec.submodule_search_locations is not None:
        for location in spec.submodule_search_locations:
            where = Path(location).joinpath(*rest)
            if rest and where.with_suffix(".py").is_file():  # a plain module is a plugin of its own
                return {package: where.with_suffix(".py")}
            if (where / "__init__.py").is_file():
                return {f"{package}.{m.name}": where / m.name / "__init__.py" if m.ispkg else where / f"{m.name}.py"
                        for m in pkgutil.iter_modules([str(where)]) if not m.name.startswith("_")}
    raise RegistryError(f"plugin package {package!r} not found")


def _submodules(package: str) -> list[str]:
    """Dotted names of the modules in ``package`` (not private ``_x`` ones), without importing them."""
    return list(_module_paths(package))


def _registers(decorator: ast.expr, name: str) -> bool:
    """Whether ``decorator`` is ``<REGISTRY>.register("name")``."""
    return (isinstance(decorator, ast.Call) and isinstance(decorator.func, ast.Attribute)
            and decorator.func.attr == "register" and len(decorator.args) == 1
            and isinstance(decorator.args[0], ast.Constant) and decorator.args[0].value == name)


# every source this module reads is parsed here, each version of a file once: under the process's parse lock
# (rollscale/parsing.py), so that threads asking for one file at once wait for its first parse
def _parsed(path: Path) -> ast.Module:
    """``path``'s source parsed (read-only: the tree is shared by every caller of this version of the file)."""
    stat = path.stat()
    with PARSE_LOCK:
        return _parse_version(str(path), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=None)
def _parse_version(path: str, mtime_ns: int, size: int) -> ast.Module:
    """One version of a file parsed (its modification time and size key the cache)."""
    return ast.parse(Path(path).read_text(), filename=path)


def _decorated_names(path: Path) -> list[str]:
    """The names a module's top-level functions and classes register with a ``register("name")`` or
    ``<REGISTRY>.register("name")`` decorator, read from its source (nothing imported)."""
    out = []
    for node in _parsed(path).body:
        for d in getattr(node, "decorator_list", ()):
            if (isinstance(d, ast.Call) and len(d.args) == 1 and isinstance(d.args[0], ast.Constant)
                    and isinstance(d.args[0].value, str)
                    and (isinstance(d.func, ast.Attribute) and d.func.attr == "register"
                         or isinstance(d.func, ast.Name) and d.func.id == "register")):
                out.append(d.args[0].value)
    return out


class Registry(Generic[T]):
    """Names -> entries (functions or classes) of one kind.

    Args:
        kind: what an entry is, for messages ("allocation rule").
        plugins: dotted names of the packages (or modules) whose modules register entries.
        lazy: the entries a module's decorators name (read from its source), else one named after the module
            with ``_`` read as ``-``; ``skip`` lists modules of the package that are not entries (shared code).
    """

    def __init__(self, kind: str, plugins: Iterable[str] = (), lazy: bool = False, skip: Iterable[str] = ()) -> None:
        self.kind = kind
        self.plugins = tuple(plugins)
        self.lazy = lazy
        self.skip = frozenset(skip)
        self._entries: dict[str, T] = {}
        self._discovered = False

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: ``@REGISTRY.register("name")`` over the function or class that is the entry."""
        if not isinstance(name, str) or not name:
            raise RegistryError(f"{self.kind} name must be a non-empty string, got {name!r}")

        def decorator(obj: T) -> T:
            known = self._entries.get(name)
            if known is not None and known is not obj:
                raise RegistryError(f"{self.kind} {name!r} is registered twice ({_where(known)} and {_where(obj)})")
            self._entries[name] = obj
            return obj

        return decorator

    def _lazy_modules(self) -> dict[str, str]:
        """Entry name -> module of a lazy registry: the names its decorators register, read from its source (a
        module may register several: the forecast's forms), else the module's own name."""
        out: dict[str, str] = {}
        for package in self.plugins:
            for mod, path in _module_paths(package).items():
                short = mod.rsplit(".", 1)[1]
                if short not in self.skip:
                    for name in _decorated_names(path) or [short.replace("_", "-")]:
                        out.setdefault(name, mod)
        return out

    def _discover(self) -> None:
        if self._discovered or self.lazy:
            return
        self._discovered = True  # set first: a plugin module may look itself up while it loads
        try:
            for package in self.plugins:
                for module in _submodules(package):
                    importlib.import_module(module)
        except BaseException:
            self._discovered = False
            raise

    def names(self) -> tuple[str, ...]:
        """Every registered name, in registration order (a lazy registry: module order; it
        imports nothing to answer)."""
        if self.lazy:
            return tuple(dict.fromkeys([*self._lazy_modules(), *self._entries]))
        self._discover()
        return tuple(self._entries)

    def is_valid(self, name: object) -> bool:
        """Is ``name`` a registered name (a lazy registry imports nothing to answer)?"""
        return isinstance(name, str) and name in self.names()

    def get(self, name: str) -> T:
        """The entry called ``name``; an unknown name is an error naming the closest valid one."""
        if name not in self._entries:
            if self.lazy and isinstance(name, str) and name in (modules := self._lazy_modules()):
                importlib.import_module(modules[name])
                if name not in self._entries:
                    raise RegistryError(f"module {modules[name]} registers no {self.kind} {name!r}")
            else:
                self._discover()
        if name not in self._entries:
            valid = self.names()
            raise RegistryError(f"unknown {self.kind} {name!r}{closest_hint(name, valid)} "
                                f"(expected one of: {', '.join(valid)})")
        return self._entries[name]

    def check(self, name: str) -> str:
        """``name`` itself when valid (a pydantic field validator), else the error of :meth:`get`."""
        if not self.is_valid(name):
            self.get(name)  # raises, naming the closest
        return name

    def declared(self, name: str, attribute: str, default: Any = None) -> Any:
        """What the class a lazy registry registers as ``name`` states in its own body as ``attribute = <literal>``
        (``default`` where it states nothing), read from its module's source without importing it: params
        validation asks an entry this way, so it runs none of the entries' code, and a stage that only validates
        params depends on none of them. Each entry states its declarations itself (one it inherits is not read
        here; tests/test_registry.py checks they agree with the imported classes)."""
        if not self.lazy:
            raise RegistryError(f"{self.kind}: declarations are read only from a lazy registry's modules")
        self.check(name)
        module = self._lazy_modules()[name]
        path = next(iter(_module_paths(module).values()))
        for node in _parsed(path).body:
            if isinstance(node, ast.ClassDef) and any(_registers(d, name) for d in node.decorator_list):
                for stmt in node.body:
                    target = stmt.targets[0] if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 else \
                        stmt.target if isinstance(stmt, ast.AnnAssign) and stmt.value is not None else None
                    if isinstance(target, ast.Name) and target.id == attribute:
                        return ast.literal_eval(stmt.value)
                return default
        raise RegistryError(f"module {module} registers no {self.kind} {name!r} with a decorated class")

    def items(self) -> list[tuple[str, T]]:
        """(name, entry) of every entry (imports a lazy registry's every module)."""
        return [(name, self.get(name)) for name in self.names()]


def _where(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', type(obj).__name__)}"


# The packages the eager registries import on their first lookup, by dotted name. A literal:
# rollscale.pipeline.stages.deps reads it as imports of this module, so every stage that loads it
# (params validation does, and builds the sweep.rules schema from every rule's Params) depends on
# their folders. The lazy registries' packages are not here: their names are read from the folder
# without importing it, and an entry is loaded by code that names its package (the package's own
# ``__init__``, or a ``PLUGIN_PACKAGES`` literal of its own, as rollscale.core.search.decisions has),
# so only the stages that run that code depend on the package (base, profile and bucket never load a
# search method).
PLUGIN_PACKAGES = ("rollscale.core.grpo.rules", "rollscale.core.grpo.losses")
_RULES, _LOSSES = PLUGIN_PACKAGES

# The registries of the study (science §3, §4, §9.4; docs/architecture.md).
ALLOCATION_RULES: Registry = Registry("allocation rule", plugins=[_RULES])
ADVANTAGE_ESTIMATORS: Registry = Registry("advantage estimator", plugins=[_LOSSES])
POLICY_LOSSES: Registry = Registry("policy loss", plugins=[_LOSSES])
LOSS_AGGREGATIONS: Registry = Registry("loss aggregation", plugins=[_LOSSES])
SAMPLING_ENGINES: Registry = Registry("sampling engine", plugins=["rollscale.lm.engines"], lazy=True, skip=["base"])
SEARCH_METHODS: Registry = Registry("search method", plugins=["rollscale.core.search.methods"], lazy=True,
                                    skip=["base"])
# the forecast's shapes (science §11.2): one module of rollscale/core/fit/forms/ a form, named after it
FORECAST_FORMS: Registry = Registry("forecast form", plugins=["rollscale.core.fit.forms"], lazy=True)
