"""A plugin whose registrar raises: listed with its error, the others unharmed."""

import accelbench


@accelbench.hookimpl
def register_backends(register):
    raise RuntimeError("registrar exploded")
