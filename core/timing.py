"""The one timing loop, shared by every backend. It runs inside the worker process.

Warm-up steps are excluded. The timed region is read with ``perf_counter`` at every step
boundary; every ``step()`` returns only after the device has finished, so each boundary is a
device sync. The wall time of the timed region is the sum of contiguous step intervals, so
throughput = images in the timed steps / that wall time (never an average of per-step rates).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

#: progress is reported at most this often, so reporting costs nothing measurable
PROGRESS_INTERVAL_S = 1.0


@dataclass
class Timing:
    #: seconds per training step (a call's time / steps_per_call), one value per timed call
    step_times: list[float]
    wall_time_s: float
    timed_calls: int
    steps_per_call: int
    #: loss per timed call when the backend returns one; None where it was NaN/inf
    losses: list[float | None] = field(default_factory=list)

    @property
    def timed_steps(self) -> int:
        return self.timed_calls * self.steps_per_call


def run_timed(step: Callable[[], float | None], warmup_calls: int, timed_calls: int,
              steps_per_call: int = 1,
              progress: Callable[[str, int, int], None] | None = None) -> Timing:
    """Run warm-up then timed calls of ``step``; return per-step times and the region's wall time."""
    report = _throttled(progress)
    for i in range(warmup_calls):
        step()
        report("warmup", i + 1, warmup_calls)
    marks = [0.0] * (timed_calls + 1)
    losses: list[float | None] = []
    marks[0] = time.perf_counter()
    for i in range(timed_calls):
        loss = step()
        marks[i + 1] = time.perf_counter()
        if loss is not None:
            losses.append(_finite_or_none(loss))
        report("timed", i + 1, timed_calls)
    step_times = [(b - a) / steps_per_call for a, b in zip(marks, marks[1:])]
    return Timing(step_times=step_times, wall_time_s=marks[-1] - marks[0], timed_calls=timed_calls,
                  steps_per_call=steps_per_call, losses=losses)


def _finite_or_none(loss: float) -> float | None:
    value = float(loss)
    return value if math.isfinite(value) else None


def _throttled(progress: Callable[[str, int, int], None] | None) -> Callable[[str, int, int], None]:
    if progress is None:
        return lambda phase, done, total: None
    last = [0.0]

    def report(phase: str, done: int, total: int) -> None:
        now = time.perf_counter()
        if done == total or now - last[0] >= PROGRESS_INTERVAL_S:
            last[0] = now
            progress(phase, done, total)

    return report
