"""The busy-machine guard: how much of the machine's CPU time went to processes outside the run.

A comparison of two frameworks on a shared machine is only as good as the quiet it ran in. A
one-core CPU hog beside a 2-core run does not slow both sides alike: a framework whose OpenMP
threads wait for the slowest one suffers far more than one with a work-stealing pool (on a 2-core
Zen 3, 2026-12-05, one such pair's ratio went from 1.16 on the quiet machine to 0.57 beside the
hog). So the load is measured during every lockstep block, and a verdict resting on a busy block
is withheld.

The measure, Linux only: over an interval, the CPU time the kernel counted as busy on the CPUs
this process may run on (``/proc/stat``'s per-CPU lines: user, nice, system, irq, softirq and
steal -- steal is time the hypervisor gave this VM's CPU to another guest), less the CPU time of
the run's own process tree (``/proc/<pid>/stat``: user and system time of the host and every
worker, their reaped children included), as a share of those CPUs' capacity over the interval.
Where ``/proc`` cannot be read nothing is measured, and a record says so rather than show 0.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

#: a block in which other processes took more than this share of the run's CPUs is busy. On the
#: quiet 2-core Intel Xeon (AMX) VM of 2026-12-06 the foreign share of lockstep blocks stayed
#: at or below about 2% (the kernel's and the VM agent's own work; tick sampling); beside a
#: one-core hog it was about 50%. Ten per cent is far above the first and far below the second,
#: and a tenth of a core for a whole block is already enough to move a 3% verdict.
BUSY_SHARE = 0.10
#: how long the machine is watched, all sides parked, before a block when the run waits for quiet
#: (lockstep watches a fifth of it before a pair's first block and after a busy one)
QUIET_CHECK_S = 1.0

_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01
#: /proc/stat's per-CPU fields that count as busy: user nice system [idle iowait] irq softirq steal
_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)
_STEAL_FIELD = 7


@dataclass(frozen=True)
class CpuSnapshot:
    """Cumulative CPU seconds at one moment, on the run's CPUs."""

    at: float
    cpus: int
    busy_s: float
    steal_s: float
    own_s: float


@dataclass(frozen=True)
class Load:
    """What other processes took of the run's CPUs over an interval, as shares of their capacity."""

    foreign_share: float
    steal_share: float
    seconds: float

    @property
    def busy(self) -> bool:
        return is_busy(self.foreign_share)


def is_busy(foreign_share: float | None, limit: float = BUSY_SHARE) -> bool:
    """Whether other processes took more than ``limit`` of the CPUs (never, where it was not read)."""
    return foreign_share is not None and foreign_share > limit


def snapshot(root_pid: int | None = None) -> CpuSnapshot | None:
    """The counters now, for the process tree under ``root_pid`` (default: this process); None
    where ``/proc`` is not readable."""
    cpus = _allowed_cpus()
    try:
        busy, steal = _machine_busy(cpus)
    except (OSError, ValueError, IndexError):
        return None
    own = _tree_cpu_s(root_pid or os.getpid())
    if own is None:
        return None
    return CpuSnapshot(time.monotonic(), len(cpus), busy, steal, own)


def between(before: CpuSnapshot | None, after: CpuSnapshot | None) -> Load | None:
    """The foreign load from ``before`` to ``after`` (None where either was not read). The share
    is clipped at 0 from below only: tick-sampled machine time and the tree's own time disagree
    by a tick or two, and a negative load is that disagreement, not a measurement."""
    if before is None or after is None or after.at <= before.at:
        return None
    seconds = after.at - before.at
    capacity = seconds * after.cpus
    foreign = (after.busy_s - before.busy_s) - (after.own_s - before.own_s)
    return Load(max(0.0, foreign / capacity), max(0.0, (after.steal_s - before.steal_s) / capacity), seconds)


def watch(seconds: float = QUIET_CHECK_S, root_pid: int | None = None) -> Load | None:
    """The foreign load over the next ``seconds`` (this process sleeps meanwhile)."""
    before = snapshot(root_pid)
    time.sleep(seconds)
    return between(before, snapshot(root_pid))


def describe(load: Load) -> str:
    steal = f", {load.steal_share:.0%} of it stolen by the hypervisor" if load.steal_share >= 0.01 else ""
    return f"{load.foreign_share:.0%} of the CPU time went to other processes{steal}"


def _allowed_cpus() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def _machine_busy(cpus: list[int]) -> tuple[float, float]:
    """Busy and steal seconds, summed over ``cpus``, from ``/proc/stat``."""
    wanted = {f"cpu{n}" for n in cpus}
    busy = steal = 0
    found = 0
    with open("/proc/stat") as stat:
        for line in stat:
            name, _, rest = line.partition(" ")
            if name in wanted:
                ticks = [int(v) for v in rest.split()]
                busy += sum(ticks[i] for i in _BUSY_FIELDS if i < len(ticks))
                steal += ticks[_STEAL_FIELD] if len(ticks) > _STEAL_FIELD else 0
                found += 1
    if found != len(cpus):
        raise ValueError("/proc/stat lacks a line for some of this process's CPUs")
    return busy * _TICK_S, steal * _TICK_S


def _tree_cpu_s(root: int) -> float | None:
    """User and system seconds of ``root`` and every descendant (their reaped children included)."""
    from accelbench.execution.memwatch import tree_sum

    return tree_sum(root, _process_cpu_s)


def _process_cpu_s(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            text = stat.read()
    except OSError:
        return None
    # the command name may hold spaces and parentheses: the fields start after its last ')'
    fields = text[text.rindex(")") + 2 :].split()
    utime, stime, cutime, cstime = (int(fields[i]) for i in (11, 12, 13, 14))
    return (utime + stime + cutime + cstime) * _TICK_S
