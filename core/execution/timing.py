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

from accelbench.execution.energy import EnergyUse, Meter
from accelbench.records.jsonform import omitted_while_none

if TYPE_CHECKING:
    from accelbench.planning.config import RunConfig

#: progress is reported at most this often, so reporting costs nothing measurable
PROGRESS_INTERVAL_S = 1.0
STABLE_WINDOW = 3
STABLE_SPREAD = 0.05
#: a time-boxed run times at least this many calls, however long one takes: an interval needs two
MIN_TIMED_CALLS = 2
#: the share of the time box a stable warm-up may use at most
WARMUP_SHARE_OF_BOX = 0.5
#: a sample (one entry of a record's step times) holds whole calls lasting at least this long: a
#: step of microseconds is timed in groups of calls (as pyperf and pytest-benchmark calibrate
#: their loops), so a record holds at most a few hundred samples a second however short the step
#: (a 10 us step timed one by one for 3 s made a 15 MB record and 90 s of the host's statistics)
MIN_SAMPLE_S = 0.005


def calls_per_sample(call_s: float) -> int:
    """The whole calls a sample of calls lasting ``call_s`` holds (1 for any call of 5 ms or more)."""
    return max(1, math.ceil(MIN_SAMPLE_S / call_s)) if call_s > 0 else 1


@dataclass(frozen=True)
class TimingPlan:
    """How many calls to warm up and time, in whole calls of ``steps_per_call`` steps."""

    warmup_calls: int
    stable_warmup: bool = False
    timed_calls: int | None = None
    time_box_s: float | None = None
    steps_per_call: int = 1
    #: calls timed together as one sample; None: one, or in a time box sized from the warm-up's
    #: calls (``calls_per_sample``)
    calls_per_sample: int | None = None

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
        from accelbench.execution.allocators import huge_page_bytes

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
    #: seconds per training step, one value per sample (a sample's time / its steps: one call of
    #: ``steps_per_call`` steps, or ``calls_per_sample`` calls of a step too short to time alone)
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
    calls_per_sample: int = 1

    @property
    def timed_steps(self) -> int:
        return self.timed_calls * self.steps_per_call

    @property
    def steps_per_sample(self) -> int:
        return self.steps_per_call * self.calls_per_sample


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
    warmup_times: list[float] = []
    warmup_calls, warmup_rule = warm_up(step, plan, report, times=warmup_times)
    warmup_ended = time.monotonic()
    # a counted run times as many samples as it was asked for; a time box as many as fit, so there
    # a step too short to time alone is timed in samples of several calls
    sized = plan.timed_calls is None and warmup_times
    per_sample = plan.calls_per_sample or (calls_per_sample(statistics.median(warmup_times)) if sized else 1)
    usage_before = ProcessUsage.now()
    energy_before = meter.read() if meter else None
    marks, sizes = [time.perf_counter()], list[int]()
    losses: list[float | None] = []
    deadline = marks[0] + plan.time_box_s if plan.time_box_s else None
    calls, loss = 0, None
    while _more(calls, len(sizes), plan, deadline, marks[-1]):
        size = min(per_sample, plan.timed_calls - calls) if plan.timed_calls else per_sample
        for _ in range(size):
            loss = step()
        marks.append(time.perf_counter())
        calls += size
        sizes.append(size)
        if loss is not None:  # a sample's loss is its last call's
            losses.append(_finite_or_none(loss))
        report("timed", calls, plan.timed_calls)  # None: a time box has no step count
    energy = meter.between(energy_before, meter.read()) if meter else None
    usage = ProcessUsage.since(usage_before)
    step_times = [(b - a) / (size * plan.steps_per_call) for a, b, size in zip(marks, marks[1:], sizes)]
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
        calls_per_sample=per_sample,
    )


def _marks(step: _FirstCall, warmup_started: float, warmup_ended: float) -> StartupMarks | None:
    if step.started is None or step.ended is None:
        return None
    return StartupMarks(warmup_started, step.started, step.ended, warmup_ended)


@dataclass(frozen=True)
class WarmUp:
    """A lockstep side's warm-up: the calls it took, why it ended, when the process's first call
    ran, and the pace of its last calls (seconds a call: what sizes the side's blocks)."""

    calls: int
    rule: str
    #: None when the process's first call ran before this warm-up (``ended`` then says when it ended)
    marks: StartupMarks | None
    call_s: float
    started: float = 0.0
    ended: float = 0.0


def warm_up_marked(step: Callable[[], float | None], plan: TimingPlan) -> WarmUp:
    """``warm_up`` of a process's first calls of ``step``, when they ran, and their pace."""
    first = _FirstCall(step)
    started = time.monotonic()
    times: list[float] = []
    calls, rule = warm_up(first, plan, times=times)
    pace = statistics.median(times[-STABLE_WINDOW:]) if times else 0.0
    ended = time.monotonic()
    return WarmUp(calls, rule, _marks(first, started, ended), pace, started, ended)


def _more(done: int, samples: int, plan: TimingPlan, deadline: float | None, now: float) -> bool:
    if plan.timed_calls:
        return done < plan.timed_calls
    return samples < MIN_TIMED_CALLS or (deadline is not None and now < deadline)


def warm_up(
    step: Callable[[], float | None],
    plan: TimingPlan,
    report: Callable[[str, int, int | None], None] = lambda *_: None,
    times: list[float] | None = None,
) -> tuple[int, str]:
    """Run the warm-up; return the calls it took and why it ended (``times`` gets each call's)."""

    def steps(calls: int) -> int:
        return calls * plan.steps_per_call

    times = [] if times is None else times
    if not plan.stable_warmup or plan.warmup_calls == 0:
        for i in range(plan.warmup_calls):
            before = time.perf_counter()
            step()
            times.append(time.perf_counter() - before)
            report("warmup", i + 1, plan.warmup_calls)
        return plan.warmup_calls, f"fixed: {steps(plan.warmup_calls)} steps"
    started = time.perf_counter()
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
        if _settled(times):
            return len(times), (
                f"settled after {steps(len(times))} steps (the median of the last {STABLE_WINDOW} within "
                f"{STABLE_SPREAD:.0%} of the {STABLE_WINDOW} before)"
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


def _settled(times: list[float]) -> bool:
    """The step time no longer falls: the median of the last window is within ``STABLE_SPREAD`` of
    the window's before it. The rule for noisy steps (a CPU's seconds-long steps vary by 5-10%
    from one to the next, so three in a row rarely lie within 5% of each other, and the stable
    rule runs to its cap): a median of three is steady where single steps are not, and a
    transient -- compilation, allocator growth, caches filling -- shows as a fall between two
    windows."""
    if len(times) < 2 * STABLE_WINDOW:
        return False
    last = statistics.median(times[-STABLE_WINDOW:])
    before = statistics.median(times[-2 * STABLE_WINDOW : -STABLE_WINDOW])
    return before > 0 and abs(last / before - 1) <= STABLE_SPREAD


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
