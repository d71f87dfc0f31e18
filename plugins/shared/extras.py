"""A built-in plugin's worker environment is the matching extra of accelbench's own distribution
(``pip install accelbench[tf]`` installs the same requirements into the host): one declaration,
in pyproject.toml. Read from installed metadata; no framework is imported."""

from __future__ import annotations

from importlib import metadata


def extra(name: str) -> tuple[str, ...]:
    """The requirements of accelbench's extra ``name``, without their markers."""
    from packaging.requirements import Requirement

    try:
        declared = metadata.requires("accelbench") or []
    except metadata.PackageNotFoundError:
        return ()
    found = []
    for text in declared:
        requirement = Requirement(text)
        if (
            requirement.marker is not None
            and requirement.marker.evaluate({"extra": name})
            and not requirement.marker.evaluate({"extra": ""})
        ):
            requirement.marker = None
            found.append(str(requirement))
    return tuple(found)
