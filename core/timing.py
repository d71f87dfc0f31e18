"""The one timing loop, shared by every backend. It runs inside the worker process.

Warm-up steps are excluded. The timed region is read with ``perf_counter`` at every step
boundary; every ``step()`` returns only after the device has finished, so each boundary is a
device sync. The wall time of the timed region is the sum of contiguous step intervals, so
throughput = images in the timed steps / that wall time (never an average of per-step rates).

How many steps: a run either counts them (the tf_cnn_benchmarks protocol: a fixed warm-up, then
a fixed number of timed steps) or boxes them in time, so that one command takes about as long on
a fast CPU as on one that emulates the precision in software:

- warm-up ``stable``: ends once the last ``STABLE_WINDOW`` step times lie within
  ``STABLE_SPREAD`` of their median (first-step compilation, allocator growth and cache warm-up
  are over, as pyperf and pytest-benchmark calibrate), or at the cap of ``warmup_steps`` steps, or,
  in a time-boxed run, once it has used half the time box;
- timed ``time box``: whole steps until the box is spent (at least ``MIN_TIMED_CALLS``); the last
  step ends past the box by less than one step, and it is counted in full, so the figure is exact.
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from .energy import EnergyUse, Meter
from .jsonform import omitted_while_none

if TYPE_CHECKING:
    from .config import RunConfig

#: progress is reported at most this often, so reporting costs nothing measurable
PROGRESS_INTERVAL_S = 1.0
STABLE_WINDOW = 3
STABLE_SPREAD = 0.05
#: a time-boxed run times at least this many calls, however long one takes: an interval needs two
MIN_TIMED_CALLS = 2
#: the share of the time box a stable warm-up may use at most
WARMUP_SHARE_OF_BOX = 0.5


@dataclass(frozen=True)
class TimingPlan:
    """How many calls to warm up and time, in whole calls of ``steps_per_call`` steps."""

    warmup_calls: int
    stable_warmup: bool = False
    timed_calls: int | None = None
    time_box_s: float | None = None
    steps_per_call: int = 1

    @classmethod
    def from_config(cls, config: RunConfig, steps_per_call: int) -> "TimingPlan":
        """The plan of a resolved RunConfig: its warm-up rule and step count or time box."""

        def whole(steps: int) -> int:
            return math.ceil(steps / steps_per_call)

        return cls(
            warmup_calls=whole(config.warmup_steps),
            stable_warmup=config.warmup == "stable",
            timed_calls=whole(config.timed_steps) if config.timed_steps else None,
            time_box_s=config.time_s,
            steps_per_call=steps_per_call,
        )

    @property
    def warmup_time_cap_s(self) -> float | None:
        return self.time_box_s * WARMUP_SHARE_OF_BOX if self.time_box_s else None


@dataclass(frozen=True)
class ProcessUsage:
    """CPU seconds of every thread of the process, in user and kernel mode, and minor page faults
    (pages the kernel had to map: memory an allocator gave back and takes again is zeroed anew):
    where a step's time goes besides the framework's own kernels. Beside them, how much of the
    process's memory was in transparent huge pages at the end (a level, not a count)."""

    cpu_user_s: float
    cpu_system_s: float
    minor_page_faults: int
    #: left out of the record while None (``jsonform.to_json``): the kernel did not say
    anon_huge_pages_bytes: int | None = omitted_while_none()
    #: the process's peak resident set since it started (``ru_maxrss``), read at the end: a level
    peak_resident_bytes: int | None = omitted_while_none()

    @classmethod
    def now(cls) -> ProcessUsage | None:
        try:
            import resource
        except ImportError:  # Windows
            return None
        usage = resource.getrusage(resource.RUSAGE_SELF)
        # kilobytes on Linux, bytes on macOS
        peak = usage.ru_maxrss * (1 if sys.platform == "darwin" else 1024)
        return cls(usage.ru_utime, usage.ru_stime, usage.ru_minflt, peak_resident_bytes=peak or None)

    @classmethod
    def summed(cls, usages: list[ProcessUsage | None]) -> ProcessUsage | None:
        """Several phases of one process (lockstep's blocks, train mode's epochs): their counters
        added, the levels as the last phase left them (None where a phase has none)."""
        known = [u for u in usages if u is not None]
        if not usages or len(known) != len(usages):
            return None
        return cls(
            sum(u.cpu_user_s for u in known),
            sum(u.cpu_system_s for u in known),
            sum(u.minor_page_faults for u in known),
            known[-1].anon_huge_pages_bytes,
            known[-1].peak_resident_bytes,
        )

    @classmethod
    def since(cls, before: ProcessUsage | None) -> ProcessUsage | None:
        """The counters' growth since ``before``, and the huge pages now (read once, at the end)."""
        from .allocators import huge_page_bytes

        after = cls.now()
        if before is None or after is None:
            return None
        return cls(
            after.cpu_user_s - before.cpu_user_s,
            after.cpu_system_s - before.cpu_system_s,
            after.minor_page_faults - before.minor_page_faults,
            huge_page_bytes(),
            after.peak_resident_bytes,
        )


