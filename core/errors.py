"""Errors the CLI turns into one clear line and exit code 2."""


class UsageError(Exception):
    """Bad input from the user: unknown plugin, bad batch, malformed file. Nothing is written."""
