"""The one JSON boundary of typed data: ``to_json`` turns a dataclass (and what it holds) into
the JSON form files keep, ``from_json`` reads that form back into the dataclass, driven by its
type hints. Written, read and written again, a document comes out byte-identical.

Field metadata this room reads:

- ``json_name``: the key where the field's name cannot be one (``global``)
- ``omit_if_none``: the key is left out while the field is None (optional in the schema, not
  nullable); a key absent from older files reads as None
- ``rest``: a ``dict`` field holding the keys no other field declares (an object whose schema
  allows more properties), written after the declared ones
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from functools import cache
from importlib import resources
from typing import Any, TypeVar, Union

T = TypeVar("T")


def to_object(value: Any) -> dict[str, Any]:
    """The JSON object of a dataclass."""
    form = to_json(value)
    if not isinstance(form, dict):
        raise FormError(f"{type(value).__name__} is not a dataclass: its JSON form is no object")
    return form


def omitted_while_none() -> Any:
    """A field the JSON form leaves out while it is None (optional in the schema, not nullable)."""
    return dataclasses.field(default=None, metadata={"omit_if_none": True})


def the_rest() -> Any:
    """A field that keeps an object's undeclared keys, in their order."""
    return dataclasses.field(default_factory=dict, metadata={"rest": True})


def to_json(value: Any) -> Any:
    """The JSON form of a dataclass or any part of it: a dataclass becomes an object, a tuple a list."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        form: dict[str, Any] = {}
        for f in dataclasses.fields(value):
            item = getattr(value, f.name)
            if f.metadata.get("rest"):
                form.update(to_json(item))
            elif not (f.metadata.get("omit_if_none") and item is None):
                form[f.metadata.get("json_name", f.name)] = to_json(item)
        return form
    if isinstance(value, (list, tuple)):
        return [to_json(item) for item in value]
    if isinstance(value, dict):
        return {key: to_json(item) for key, item in value.items()}
    return value


def read_shipped(kind: type[T], name: str) -> T:
    """A data file accelbench ships (``accelbench/data/NAME``) read into ``kind``."""
    document = json.loads(resources.files("accelbench").joinpath(f"data/{name}").read_text())
    return from_json(kind, document, f"data/{name}")


class FormError(ValueError):
    """A JSON document does not have the shape of the type it is read into."""


def from_json(kind: type[T], form: Any, where: str = "") -> T:
    """``form`` read into ``kind`` (a dataclass, or a list/dict/tuple/union of what it holds).
    Numbers are kept as written (an int in a float field stays an int), so that writing them again
    gives the same text. FormError names the key path of anything that does not fit."""
    read: T = _read(kind, form, where or kind.__name__)
    return read


def _read(kind: Any, form: Any, where: str) -> Any:
    if kind is Any or kind is object:
        return form
    origin = typing.get_origin(kind)
    if origin in (Union, types.UnionType):
        return _read_union(typing.get_args(kind), form, where)
    if dataclasses.is_dataclass(kind):
        return _read_dataclass(kind, form, where)
    if origin in (list, tuple) or kind in (list, tuple):
        return _read_sequence(kind, origin or kind, form, where)
    if origin is dict or kind is dict:
        _expect(isinstance(form, dict), where, "an object", form)
        value_kind = (typing.get_args(kind) or (str, Any))[1]
        return {key: _read(value_kind, item, f"{where}.{key}") for key, item in form.items()}
    if kind is float:
        _expect(isinstance(form, (int, float)) and not isinstance(form, bool), where, "a number", form)
        return form
    if kind in (int, str, bool):
        _expect(isinstance(form, kind) and (kind is bool or not isinstance(form, bool)), where, kind.__name__, form)
        return form
    raise FormError(f"{where}: cannot read a {kind!r}")


def _read_union(options: tuple[Any, ...], form: Any, where: str) -> Any:
    if form is None:
        _expect(type(None) in options, where, "a value", form)
        return None
    problems = []
    for option in (o for o in options if o is not type(None)):
        try:
            return _read(option, form, where)
        except FormError as exc:
            problems.append(str(exc))
    raise FormError(problems[0])


def _read_sequence(kind: Any, origin: type, form: Any, where: str) -> Any:
    _expect(isinstance(form, list), where, "a list", form)
    args = typing.get_args(kind)
    if origin is tuple and args and args[-1] is not Ellipsis:
        _expect(len(form) == len(args), where, f"{len(args)} items", form)
        return tuple(_read(a, item, f"{where}[{i}]") for i, (a, item) in enumerate(zip(args, form)))
    item_kind = args[0] if args else Any
    items = [_read(item_kind, item, f"{where}[{i}]") for i, item in enumerate(form)]
    return tuple(items) if origin is tuple else items


def _read_dataclass(kind: Any, form: Any, where: str) -> Any:
    _expect(isinstance(form, dict), where, "an object", form)
    hints, fields = _hints(kind), dataclasses.fields(kind)
    declared = {f.metadata.get("json_name", f.name): f for f in fields if not f.metadata.get("rest")}
    rest = next((f for f in fields if f.metadata.get("rest")), None)
    unknown = [key for key in form if key not in declared]
    if unknown and rest is None:
        raise FormError(f"{where}: unexpected key {unknown[0]!r}")
    values: dict[str, Any] = {}
    for key, f in declared.items():
        if key in form:
            values[f.name] = _read(hints[f.name], form[key], f"{where}.{key}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise FormError(f"{where}: missing key {key!r}")
    if rest is not None:
        values[rest.name] = {key: form[key] for key in unknown}
    return kind(**values)


@cache
def _hints(kind: type) -> dict[str, Any]:
    return typing.get_type_hints(kind)


def _expect(ok: bool, where: str, what: str, form: Any) -> None:
    if not ok:
        raise FormError(f"{where}: expected {what}, got {type(form).__name__} {str(form)[:60]!r}")
