"""The memory allocator a worker runs with: the C library's malloc, or one preloaded into the
worker process (``--allocator``).

Frameworks allocate and free tensors every step; a different malloc (jemalloc, tcmalloc) changes
how fast that is without changing the work, and it can only be chosen before the process starts,
through the dynamic loader's ``LD_PRELOAD``. So the host chooses it for each worker, and the worker
reports the allocator it actually has mapped, read from ``/proc/self/maps``.
"""

from __future__ import annotations

import ctypes.util
import functools
import os
import sys
from pathlib import Path

from .errors import UsageError

SYSTEM = "system"
#: the backend's measured choice (``BackendInfo.allocator``) when installed, else the system's
AUTO = "auto"
#: allocators known by name: the name ``ctypes.util.find_library`` looks up, and the Debian/Ubuntu
#: package that installs it (for the message when it is missing)
KNOWN = {"jemalloc": ("jemalloc", "libjemalloc2"), "tcmalloc": ("tcmalloc_minimal", "libtcmalloc-minimal4")}


def resolve(choice: str, preferred: str | None) -> str:
    """The allocator a backend's run gets: ``auto`` becomes the backend's preferred one when it is
    installed here, else the system's; any other choice stays as the user gave it."""
    if choice != AUTO:
        return choice
    return preferred if preferred and installed(preferred) else SYSTEM


def installed(name: str) -> bool:
    return name in KNOWN and _find_library(KNOWN[name][0]) is not None


@functools.cache
def _find_library(name: str) -> str | None:
    """The loader's name for lib``name``, or None; asked once per process (it runs ldconfig)."""
    return ctypes.util.find_library(name)


def missing_preference(preferred: str | None) -> str | None:
    """A warning for a record whose backend prefers an allocator this machine lacks, or None."""
    if not preferred or installed(preferred) or not sys.platform.startswith("linux"):
        return None
    return (f"this backend ran fastest with {preferred} where it was measured; it is not installed here, so the "
            f"workers used the system's malloc (install it, e.g. apt install {KNOWN[preferred][1]})")


def library(choice: str) -> str | None:
    """The library to preload for ``choice`` (a known name or a library's path), None for the
    system's malloc (and ``auto`` not yet resolved); UsageError, naming the field, when it cannot
    be had on this machine."""
    if choice in (SYSTEM, AUTO):
        return None
    if not sys.platform.startswith("linux"):
        raise UsageError(f"--allocator {choice}: preloading an allocator needs Linux's dynamic loader")
    if choice in KNOWN:
        name, package = KNOWN[choice]
        found = _find_library(name)
        if not found:
            raise UsageError(f"--allocator {choice}: lib{name} is not installed on this machine "
                             f"(e.g. apt install {package})")
        return found
    path = Path(choice)
    if not (path.is_absolute() and path.is_file()):
        raise UsageError(f"--allocator: {choice!r} is neither {', '.join([AUTO, SYSTEM, *KNOWN])} nor the absolute "
                         "path of a shared library")
    return str(path)


def worker_environment(choice: str) -> dict[str, str]:
    """Environment variables that give a worker the chosen allocator."""
    preload = library(choice)
    if preload is None:
        return {}
    return {"LD_PRELOAD": " ".join(p for p in (preload, os.environ.get("LD_PRELOAD", "")) if p)}


def loaded(maps: str = "/proc/self/maps") -> str:
    """The allocator this process runs with, read from its memory map: a known allocator's name
    and file, the preloaded library's file, or the system's malloc."""
    try:
        mapped = {line.split()[-1] for line in Path(maps).read_text().splitlines() if "/" in line}
    except OSError:
        return "unknown (no /proc/self/maps)"
    files = {Path(p).name: p for p in mapped}
    for choice, (name, _) in KNOWN.items():
        for file, path in files.items():
            if file.startswith(f"lib{name}.so"):
                return f"{choice} ({path})"
    preloaded = [p for p in os.environ.get("LD_PRELOAD", "").split() if p in mapped]
    if preloaded:
        return f"preloaded ({preloaded[0]})"
    return f"{SYSTEM} (the C library's malloc)"
