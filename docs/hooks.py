"""MkDocs hooks: the pages' generated parts, made at build time from the project's own files.

``<!-- accelbench:evidence DIR -->`` becomes the tables of the results files under DIR
(``accelbench report --evidence DIR --markdown``), ``<!-- accelbench:schema NAME -->`` the field
table of ``schemas/NAME.schema.json``, and ``<!-- accelbench:hooks -->`` the table of every hook
in ``accelbench.hookspecs``. A results file that cannot stand as evidence fails the build with
its path named.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from accelbench.analysis import evidence
from accelbench.authoring import docgen

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"<!-- accelbench:(evidence|schema|hooks)\s*(\S*)\s*-->")


def on_startup(command, dirty):
    """The API reference's collector (griffe) searches ``sys.path`` for ``accelbench``; run as the
    ``mkdocs`` script, ``sys.path[0]`` is the scripts folder, where the ``accelbench`` command would
    be taken for the package. The package itself is found through its installation."""
    scripts = Path(sys.argv[0]).resolve().parent
    sys.path[:] = [entry for entry in sys.path if Path(entry or ".").resolve() != scripts]


def on_page_markdown(markdown: str, page, config, files) -> str:
    return MARKER.sub(_generated, markdown)


def _generated(match: re.Match) -> str:
    kind, argument = match.groups()
    if kind == "evidence":
        folder = ROOT / argument
        return evidence.markdown(evidence.load(folder), folder)
    if kind == "schema":
        return docgen.schema_table(argument)
    return docgen.hooks_table()
