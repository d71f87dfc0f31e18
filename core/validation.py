"""The JSON Schemas shipped in ``schemas/`` (package ``accelbench.schemas``), validators built once."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

from .errors import UsageError

RESULT_SCHEMA_VERSION = "1.12.0"  # 1.1: optional cost block; 1.2: train mode (mode, training);
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
#                                  1.12: trials' position (each round's order, read by compare)


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


def errors(name: str, document: Any) -> list[str]:
    """Readable messages, one per problem, each naming the exact field (JSON path) that is wrong."""
    found = sorted(validator(name).iter_errors(document), key=lambda e: list(e.absolute_path))
    return [f"{e.json_path}: {e.message}" for e in found]


def validate_or_raise(name: str, document: Any, what: str) -> None:
    problems = errors(name, document)
    if problems:
        more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        raise UsageError(f"invalid {what}: {problems[0]}{more}")
