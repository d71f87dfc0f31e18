"""Resident memory of a worker and its children, as the host watches it (``memory_limit_mb``).

Resident memory, not address space: frameworks reserve far more address space than they use
(a CUDA context alone reserves more than a machine's memory), so an address-space limit breaks
healthy runs while a resident one stops only a runaway (a corrupt input once grew a worker to
19.6 GB before the kernel's OOM killer took it). Linux ``/proc``; elsewhere nothing is watched.
"""

from __future__ import annotations

import os
from typing import Callable

#: train mode's default limit per worker, as a share of this machine's memory
TRAIN_DEFAULT_SHARE = 0.75


def tree_rss_mb(pid: int) -> float | None:
    """Resident MB of ``pid`` and every descendant (data-loader workers...), or None if unreadable."""
    kb = tree_sum(pid, _rss_kb)
    return None if kb is None else kb / 1024


def tree_sum(pid: int, read: Callable[[int], float | None]) -> float | None:
    """``read(p)`` summed over ``pid`` and every descendant; None when ``pid`` itself cannot be read
    (a descendant that ended between the listing and the read counts nothing)."""
    total, pending, seen = 0.0, [pid], set()
    while pending:
        current = pending.pop()
        if current in seen:
            continue
        seen.add(current)
        value = read(current)
        if value is None:
            if current == pid:
                return None
            continue
        total += value
        pending.extend(children(current))
    return total


def _rss_kb(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return 0  # a zombie has no VmRSS line


def children(pid: int) -> list[int]:
    """The processes ``pid``'s threads started (Linux ``/proc``; none where unreadable)."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as children:
                found += [int(child) for child in children.read().split()]
        except OSError:
            pass
    return found


def machine_memory_mb() -> float | None:
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def default_train_limit_mb() -> int | None:
    """Train mode's limit when the user gives none: a share of this machine's memory."""
    total = machine_memory_mb()
    return int(total * TRAIN_DEFAULT_SHARE) if total else None
