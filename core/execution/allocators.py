"""The memory allocator a worker runs with: the C library's malloc, or one preloaded into the
worker process (``--allocator``).

Frameworks allocate and free tensors every step; a different malloc (jemalloc, tcmalloc) changes
how fast that is without changing the work, and it can only be chosen before the process starts,
through the dynamic loader's ``LD_PRELOAD``. So the host chooses it for each worker, and the worker
reports the allocator it actually has mapped, read from ``/proc/self/maps``.

The allocator also decides whether the memory it maps may be backed by transparent huge pages
(``--huge-pages``): where the kernel's THP mode is "madvise", only memory marked with
``MADV_HUGEPAGE`` gets 2 MiB pages, and glibc's malloc and jemalloc mark theirs when a tunable
asks them to. A 2 MiB page is one page fault and one TLB entry instead of 512. The worker's trials
record how much of its memory the kernel did back with them.
"""

from __future__ import annotations

import ctypes.util
import functools
import os
import sys
from pathlib import Path
from typing import Mapping

from accelbench.errors import UsageError

SYSTEM = "system"
#: the backend's measured choice (``BackendInfo.allocator``) when installed, else the system's
AUTO = "auto"
#: allocators known by name: the name ``ctypes.util.find_library`` looks up, and the Debian/Ubuntu
#: package that installs it (for the message when it is missing)
KNOWN = {"jemalloc": ("jemalloc", "libjemalloc2"), "tcmalloc": ("tcmalloc_minimal", "libtcmalloc-minimal4")}

#: ``--huge-pages``: on, off, or auto (the backend's measured choice, where it can be had)
ON, OFF = "on", "off"
HUGE_PAGE_CHOICES = (AUTO, ON, OFF)
#: how each allocator is told to mark the memory it maps MADV_HUGEPAGE: the environment variable
#: it reads its tunables from, the setting, and how settings are joined there (glibc >= 2.35)
HUGE_PAGE_TUNABLES = {SYSTEM: ("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1", ":"), "jemalloc": ("MALLOC_CONF", "thp:always", ",")}
GLIBC_HUGETLB_SINCE = (2, 35)
THP_MODE_FILE = "/sys/kernel/mm/transparent_hugepage/enabled"


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


def missing_preference(preferred: str | None, device: str = "cpu") -> str | None:
    """A warning for a record whose backend prefers an allocator this machine lacks, or None.
    None on an accelerator too: the preference was measured training on a CPU, where the
    framework's own tensors come from malloc; on a GPU they come from the framework's device
    allocator, and nothing was measured there that the advice could rest on."""
    if not preferred or installed(preferred) or not sys.platform.startswith("linux") or device != "cpu":
        return None
    return (
        f"this backend ran fastest with {preferred} where it was measured; it is not installed here, so the "
        f"workers used the system's malloc (install it, e.g. apt install {KNOWN[preferred][1]})"
    )


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
            raise UsageError(f"--allocator {choice}: lib{name} is not installed on this machine (e.g. apt install {package})")
        return found
    path = Path(choice)
    if not (path.is_absolute() and path.is_file()):
        raise UsageError(
            f"--allocator: {choice!r} is neither {', '.join([AUTO, SYSTEM, *KNOWN])} nor the absolute path of a shared library"
        )
    return str(path)


def worker_environment(choice: str, huge_pages: str = OFF) -> dict[str, str]:
    """Environment variables that give a worker the chosen allocator, asked to map its memory in
    transparent huge pages when ``huge_pages`` is on."""
    preload = library(choice)
    env = {} if preload is None else {"LD_PRELOAD": " ".join(p for p in (preload, os.environ.get("LD_PRELOAD", "")) if p)}
    if huge_pages == ON:
        problem = huge_pages_problem(choice)
        if problem:
            raise UsageError(problem)
        variable, setting, separator = HUGE_PAGE_TUNABLES[choice]
        env[variable] = separator.join(s for s in (os.environ.get(variable, ""), setting) if s)
    return env


def thp_mode(path: str = THP_MODE_FILE) -> str | None:
    """The kernel's transparent huge page mode (always, madvise, never), the word it brackets in
    sysfs; None where there is no such file (another OS, a kernel without THP)."""
    try:
        text = Path(path).read_text()
    except OSError:
        return None
    start, end = text.find("["), text.find("]")
    return text[start + 1 : end] if 0 <= start < end else None


def huge_pages_problem(allocator: str) -> str | None:
    """Why ``--huge-pages on`` cannot be had with ``allocator`` on this machine, or None."""
    return huge_pages_problem_with(allocator, thp_mode(), _glibc())


def huge_pages_problem_with(allocator: str, mode: str | None, glibc: str) -> str | None:
    """Why huge pages cannot be had with ``allocator`` under the kernel's THP ``mode`` (None: the
    kernel has none) and C library ``glibc`` (``os.confstr``'s "glibc 2.36"; "" for another)."""
    if mode in (None, "never"):
        return f"--huge-pages on: this kernel gives no transparent huge pages ({THP_MODE_FILE}: {mode or 'absent'})"
    if allocator not in HUGE_PAGE_TUNABLES:
        return (
            f"--huge-pages on: the allocator {allocator!r} has no setting accelbench knows for "
            f"transparent huge pages (it has one for {', '.join(HUGE_PAGE_TUNABLES)})"
        )
    if allocator == SYSTEM:
        version = tuple(int(part) for part in glibc.split()[-1].split(".")[:2]) if glibc.startswith("glibc ") else ()
        if version < GLIBC_HUGETLB_SINCE:
            return (
                f"--huge-pages on: the C library here ({glibc or 'not glibc'}) has no glibc.malloc.hugetlb "
                f"tunable (glibc {'.'.join(map(str, GLIBC_HUGETLB_SINCE))} or later has)"
            )
    return None


def resolve_huge_pages(choice: str, preferred: bool, allocator: str) -> str:
    """on or off for a backend's run: ``auto`` becomes on where the backend measured a win with them
    and this machine and allocator can give them; on and off stay as the user gave them."""
    if choice != AUTO:
        return choice
    return ON if preferred and huge_pages_problem(allocator) is None else OFF


def huge_pages_setting(allocator: str, environ: Mapping[str, str] | None = None) -> str:
    """The record's account of huge pages, read from the worker's own environment (whether its
    allocator was asked for them, by the host or by the user) and from the kernel's mode."""
    found = os.environ if environ is None else environ
    variable, setting, separator = HUGE_PAGE_TUNABLES.get(allocator, (None, None, None))
    if variable is not None and setting in found.get(variable, "").split(separator):
        state, how = ON, f"{variable} has {setting}"
    else:
        state, how = OFF, "the allocator is not asked for them"
    mode = thp_mode()
    kernel = {
        None: "this kernel has no transparent huge pages",
        "always": "the kernel's THP mode: always, which backs any large enough mapping with them",
    }.get(mode, f"the kernel's THP mode: {mode}")
    return f"{state} ({how}; {kernel})"


def huge_page_bytes(smaps: str = "/proc/self/smaps_rollup") -> int | None:
    """This process's anonymous memory backed by transparent huge pages now, in bytes; None where
    the kernel does not say."""
    try:
        for line in Path(smaps).read_text().splitlines():
            if line.startswith("AnonHugePages:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _glibc() -> str:
    try:
        return os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (AttributeError, ValueError, OSError):  # not glibc, or not a POSIX system
        return ""


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
