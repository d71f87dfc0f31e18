"""accelbench: a multi-framework plugin benchmark suite for deep-learning training.

The public face for plugin authors: ``hookimpl``, the backend protocol and ``RunConfig``.
"""

from .backend import Backend, BackendInfo, Option, Prepared
from .config import RunConfig
from .hookspecs import hookimpl

__all__ = ["Backend", "BackendInfo", "Option", "Prepared", "RunConfig", "hookimpl"]
