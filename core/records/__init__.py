"""Records: the typed ``Record`` and results files (``results``), the blocks other rooms fill in
(``blocks``), memory/energy/start-up blocks (``footprint``), the one JSON boundary (``jsonform``) and
the schemas' validators (``validation``).

``accelbench.records.Record`` and ``accelbench.records.read_results`` (the documented paths) are
loaded from ``results`` on first use, so importing a small module of this package (``blocks``) does
not import the statistics behind ``results``.
"""

from __future__ import annotations

import importlib
from typing import Any

#: the names the docs import from ``accelbench.records`` (any other name is a sub-module or nothing)
DOCUMENTED = ("Record", "ResultsDocument", "read_results", "read_document", "write_results")


def __getattr__(name: str) -> Any:
    if name not in DOCUMENTED:
        raise AttributeError(f"module 'accelbench.records' has no attribute {name!r}")
    return getattr(importlib.import_module("accelbench.records.results"), name)
