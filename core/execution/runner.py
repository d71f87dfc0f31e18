"""Starting workers and turning whatever happens in them into records.

Each (backend, config, trial) gets a fresh worker process. A backend that raises, kills its
process, runs out of memory or hangs past ``timeout_s`` produces a record with that status; the
other runs go on.
"""

from __future__ import annotations

import dataclasses
import sys
import time
import uuid
from typing import Any, Callable, Iterator

from accelbench.analysis import stats
from accelbench.environments import machine as environment
from accelbench.environments import python_envs as envs
from accelbench.execution import distributed
from accelbench.execution.processes import Worker, WorkerFailure, installed_by
from accelbench.execution.protocol import Check, Prepare, PrepareTraining, ReadDeviceMemory, Teardown, TimedRun, Train
from accelbench.execution.schedule import MIN_DECIDING_ROUNDS, Schedule
from accelbench.execution.schedule import slots as schedule_slots
from accelbench.planning import config as configuration
from accelbench.planning.config import RunConfig
from accelbench.planning.plan import Plan as Plan  # the Python API: runner.plan, then runner.execute
from accelbench.planning.plan import plan as plan
from accelbench.records import footprint
from accelbench.records import results as records
from accelbench.records.blocks import ScheduleBlock
from accelbench.records.results import Record, RunContext, TrialOutcome, build
from accelbench.registry import BackendRef


class RunObserver:
    """What a run tells whoever watches it (the terminal, a log). Every method does nothing here;
    it is a context manager around the run."""

    def __enter__(self) -> "RunObserver":
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def started(self, backend_id: str, trial: int, round_index: int) -> None:
        """A trial's worker is about to start (``trial`` and ``round_index`` count from 0)."""

    def progress(self, backend_id: str, trial: int, phase: str, done: int, total: int | None) -> None:
        """The worker's report from inside a phase (at most about once a second); ``total`` None:
        the phase ends on time, not on a count."""

    def finished(self, record: Record) -> None:
        """A trial ended; ``record`` is its run's record with every trial so far."""

    def note(self, text: str) -> None:
        """Something the user must be told while the run goes (an environment being made)."""
        print(text, file=sys.stderr, flush=True)


#: train mode's warm-up is its first epoch; a run of one epoch has no steady epochs to read energy over
TRAIN_MODE_NOTES = {"energy": "train mode: one epoch ran, the warm-up, and no later epoch's steps to count"}


def run_trial(
    ref: BackendRef,
    config: RunConfig,
    on_progress: Callable[[str, int, int | None], None] | None = None,
    python: str | None = None,
) -> TrialOutcome:
    """check → prepare → timing loop (or train mode's epoch loop) → teardown, in one fresh worker
    (of ``python``, else the host's); the outcome keeps what the worker read installed there."""
    try:
        handle = Worker(ref, config, python=python)
    except WorkerFailure as failure:
        return TrialOutcome(failure.status, failure.reason)
    try:
        outcome = _trial_in(handle, config, on_progress)
    finally:
        handle.close()
    outcome.installed = installed_by(handle)
    return outcome


def _trial_in(handle: Worker, config: RunConfig, on_progress: Callable[[str, int, int | None], None] | None) -> TrialOutcome:
    prepared = None
    try:
        reason = handle.call(Check())
        if reason:
            return TrialOutcome("unavailable", reason)
        if config.mode == "train":
            prepared = handle.call(PrepareTraining())
            training = handle.call(Train(), on_progress=on_progress)
            if training.steady is None:  # train() times every step it runs, the first epoch's at least
                raise WorkerFailure("failed", "train mode ran no timed step")
            device_memory = handle.call(ReadDeviceMemory())
            handle.call(Teardown())
            return TrialOutcome(
                "ok",
                "",
                training.steady,
                prepared,
                training=training,
                device_memory=device_memory,
                startup=footprint.Startup.of(handle.spawned, training.steady.startup, prepared.compile_s),
                footprint_notes=TRAIN_MODE_NOTES,
            )
        prepared = handle.call(Prepare())
        timing = handle.call(TimedRun(), on_progress=on_progress)
        device_memory = handle.call(ReadDeviceMemory())
        handle.call(Teardown())
        return TrialOutcome(
            "ok",
            "",
            timing,
            prepared,
            device_memory=device_memory,
            startup=footprint.Startup.of(handle.spawned, timing.startup, prepared.compile_s),
        )
    except WorkerFailure as failure:
        failure = handle.keep_log(failure)
        return TrialOutcome(failure.status, failure.reason, None, prepared)


