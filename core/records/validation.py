"""The JSON Schemas shipped in ``schemas/`` (package ``accelbench.schemas``), validators built once."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any, Callable

from accelbench.errors import UsageError

RESULT_SCHEMA_VERSION = "1.14.0"  # 1.1: optional cost block; 1.2: train mode (mode, training);
#                                  1.3: interleaved schedule (schedule, trial round/times, trend);
#                                  1.4: model, variant, precision, device kind and engine are any
#                                  identifier a plugin declares (were closed lists);
#                                  1.5: distributed.network (loopback-only namespace or not);
#                                  1.6: trials' process usage (CPU user/system, page faults);
#                                  1.7: environment.memory_returned_to_host (VM free page reporting);
#                                  1.8: trials' process.anon_huge_pages_bytes (transparent huge pages);
#                                  1.9: lockstep schedule (trials' blocks with the machine's foreign
#                                  load, schedule.lockstep), schedule.looks and .confidence;
#                                  1.10: throughput.ci_method "t-interval on log trial rates",
#                                  environment.worker.plugin (the plugin distribution an environment holds);
#                                  1.11: memory, energy and startup blocks, trials' startup and energy_j,
#                                  process.peak_resident_bytes;
#                                  1.12: trials' position (each round's order, read by compare);
#                                  1.13: schedule.spending (repeated intervals over the looks),
#                                  schedule.lockstep.time and .efficiency; environment.worker read
#                                  in the worker on every path (host kind included);
#                                  1.14: train mode's timeline (training.run_start_unix_s, init_s,
#                                  the curve's started_s/trained_s/eval_started_s), the splits'
#                                  sizes and training.mlperf (the MLPerf log and its checks)


@cache
def load(name: str) -> dict[str, Any]:
    """The schema document ``schemas/<name>.schema.json``."""
    text = resources.files("accelbench.schemas").joinpath(f"{name}.schema.json").read_text()
    schema: dict[str, Any] = json.loads(text)
    return schema


@cache
def validator(name: str) -> Any:  # a jsonschema Validator (its classes are made at run time)
    """A format-checking draft 2020-12 validator for schema ``name``, built once per process."""
    import jsonschema
    from referencing import Registry, Resource

    schema = load(name)
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    registry = Registry().with_resources((doc["$id"], Resource.from_contents(doc)) for doc in map(load, _all_names()))
    return cls(schema, registry=registry, format_checker=cls.FORMAT_CHECKER)


def _all_names() -> list[str]:
    folder = resources.files("accelbench.schemas")
    return sorted(p.name.removesuffix(".schema.json") for p in folder.iterdir() if p.name.endswith(".schema.json"))


def errors(name: str, document: Any, names: Callable[[tuple[str | int, ...]], str | None] | None = None) -> list[str]:
    """Readable messages, one per problem, each naming the exact field that is wrong: its JSON
    path, or what ``names`` calls it (a command-line flag) with the rule it breaks."""
    found = sorted((_deepest(e) for e in validator(name).iter_errors(document)), key=lambda e: list(e.absolute_path))
    messages = []
    for error in found:
        called = names(tuple(error.absolute_path)) if names else None
        messages.append(f"{called} {_rule(error)}" if called else f"{error.json_path}: {error.message}")
    return messages


def validate_or_raise(
    name: str, document: Any, what: str, names: Callable[[tuple[str | int, ...]], str | None] | None = None
) -> None:
    problems = errors(name, document, names)
    if problems:
        more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        raise UsageError(f"invalid {what}: {problems[0]}{more}")


def _deepest(error: Any) -> Any:
    """The error that names the field: a value that matched no branch of a ``oneOf``/``anyOf``
    (an object, or null for "not given") is reported by the branch that came closest (its
    deepest error), not as the whole value failing every branch."""
    if not error.context:
        return error
    closest = max(error.context, key=lambda e: (len(e.absolute_path), e.validator != "type"))
    return _deepest(closest)


#: jsonschema's keywords as a rule a user can act on
_RULES: dict[str, Callable[[Any, Any], str]] = {
    "minimum": lambda limit, value: f"must be at least {limit:g} (got {value!r})",
    "exclusiveMinimum": lambda limit, value: f"must be more than {limit:g} (got {value!r})",
    "maximum": lambda limit, value: f"must be at most {limit:g} (got {value!r})",
    "exclusiveMaximum": lambda limit, value: f"must be less than {limit:g} (got {value!r})",
    "enum": lambda allowed, value: f"must be one of {', '.join(map(str, allowed))} (got {value!r})",
    "type": lambda kind, value: f"must be {' or '.join(kind) if isinstance(kind, list) else kind} (got {value!r})",
    "minLength": lambda limit, value: f"must have at least {limit} character(s) (got {value!r})",
    "minItems": lambda limit, value: f"must have at least {limit} item(s) (got {value!r})",
    "pattern": lambda pattern, value: f"must match {pattern} (got {value!r})",
}


def _rule(error: Any) -> str:
    rule = _RULES.get(error.validator)
    return rule(error.validator_value, error.instance) if rule else f"is not valid: {error.message}"
