"""Checks of a params file that the schema's types alone would let through.

- :func:`read_params_yaml`: the file is a non-empty YAML mapping with no key
  given twice (PyYAML keeps the last of two equal keys silently, so a typo'd
  copy of a section would override the first without a word).
- :func:`bool_for_number`: YAML's ``true`` / ``false`` where the schema wants
  a number (pydantic reads ``c_max: true`` as 1 in its lax mode). Applied to
  every field of every section by :class:`rollscale.config.sections._Section`,
  so no field is retyped by hand.
- :func:`model_path_problem`: ``model.name_or_path`` names a local model
  folder, or has the hub's ``org/name`` form; anything else would fail only
  when a later stage loads the model.

Plain functions: :mod:`rollscale.config` turns their findings into ``ParamsError``.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union, get_args, get_origin

import yaml
from pydantic import AfterValidator

__all__ = ["alias_problem", "bool_for_number", "model_path_problem", "read_params_yaml"]

# a Hugging Face hub repo id: "org/name" of letters, digits, '-', '_', '.' (huggingface_hub's rule)
HUB_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")
# files that make a folder something transformers (or peft) can load
MODEL_FILES = ("config.json", "adapter_config.json")


# ---------------------------------------------------------------------------- the YAML file


def _duplicate_key(node: yaml.Node, path: str = "") -> str | None:
    """``key (line a and line b)`` for the first key given twice in a mapping under ``node``."""
    if isinstance(node, yaml.MappingNode):
        seen: dict[Any, int] = {}
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            dotted = f"{path}.{key}" if path else str(key)
            line = key_node.start_mark.line + 1
            if key is not None and key != "<<":
                if key in seen:
                    return f"{dotted} is given twice (line {seen[key]} and line {line}); keep one"
                seen[key] = line
            found = _duplicate_key(value_node, dotted)
            if found:
                return found
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            found = _duplicate_key(item, f"{path}.{i}")
            if found:
                return found
    return None


# values a params file may hold once its aliases (*name) are expanded: a few hundred in a real one; nine levels
# of nine aliases (a "YAML bomb") expand to 387 million, which every reader of the values would walk for minutes
MAX_YAML_VALUES = 100_000


def _expanded_values(node: yaml.Node, sizes: dict[int, int]) -> int:
    """How many values ``node`` holds with every alias expanded (each shared node counted once per use, sizes
    kept by node: linear in the file); ValueError for an alias inside its own anchor."""
    if id(node) in sizes:
        if sizes[id(node)] < 0:
            raise ValueError("an alias (*name) refers to the value it is in: write the values out")
        return sizes[id(node)]
    sizes[id(node)] = -1
    children = ([n for pair in node.value for n in pair] if isinstance(node, yaml.MappingNode)
                else node.value if isinstance(node, yaml.SequenceNode) else [])
    sizes[id(node)] = 1 + sum(_expanded_values(n, sizes) for n in children)
    return sizes[id(node)]


def alias_problem(text: str) -> str | None:
    """What is wrong with the aliases of the YAML ``text`` (expanding past :data:`MAX_YAML_VALUES`, or into
    themselves), or None; the file is composed only (aliases are not expanded)."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return None  # the reader says what is wrong with the YAML
    try:
        values = _expanded_values(node, {}) if node is not None else 0
    except (ValueError, RecursionError) as err:
        return str(err) if isinstance(err, ValueError) else "its values nest too deep: write them out"
    if values > MAX_YAML_VALUES:
        return (f"its aliases (*name) expand to {values:,} values, more than the {MAX_YAML_VALUES:,} a params file "
                "may hold (a YAML bomb?): write the values out, or use fewer aliases")
    return None


def read_params_yaml(text: str) -> dict[str, Any]:
    """The mapping in a params file's ``text``; ValueError saying what is wrong (not YAML,
    empty, not a mapping, a key given twice, aliases that expand past :data:`MAX_YAML_VALUES`)."""
    if problem := alias_problem(text):
        raise ValueError(problem)
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        raw = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ValueError(f"not valid YAML: {err}") from None
    if raw is None:
        raise ValueError("the file is empty (or only comments): write the sections to change, "
                         "or `{}` for every default (`rollscale check --resolved` prints them)")
    if not isinstance(raw, dict):
        raise ValueError(f"expected a mapping of sections at the top level, got {type(raw).__name__}")
    duplicate = _duplicate_key(node)
    if duplicate:
        raise ValueError(duplicate)
    return raw


# ---------------------------------------------------------------------------- booleans for numbers


def _is_number_type(annotation: Any) -> bool:
    return annotation in (int, float)