def execute(
    plans: list[Plan],
    on_records: Callable[[list[Record]], None],
    observer: RunObserver | None = None,
    schedule: Schedule | None = None,
    create_envs: bool = True,
) -> list[Record]:
    """Run every plan's trials in the schedule's order; return one record per plan.

    After every trial, ``on_records`` gets the records of every plan so far (a finished trial is
    never lost, even if the run is stopped before its plan's last round).
    """
    schedule = schedule or Schedule(rounds=max((p.config.trials for p in plans), default=1))
    if schedule.kind == "lockstep":
        raise ValueError(
            "runner.execute runs trials in rounds: a lockstep schedule runs with accelbench.execution.lockstep.execute"
        )
    observer = observer or RunObserver()
    run = ScheduledRun(plans, schedule, create_envs)
    for round_index, index in run.slots():
        ctx = run.contexts[index]
        observer.started(ctx.ref.id, len(ctx.outcomes), round_index)
        run.run_trial(index, round_index, observer)
        built = run.records()
        on_records(list(built.values()))
        observer.finished(built[index])
    final = list(run.records(final=True).values())
    on_records(final)  # with the stop reason, and the records of plans that never ran a trial
    return final


class ScheduledRun:
    """The state of one invocation's plans while the schedule walks them (``lockstep.LockstepRun``
    walks pairs of processes with the same state)."""

    def __init__(self, plans: list[Plan], schedule: Schedule, create_envs: bool = True):
        self.schedule, self.plans, self.create_envs = schedule, plans, create_envs
        env = environment.collect(m for p in plans for m in p.ref.backend.describe().requires)
        self.contexts = [RunContext(p.ref, p.config, env) for p in plans]
        self.finished = [False] * len(plans)
        for index, (ctx, item) in enumerate(zip(self.contexts, plans)):
            if item.precheck:
                ctx.outcomes.append(item.precheck)
                self.finished[index] = True
        self.run_id, self.started = uuid.uuid4().hex, time.monotonic()
        self.rounds_run, self.stop_reason, self.looks = 0, "", 0
        #: the confidence of the intervals at the last look (``until``), which the records keep so
        #: that ``compare`` reads them as the run did
        self.confidence = 0.95
        #: how an ``until`` run spends its error over its looks: fixed at its first look
        self.spending: stats.Spending | None = None
        #: seconds spent making worker environments (not the pace of the run's samples)
        self.making_envs_s = 0.0
        #: what one sample of a comparison is: a round of trials (a lockstep run's is a pair)
        self.unit = "round"
        #: plan index -> the Python its workers run (None: the host's), once made
        self.pythons: dict[int, str | None] = {}

    def slots(self) -> Iterator[tuple[int, int]]:
        """(round, plan) to run next; stops at the time budget, and (``until``) once decided."""
        last_round = -1
        for round_index, index in schedule_slots(self.schedule, len(self.plans)):
            if round_index != last_round and last_round >= 0 and self._decided(last_round + 1):
                return
            last_round = round_index
            if self.finished[index] or self._wanted_trials(index) <= len(self.contexts[index].outcomes):
                continue
            if self._out_of_time():
                return
            yield round_index, index
        self.stop_reason = self.stop_reason or self._limit_reason()

    def _wanted_trials(self, index: int) -> int:
        return self.schedule.round_limit if self.schedule.until else self.plans[index].config.trials

    def _out_of_time(self) -> bool:
        budget = self.schedule.time_budget_s
        if budget is None or time.monotonic() - self.started < budget:
            return False
        self.stop_reason = f"time budget of {budget:g} s spent" + (
            " before the answer was decided" if self.schedule.until else ""
        )
        return True

    def _limit_reason(self) -> str:
        if self.schedule.until:
            return f"round limit {self.schedule.round_limit} reached before the answer was decided"
        return "every trial ran"

    def _decided(self, rounds_done: int) -> bool:
        """``until`` runs: is every comparison this run makes decided after ``rounds_done`` rounds?"""
        rule = self.schedule.until
        if rule is None or rounds_done < max(MIN_DECIDING_ROUNDS, self.schedule.rounds):
            return False
        from accelbench.analysis import compare

        if self.spending is None:  # its samples' pace, free of one-time environment making
            pace = (time.monotonic() - self.started - self.making_envs_s) / rounds_done
            self.spending = stats.spending_for(self.schedule.time_budget_s, pace, self.schedule.round_limit)
        error = self.spending.error_at(rounds_done)
        if error == 0:
            return False  # a look that may spend nothing cannot decide: none is taken
        self.looks += 1
        self.confidence = 1 - error
        look = f"look {self.looks} after {rounds_done} {self.unit}s ({self.spending.describe()})"
        decision = compare.decided(list(self.records().values()), rule, self.confidence, look)
        if decision:
            self.stop_reason = decision
        return bool(decision)

    def run_trial(self, index: int, round_index: int, observer: RunObserver) -> None:
        ctx, trial = self.contexts[index], len(self.contexts[index].outcomes)
        progress = _trial_progress(ctx, trial, observer)
        started = records.utc_now("milliseconds")
        # its place in the round: the trials of this round that ran before it (each kept one outcome)
        position = sum(o.round == round_index for c in self.contexts for o in c.outcomes)
        try:
            python = self._python(index, observer)
        except envs.EnvironmentNotMade as exc:
            outcome = TrialOutcome("unavailable", f"no worker environment: {exc}")
        else:
            if ctx.config.workers > 1:
                outcome = distributed.local_trial(ctx, progress, python)
            else:
                outcome = run_trial(ctx.ref, ctx.config, progress, python)
        outcome.round, outcome.position = round_index, position
        outcome.started_utc, outcome.ended_utc = started, records.utc_now("milliseconds")
        ctx.outcomes.append(outcome)
        self.finished[index] = outcome.status != "ok"
        self.rounds_run = max(self.rounds_run, round_index + 1)

    def _python(self, index: int, observer: RunObserver) -> str | None:
        """The plan's worker Python, its environment made on first use (said on the terminal)."""
        if index not in self.pythons:
            setup = self.plans[index].setup
            began = time.monotonic()
            try:
                python, described = envs.interpreter(setup, self.create_envs, observer.note)
            finally:
                self.making_envs_s += time.monotonic() - began
            self.pythons[index] = python
            self.contexts[index].worker = dataclasses.replace(described, added=list(setup.added) or None)
        return self.pythons[index]

    def records(self, final: bool = False) -> dict[int, Record]:
        """The record of every plan that has run (or was refused), by plan index; all when ``final``."""
        baselines: dict[str, float] = {}
        built = {}
        for index, ctx in enumerate(self.contexts):
            if not ctx.outcomes and not final:
                continue
            if ctx.distributed is not None:
                ctx.distributed.baseline_images_per_sec = baselines.get(_baseline_key(ctx.ref, ctx.config))
            ctx.schedule = self.schedule_block(index) if len(self.plans) > 1 or self.schedule.until else None
            record = build(ctx)
            if record.throughput and ctx.config.workers == 1:
                baselines[_baseline_key(ctx.ref, ctx.config)] = record.throughput.images_per_sec
            built[index] = record
        return built

    def schedule_block(self, index: int) -> ScheduleBlock:
        rule = self.schedule.until
        return ScheduleBlock(
            self.schedule.kind,
            self.run_id,
            self.rounds_run,
            len(self.plans),
            index,
            stop_reason=self.stop_reason or "running",
            stop_rule=rule.describe() if rule else None,
            max_time_s=self.schedule.time_budget_s,
            elapsed_s=time.monotonic() - self.started,
            looks=self.looks,
            confidence=self.confidence,
            spending=self.spending.plan() if self.spending else None,
        )


def _baseline_key(ref: BackendRef, config: RunConfig) -> str:
    """Runs that differ only in their worker count (same per-worker batch) share this key."""
    return configuration.single_worker_baseline(config).replace(seed=0).config_hash() + ref.id


def _trial_progress(ctx: RunContext, trial: int, observer: RunObserver) -> Callable[[str, int, int | None], None]:
    def progress(phase: str, done: int, total: int | None) -> None:
        observer.progress(ctx.ref.id, trial, phase, done, total)

    return progress