@dataclass(frozen=True)
class StartupMarks:
    """``time.monotonic()`` in the worker at the first step's start and end and at the warm-up's
    start and end. On Linux that clock is one for every process of the machine, so the host sets
    them against its own reading from when it started the worker (``footprint.Startup``)."""

    warmup_started: float
    first_step_started: float
    first_step_ended: float
    warmup_ended: float


class _FirstCall:
    """``step``, noting when its first call started and ended."""

    def __init__(self, step: Callable[[], float | None]):
        self.step = step
        self.started: float | None = None
        self.ended: float | None = None

    def __call__(self) -> float | None:
        if self.started is not None:
            return self.step()
        self.started = time.monotonic()
        loss = self.step()
        self.ended = time.monotonic()
        return loss


@dataclass
class Timing:
    #: seconds per training step (a call's time / steps_per_call), one value per timed call
    step_times: list[float]
    wall_time_s: float
    timed_calls: int
    steps_per_call: int
    #: loss per timed call when the backend returns one; None where it was NaN/inf
    losses: list[float | None] = field(default_factory=list)
    warmup_calls: int = 0
    #: how the warm-up and the timed phase were ended, for the record
    warmup_rule: str = ""
    timed_rule: str = ""
    #: what the timed calls cost this process besides wall time; None where the platform cannot say
    usage: ProcessUsage | None = None
    #: the energy counters' advance over the timed calls (None: no meter was asked for)
    energy: EnergyUse | None = None
    #: when the process's first step and its warm-up ran (None for blocks of a warm worker)
    startup: StartupMarks | None = None

    @property
    def timed_steps(self) -> int:
        return self.timed_calls * self.steps_per_call


def run_timed(
    step: Callable[[], float | None],
    plan: TimingPlan,
    progress: Callable[[str, int, int | None], None] | None = None,
    meter: Meter | None = None,
    first_steps: bool = False,
) -> Timing:
    """Warm up, then time calls of ``step`` as ``plan`` says; per-step times and the region's wall
    time, the energy ``meter`` counted over it, and (``first_steps``: these are the process's first
    calls of ``step``) when the first step and the warm-up ran."""
    report = _throttled(progress)
    first = _FirstCall(step)
    step = first if first_steps else step
    warmup_started = time.monotonic()
    warmup_calls, warmup_rule = warm_up(step, plan, report)
    warmup_ended = time.monotonic()
    usage_before = ProcessUsage.now()
    energy_before = meter.read() if meter else None
    marks = [time.perf_counter()]
    losses: list[float | None] = []
    deadline = marks[0] + plan.time_box_s if plan.time_box_s else None
    while _more(len(marks) - 1, plan, deadline, marks[-1]):
        loss = step()
        marks.append(time.perf_counter())
        if loss is not None:
            losses.append(_finite_or_none(loss))
        report("timed", len(marks) - 1, plan.timed_calls)  # None: a time box has no step count
    energy = meter.between(energy_before, meter.read()) if meter else None
    usage = ProcessUsage.since(usage_before)
    calls = len(marks) - 1
    step_times = [(b - a) / plan.steps_per_call for a, b in zip(marks, marks[1:])]
    timed_rule = (
        f"counted: {calls * plan.steps_per_call} steps"
        if plan.timed_calls
        else f"time box {plan.time_box_s:g} s: {calls * plan.steps_per_call} steps"
    )
    return Timing(
        step_times=step_times,
        wall_time_s=marks[-1] - marks[0],
        timed_calls=calls,
        steps_per_call=plan.steps_per_call,
        losses=losses,
        warmup_calls=warmup_calls,
        warmup_rule=warmup_rule,
        timed_rule=timed_rule,
        usage=usage,
        energy=energy,
        startup=_marks(first, warmup_started, warmup_ended) if first_steps else None,
    )


