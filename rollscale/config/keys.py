"""Where a key of ``params.yaml`` lives: the pydantic model that owns the field at an error's
location, through nested sections, lists, dicts and the tagged unions of ``sweep.rules``
(``sweep.rules.0.pods.keep``), so a bad key's message can list the valid ones there."""

from __future__ import annotations

from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _type_at(tp: Any, part: Any) -> Any:
    """The type one step into ``tp`` along an error location: a field of a model, an item of a
    list, a value of a dict, or the member of a tagged union (``sweep.rules.0.pods``)."""
    if get_origin(tp) is Annotated:
        return _type_at(get_args(tp)[0], part)
    if _is_model(tp):
        field = tp.model_fields.get(str(part))
        return None if field is None else field.annotation
    if get_origin(tp) in (list, tuple) and isinstance(part, int):
        return get_args(tp)[0]
    if get_origin(tp) is dict:
        return get_args(tp)[1]
    if get_origin(tp) in (Union, UnionType):  # the member whose Literal tag is ``part``
        for member in get_args(tp):
            if _is_model(member) and any(get_origin(f.annotation) is Literal and part in get_args(f.annotation)
                                         for f in member.model_fields.values()):
                return member
    return None


def model_at(model: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The pydantic model that owns the field at ``loc`` (for key suggestions)."""
    current: Any = model
    for part in loc:
        current = _type_at(current, part)
        if current is None:
            return None
    return current if _is_model(current) else None
