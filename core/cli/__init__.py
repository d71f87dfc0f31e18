"""The ``accelbench`` command: the click group and ``main`` (``app``), one module per command group
(``run``, ``train``, ``multihost``, ``results``, ``extend``), the options they share (``options``)
and the terminal's output (``console``)."""

from accelbench.cli import extend, multihost, results, run, train  # noqa: F401 - each registers its commands on the group
from accelbench.cli.app import cli as cli
from accelbench.cli.app import main as main
