"""A persistent worker for one backend and config, stepped on demand: what pytest-benchmark drives
(``accelbench.authoring.pytest_plugin``) and the shipped contract fixture checks (``accelbench.authoring.contract``).
"""

from __future__ import annotations

import dataclasses
import sys

from accelbench.environments import machine as environment
from accelbench.environments import python_envs as envs
from accelbench.execution.processes import Worker, installed_by
from accelbench.execution.protocol import Check, Prepare, ReadDeviceMemory, Step
from accelbench.execution.timing import StartupMarks, Timing
from accelbench.planning.config import RunConfig
from accelbench.planning.plan import plan
from accelbench.records import footprint
from accelbench.records.results import Record, RunContext, TrialOutcome, build
from accelbench.registry import BackendRef


class Unavailable(Exception):
    """The backend cannot run this config here; the message says why."""


#: a session's calls are timed one ``steps`` at a time by its caller (pytest-benchmark)
SESSION_NOTES = {
    "energy": "not read for a session's calls, which its caller times a few at a time",
    "host_memory": "not read for a session's calls",
}


class BackendSession:
    """A persistent worker for one backend and config: prepared once, then stepped on demand.

    This is what pytest-benchmark drives: each ``step()`` is one synced training step in the
    worker, timed by the caller. ``record(step_times)`` turns the caller's timings into a
    schema-valid record.
    """

    def __init__(self, ref: BackendRef, config: RunConfig):
        [item] = plan([ref], config)
        if item.precheck:
            raise Unavailable(item.precheck.reason)
        self.ref, self.config = ref, item.config
        self.call_times: list[float] = []
        self.losses: list[float | None] = []
        self.first_marks: StartupMarks | None = None
        try:
            python, self.worker_described = envs.interpreter(item.setup, True, lambda text: print(text, file=sys.stderr))
        except envs.EnvironmentNotMade as exc:
            raise Unavailable(f"no worker environment: {exc}") from None
        self.worker = Worker(ref, self.config, python=python)
        try:
            reason = self.worker.call(Check())
            if reason:
                raise Unavailable(reason)
            self.prepared = self.worker.call(Prepare())
        except BaseException:
            self.close()
            raise

    def step(self) -> float | None:
        """One synced call in the worker; its worker-side time is kept for ``record``."""
        return self.steps(1)

    def steps(self, calls: int) -> float | None:
        """``calls`` synced calls in one timing loop in the worker, back to back as ``accelbench
        run`` times them (the pipe crossed once, not between calls); each call's worker-side time
        is kept for ``record``. Returns the last loss, if the backend gives losses."""
        if calls < 1:
            raise ValueError(f"steps: calls must be at least 1, not {calls}")
        timing = self.worker.call(Step(calls))
        self.first_marks = self.first_marks or timing.startup
        self.call_times.extend(t * timing.steps_per_call for t in timing.step_times)
        self.losses.extend(timing.losses)
        return timing.losses[-1] if timing.losses else None

    def record(self, timed_calls: int, warmup_calls: int, timed_by: str) -> Record:
        """A record of the last ``timed_calls`` calls, timed in the worker by the core timing loop
        (so the host<->worker pipe is not counted, as in ``accelbench run``)."""
        per_call = self.prepared.steps_per_call
        calls = self.call_times[-timed_calls:]
        config = self.config.replace(
            warmup_steps=warmup_calls * per_call, timed_steps=timed_calls * per_call, time_s=None, warmup="fixed"
        )
        timing = Timing(
            step_times=[t / per_call for t in calls],
            wall_time_s=sum(calls),
            timed_calls=timed_calls,
            steps_per_call=per_call,
            losses=self.losses[-timed_calls:] if self.losses else [],
            warmup_calls=warmup_calls,
            warmup_rule=f"fixed: {warmup_calls * per_call} steps",
            timed_rule=f"counted: {timed_calls * per_call} steps",
        )
        prepared = dataclasses.replace(self.prepared, settings={**self.prepared.settings, "timed_by": timed_by})
        outcome = TrialOutcome(
            "ok",
            "",
            timing,
            prepared,
            device_memory=self.worker.call(ReadDeviceMemory()),
            startup=self._startup(timed_calls, warmup_calls),
            footprint_notes=SESSION_NOTES,
            installed=installed_by(self.worker),
        )
        ctx = RunContext(
            self.ref, config, environment.collect(self.ref.backend.describe().requires), [outcome], worker=self.worker_described
        )
        return build(ctx)

    def _startup(self, timed_calls: int, warmup_calls: int) -> footprint.Startup | None:
        """From the worker's start to its first call's end, that call, and the warm-up: the caller's
        calls before the ones it times."""
        if self.first_marks is None:
            return None
        end = len(self.call_times) - timed_calls
        marks = self.first_marks
        return footprint.Startup(
            marks.first_step_ended - self.worker.spawned,
            marks.first_step_ended - marks.first_step_started,
            sum(self.call_times[max(0, end - warmup_calls) : end]),
            self.prepared.compile_s,
        )

    def close(self) -> None:
        self.worker.close()