def _alternatives(annotation: Any) -> tuple[Any, ...]:
    origin = get_origin(annotation)
    if origin is Union or origin is types.UnionType:
        return tuple(a for a in get_args(annotation) if a is not type(None))
    if origin is typing.Annotated:
        return _alternatives(get_args(annotation)[0])
    return (annotation,)


def bool_for_number(annotation: Any, value: Any, where: str = "") -> str | None:
    """Where (``""`` = the value itself, else ``.1``, ``.key``) a boolean stands for a number
    in ``value`` read for a field of type ``annotation``, or None.

    Walks lists, tuples, dicts and dataclasses (``data.tables`` entries);
    nested pydantic sections check their own fields."""
    alternatives = _alternatives(annotation)
    if isinstance(value, bool):
        wants_number = any(_is_number_type(a) for a in alternatives)
        takes_bool = any(a is bool or a is Any or get_origin(a) is Literal for a in alternatives)
        return where if wants_number and not takes_bool else None
    for alt in alternatives:
        origin, args = get_origin(alt), get_args(alt)
        if origin in (list, set, frozenset) and isinstance(value, (list, tuple)) and args:
            items = [(args[0], v) for v in value]
        elif origin is tuple and isinstance(value, (list, tuple)) and args:
            items = [(args[0] if args[-1] is Ellipsis else a, v) for a, v in zip(args, value)]
        elif origin is dict and isinstance(value, dict) and len(args) == 2:
            found = [bool_for_number(args[1], v, f"{where}.{k}") for k, v in value.items()]
            return next((f for f in found if f is not None), None)
        elif dataclasses.is_dataclass(alt) and isinstance(value, dict):
            hints = typing.get_type_hints(alt)
            found = [bool_for_number(hints[k], v, f"{where}.{k}") for k, v in value.items() if k in hints]
            return next((f for f in found if f is not None), None)
        else:
            continue
        for i, (item_type, item) in enumerate(items):
            found = bool_for_number(item_type, item, f"{where}.{i}")
            if found is not None:
                return found
        return None
    return None


# ---------------------------------------------------------------------------- the model


def model_path_problem(name_or_path: str, gguf_file: str | None = None) -> str | None:
    """Why ``name_or_path`` is neither a local model folder nor a hub id, or None.

    A path that exists must be a folder transformers can load (``config.json``,
    a peft ``adapter_config.json``, or the GGUF file named by ``gguf_file``).
    A name that does not exist is a hub id only in the hub's ``org/name`` form:
    a missing local folder is named as such, not sent to the hub."""
    path = Path(name_or_path).expanduser()
    if path.exists():
        if not path.is_dir():
            return (f"{name_or_path} is a file, not a model folder (give the folder; a GGUF file goes "
                    "in model.gguf_file)")
        if gguf_file and not (path / gguf_file).is_file():
            return f"{path / gguf_file} not found (model.gguf_file names a file in model.name_or_path)"
        if not gguf_file and not any((path / f).is_file() for f in MODEL_FILES):
            return f"{name_or_path} is a folder without {' or '.join(MODEL_FILES)}: not a model folder"
        return None
    if HUB_ID_RE.match(name_or_path) and ".." not in name_or_path and "--" not in name_or_path:
        return None
    return (f"{name_or_path} not found: neither a local model folder nor a hub id of the form "
            "org/name (e.g. Qwen/Qwen3-0.6B)")


def cron_problem(cron: str) -> str | None:
    """Why ``cron`` is no schedule Prefect runs, or None: Prefect's own validation (what ``serve`` and
    ``track --serve`` hand it). Prefect is imported here: loading it costs seconds, and only a set cron needs it."""
    from prefect.client.schemas.schedules import CronSchedule

    try:
        CronSchedule(cron=cron)
    except ValueError:
        return (f"expected a cron string of five fields (minute hour day month weekday), e.g. '0 3 * * *', or a "
                f"macro such as '@daily', got {cron!r}")
    return None


def _checked_cron(cron: str | None) -> str | None:
    if cron is not None and (problem := cron_problem(cron)):
        raise ValueError(problem)
    return cron


def _checked_deployment(name: str) -> str:
    if not name.strip() or "/" in name:  # runs are named "<flow>/<deployment>"
        raise ValueError(f"expected a non-empty deployment name without '/', got {name!r}")
    return name


# a served deployment's schedule (null: none) and name, as `rollscale serve` and `rollscale track --serve` take them
CronSchedule = Annotated[Optional[str], AfterValidator(_checked_cron)]
DeploymentName = Annotated[str, AfterValidator(_checked_deployment)]
