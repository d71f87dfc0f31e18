"""Every hook accelbench calls, typed and documented.

A plugin is any module (or object) with functions marked ``@accelbench.hookimpl`` whose names
match the specs below. Built-in and third-party plugins are found the same way: through the
``accelbench`` entry-point group.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import pluggy

if TYPE_CHECKING:
    from accelbench.backend import Backend

hookspec = pluggy.HookspecMarker("accelbench")
hookimpl = pluggy.HookimplMarker("accelbench")


@hookspec
def register_backends(register: Callable[["Backend"], None]) -> None:
    """Register the backends this plugin provides.

    Called in the host each time the backends are listed, after plugins are loaded. Call
    ``register(backend)`` once per backend (a plugin may provide several, e.g. one per model
    variant). Must not import the plugin's framework: a backend describes itself without it, and
    travels to its worker process pickled. The return value is ignored.
    """
