"""What a run costs besides time: its memory, its energy and its start-up, as record blocks.

Each is read where it happens -- the worker's peak resident set and the framework's device peak
in the worker, the energy counters around the timed steps in the worker (``accelbench.execution.energy``),
the first step and the warm-up on the monotonic clock every process shares -- and summed up here
over a run's trials. A figure that could not be read is ``None`` with the reason beside it.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Protocol, Sequence

from accelbench.backend import DeviceMemory
from accelbench.execution.timing import StartupMarks, Timing
from accelbench.records.jsonform import omitted_while_none

#: joules in a kilowatt-hour
JOULES_PER_KWH = 3.6e6
HOST_SOURCE = "the worker process's peak resident set (getrusage ru_maxrss), from its start to its timed steps' end"


@dataclass
class Startup:
    """One trial's start-up. ``worker_to_first_step_s``: from the host starting the worker process
    to the end of its first step (interpreter, imports, the backend's check and prepare -- model
    build, data -- and the first step, where tracing, compilation and autotuning happen);
    ``first_step_s``: that first step alone; ``warmup_s``: the whole warm-up, first step included."""

    worker_to_first_step_s: float
    first_step_s: float
    warmup_s: float
    #: the framework's compilation of the step ahead of its first call (``Prepared.compile_s``)
    compile_s: float | None = omitted_while_none()

    @classmethod
    def of(cls, spawned: float, marks: StartupMarks | None, compile_s: float | None = None) -> Startup | None:
        """From the host's ``time.monotonic()`` when it started the worker, the worker's marks and
        what the backend said its compilation took."""
        if marks is None:
            return None
        return cls(
            marks.first_step_ended - spawned,
            marks.first_step_ended - marks.first_step_started,
            marks.warmup_ended - marks.warmup_started,
            compile_s,
        )


class Trial(Protocol):
    """What these figures read of a trial (``accelbench.records.results.TrialOutcome`` has it)."""

    status: str
    timing: Timing | None
    device_memory: DeviceMemory | None
    startup: Startup | None
    footprint_notes: dict[str, str] | None


@dataclass
class StartupSummary:
    """The median of the trials' start-up figures (each trial a fresh process), or why none."""

    worker_to_first_step_s: float | None
    first_step_s: float | None
    warmup_s: float | None
    trials: int
    reason: str | None = omitted_while_none()
    compile_s: float | None = omitted_while_none()


@dataclass
class Memory:
    """The largest peaks of the run's trials: the host's resident set and the framework's device
    memory, each with where it was read, or the reason it is missing."""

    host_peak_bytes: int | None
    host_source: str
    device_peak_bytes: int | None
    device_source: str | None
    device_reason: str | None = omitted_while_none()


@dataclass
class Energy:
    """Energy of the timed steps of every trial, from the machine's counters, per image and as
    images per kWh; or no figure and the reason."""

    joules: float | None
    joules_per_image: float | None
    images_per_kwh: float | None
    source: str | None
    reason: str | None = omitted_while_none()


def startup_of(outcomes: Sequence[Trial]) -> StartupSummary:
    found = [o.startup for o in outcomes if o.status == "ok" and o.startup is not None]
    if not found:
        return StartupSummary(None, None, None, 0, reason=_noted(outcomes, "startup", "no trial's start-up was timed"))

    def middle(name: str) -> float:
        return float(statistics.median(getattr(s, name) for s in found))

    compiled = [s.compile_s for s in found if s.compile_s is not None]
    return StartupSummary(
        middle("worker_to_first_step_s"),
        middle("first_step_s"),
        middle("warmup_s"),
        len(found),
        compile_s=statistics.median(compiled) if len(compiled) == len(found) else None,
    )


def memory_of(outcomes: Sequence[Trial]) -> Memory:
    ok = [o for o in outcomes if o.status == "ok" and o.timing is not None]
    hosts = [o.timing.usage.peak_resident_bytes for o in ok if o.timing and o.timing.usage and o.timing.usage.peak_resident_bytes]
    host = max(hosts) if hosts and len(hosts) == len(ok) else None
    host_source = (
        _noted(outcomes, "host_source", HOST_SOURCE)
        if host is not None
        else _noted(outcomes, "host_memory", "not read: this platform gives no peak resident set")
    )
    devices = [o.device_memory for o in ok if o.device_memory is not None]
    figures = [(d.peak_bytes, d.source) for d in devices if d.peak_bytes is not None]
    if figures and len(figures) == len(ok):
        peak, source = max(figures)
        return Memory(host, host_source, peak, source)
    reason = next((d.reason for d in devices if d.peak_bytes is None and d.reason), "") or _noted(
        outcomes, "device_memory", "the framework's device memory was not read"
    )
    return Memory(host, host_source, None, None, reason)


def energy_of(outcomes: Sequence[Trial], images: int | None) -> Energy:
    """The counters' joules over every ok trial's timed steps; none unless every trial has them."""
    uses = [o.timing.energy if o.timing else None for o in outcomes if o.status == "ok"]
    counted = [(u.joules, u.source) for u in uses if u is not None and u.joules is not None]
    if not uses or len(counted) != len(uses):
        reason = next((u.reason for u in uses if u is not None and u.joules is None and u.reason), "")
        return Energy(None, None, None, None, reason or _noted(outcomes, "energy", "the energy counters were not read"))
    joules = sum(j for j, _ in counted)
    per_image = joules / images if images else None
    per_kwh = JOULES_PER_KWH / per_image if per_image else None
    return Energy(joules, per_image, per_kwh, counted[0][1])


def _noted(outcomes: Sequence[Trial], what: str, default: str) -> str:
    """What a run notes about a figure (why a multi-worker run, a pytest-benchmark session or
    train mode has none, what a multi-worker figure sums), else ``default``."""
    return next((o.footprint_notes[what] for o in outcomes if o.footprint_notes and what in o.footprint_notes), default)
