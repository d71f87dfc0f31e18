"""accelbench: a multi-framework plugin benchmark suite for deep-learning training.

The public face for plugin authors is ``accelbench.api`` (versioned: ``PLUGIN_API``); its names
are re-exported here, so ``import accelbench`` and ``accelbench.Backend`` work as well.
"""

from accelbench.api import *  # noqa: F401,F403
from accelbench.api import __all__  # noqa: F401
