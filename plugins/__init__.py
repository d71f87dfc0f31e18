"""accelbench's built-in plugins, one package each, registered by entry point like any third-party
plugin; what they share is in ``accelbench.plugins.shared``.

``accelbench.plugins.model_specs``, which the docs offered to any plugin before the shared package
existed, stays importable there: it is the same module as ``accelbench.plugins.shared.model_specs``.
"""

import importlib
import sys

sys.modules[f"{__name__}.model_specs"] = importlib.import_module(f"{__name__}.shared.model_specs")
