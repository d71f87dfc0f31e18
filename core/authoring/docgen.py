"""Documentation made from the code and the schemas themselves, so a page cannot drift from them:
the hook table from ``hookspecs`` and the record format's field tables from ``schemas/``. The
docs' build calls these (``docs/hooks.py``); an undocumented hook or field shows as one."""

from __future__ import annotations

import inspect
from typing import Any

from accelbench import hookspecs
from accelbench.records import validation


def hooks() -> list[str]:
    """The names of every hook accelbench calls, in the order ``hookspecs`` declares them."""
    return [name for name, function in vars(hookspecs).items() if callable(function) and hasattr(function, "accelbench_spec")]


def hooks_table() -> str:
    rows = ["| hook | when it is called, and what it does |", "|---|---|"]
    for name in hooks():
        function = getattr(hookspecs, name)
        signature = f"{name}{inspect.signature(function)}"
        rows.append(f"| `{signature}` | {_one_line(inspect.getdoc(function) or '')} |")
    return "\n".join(rows) + "\n"


def schema_table(name: str) -> str:
    """The top-level fields of ``schemas/<name>.schema.json``: type, whether required, and the
    schema's own description of each."""
    schema = validation.load(name)
    required = set(schema.get("required", ()))
    rows = [
        f"`{schema['$id']}`: {schema.get('description', schema.get('title', ''))}",
        "",
        "| field | type | required | description |",
        "|---|---|---|---|",
    ]
    for field, spec in schema["properties"].items():
        rows.append(
            f"| `{field}` | {_type_of(spec)} | {'yes' if field in required else ''} | {_one_line(spec.get('description', ''))} |"
        )
    return "\n".join(rows) + "\n"


def _type_of(spec: dict[str, Any]) -> str:
    if "$ref" in spec:
        return f"`{spec['$ref'].rsplit('/', 1)[-1]}`"
    if "enum" in spec:
        return " \\| ".join(f"`{value}`" for value in spec["enum"])
    kinds = spec.get("type", "any")
    if isinstance(kinds, list):
        return " or ".join(kinds)
    if kinds == "array" and isinstance(spec.get("items"), dict):
        return f"array of {_type_of(spec['items'])}"
    if "oneOf" in spec or "anyOf" in spec:
        return " or ".join(_type_of(option) for option in spec.get("oneOf") or spec["anyOf"])
    return str(kinds)


def _one_line(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")