def _marks(step: _FirstCall, warmup_started: float, warmup_ended: float) -> StartupMarks | None:
    if step.started is None or step.ended is None:
        return None
    return StartupMarks(warmup_started, step.started, step.ended, warmup_ended)


def warm_up_marked(step: Callable[[], float | None], plan: TimingPlan) -> tuple[int, str, StartupMarks | None]:
    """``warm_up`` of a process's first calls of ``step``, and when they ran (lockstep's sides)."""
    first = _FirstCall(step)
    started = time.monotonic()
    calls, rule = warm_up(first, plan)
    return calls, rule, _marks(first, started, time.monotonic())


def _more(done: int, plan: TimingPlan, deadline: float | None, now: float) -> bool:
    if plan.timed_calls:
        return done < plan.timed_calls
    return done < MIN_TIMED_CALLS or (deadline is not None and now < deadline)


def warm_up(
    step: Callable[[], float | None], plan: TimingPlan, report: Callable[[str, int, int | None], None] = lambda *_: None
) -> tuple[int, str]:
    """Run the warm-up; return the calls it took and why it ended."""

    def steps(calls: int) -> int:
        return calls * plan.steps_per_call

    if not plan.stable_warmup or plan.warmup_calls == 0:
        for i in range(plan.warmup_calls):
            step()
            report("warmup", i + 1, plan.warmup_calls)
        return plan.warmup_calls, f"fixed: {steps(plan.warmup_calls)} steps"
    started, times = time.perf_counter(), list[float]()
    cap_s = plan.warmup_time_cap_s
    while len(times) < plan.warmup_calls:
        before = time.perf_counter()
        step()
        times.append(time.perf_counter() - before)
        report("warmup", len(times), plan.warmup_calls)
        if _stable(times):
            return len(times), (
                f"stable after {steps(len(times))} steps (last {STABLE_WINDOW} within {STABLE_SPREAD:.0%} of their median)"
            )
        if cap_s is not None and time.perf_counter() - started >= cap_s:
            return len(times), (f"time cap {cap_s:g} s reached after {steps(len(times))} steps, before the step time was stable")
    return len(times), f"cap of {steps(plan.warmup_calls)} steps reached before the step time was stable"


def _stable(times: list[float]) -> bool:
    if len(times) < STABLE_WINDOW:
        return False
    window = times[-STABLE_WINDOW:]
    median = statistics.median(window)
    return median > 0 and (max(window) - min(window)) / median <= STABLE_SPREAD


def _finite_or_none(loss: float) -> float | None:
    value = float(loss)
    return value if math.isfinite(value) else None


def _throttled(progress: Callable[[str, int, int | None], None] | None) -> Callable[[str, int, int | None], None]:
    if progress is None:
        return lambda phase, done, total: None
    last = [0.0]

    def report(phase: str, done: int, total: int | None) -> None:
        now = time.perf_counter()
        if done == total or now - last[0] >= PROGRESS_INTERVAL_S:
            last[0] = now
            progress(phase, done, total)

    return report
