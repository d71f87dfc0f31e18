"""Lockstep: the sides of a comparison as warm workers taking turns in blocks of steps, pairs of
processes as the unit, and the busy-machine guard around every block.

Why not rounds of fresh processes: on a shared 2-core VM the machine's speed moves over tens of
seconds (a neighbour on the host's cores), and each trial of a round pays 20 s or more of start-up
(imports, model build, compilation) before its timed phase, so the two trials of a round are half
a minute apart and inherit the drift. In lockstep every side is prepared and warmed up once per
process, then the sides run blocks of about ``block_s`` seconds one right after the other, in the
order A B | B A | A B ... (ABBA: a linear drift lands alike on both), so the blocks they are
compared over are seconds apart.

Why pairs of processes: what a process decides once -- where its memory landed, how its threads
were placed, which kernels a JIT or autotuner picked -- moves its speed by 2-3% from one process
to the next (on the Zen 4 VM two lockstep runs of one case 50 minutes apart decided opposite ways,
0.952 then 1.040, each with a tight interval over its blocks). So blocks within one pair are not
independent samples of the ratio; pairs are. Each pair opens a fresh process per side (the side
that starts and blocks first alternating from pair to pair), runs ``blocks`` rounds of blocks and
closes them. A pair's ratio is its sides' images over their seconds, and each side's process is
one trial of its record with the pair as its round, so ``accelbench compare`` pairs them exactly
as it pairs the rounds of an interleaved run: a Student-t interval over the pairs' log-ratios.

While one side runs its block, every other side is parked: stopped (SIGSTOP) right after its
block and continued (SIGCONT) right before its next one. A waiting framework is not idle: an
OpenMP runtime keeps its threads spinning for a while after a parallel region (Intel's 200 ms by
default), which would run beside the other side's block; a stopped process's threads run nothing.
Every side is parked alike, so the wake-up after a stop, whatever it costs, costs every side.

The guard: the CPU time that processes outside the run took during each block is measured
(``accelbench.execution.busy``) and kept with the block. ``--when-busy wait`` (the default) waits before a
block until the machine is quiet (unless the block just run was quiet: it is the latest watch of
the machine), and a block that turned out busy is kept in the record but not
counted, and run again once the machine is quiet; ``--when-busy go`` counts every block, and
``compare`` withholds the verdict of a comparison that rests on a busy block.
"""

from __future__ import annotations

import dataclasses
import math
import os
import signal
import threading
import time
from statistics import median
from typing import TYPE_CHECKING, Callable

from accelbench.analysis import stats
from accelbench.backend import DeviceMemory, Prepared
from accelbench.environments import python_envs as envs
from accelbench.errors import UsageError
from accelbench.execution import busy
from accelbench.execution.energy import EnergyUse
from accelbench.execution.processes import Worker, WorkerFailure, installed_by
from accelbench.execution.protocol import AnswerT, Check, Prepare, ReadDeviceMemory, Request, Step, Teardown, WarmUpAlone
from accelbench.execution.runner import RunObserver, ScheduledRun
from accelbench.execution.schedule import Schedule
from accelbench.execution.timing import ProcessUsage, Timing, calls_per_sample
from accelbench.records import footprint
from accelbench.records import results as records
from accelbench.records.blocks import Block, Efficiency, LockstepSettings, ScheduleBlock, TimeSplit
from accelbench.records.results import Record, RunContext, TrialOutcome

if TYPE_CHECKING:
    from accelbench.planning.plan import Plan


#: the time from a SIGSTOP or SIGCONT to its taking effect in every thread, before a block starts
SETTLE_S = 0.05
#: a block run again after it was busy: at most this many times in one pair (then the pair goes on,
#: counting it, and the guard withholds the verdict)
MAX_REDOS_PER_PAIR = 20
#: how often a run that waits for a quiet machine looks again, and says so on the terminal
QUIET_POLL_S = 5.0


class SideUnavailable(Exception):
    """The backend's check said it cannot run here."""


class OutOfTime(Exception):
    """The run's time budget ran out while it waited for a quiet machine."""


class Side:
    """One plan's warm worker in one pair: started, checked, prepared and warmed up on ``open``,
    then parked until each of its blocks. ``ctx`` is its plan's run context (backend, resolved
    config, the trials so far); the benchmark scripts drive a ``Side`` beside a process of their
    own (a bare loop, a shipped reference) the same way."""

    def __init__(self, ctx: RunContext, index: int, observer: RunObserver):
        self.index, self.ctx = index, ctx
        self.started_utc = records.utc_now("milliseconds")
        self.blocks: list[Block] = []
        self.timings: list[Timing] = []
        #: what ``prepare`` reported, once the side is open
        self.prepared: Prepared | None = None
        self.worker: Worker | None = None
        self.observer, self.trial = observer, len(self.ctx.outcomes)
        self.warmup_calls, self.warmup_rule, self.call_s = 0, "", 0.0
        self.startup: footprint.Startup | None = None
        self.device_memory: DeviceMemory | None = None
        #: the process's first call, run as the side starts (its trace and compilation)
        self.first_call: Timing | None = None

    def open(self, python: str | None) -> None:
        """Start, check, prepare and warm up the worker, then park it; WorkerFailure or SideUnavailable."""
        self.spawn(python)
        self.start()
        self.warm_up()

    def spawn(self, python: str | None) -> None:
        """Start the worker process. In the run's own thread: a worker dies with the thread that
        started it (``PR_SET_PDEATHSIG`` follows the parent thread, not the process)."""
        self.observer.started(self.ctx.ref.id, self.trial, self.trial)
        self.worker = Worker(self.ctx.ref, self.ctx.config, python=python)

    def start(self) -> None:
        """Check and prepare the spawned worker (imports, model build), run its first call (where
        frameworks trace and compile), then park it; WorkerFailure or SideUnavailable. Nothing of this
        is measured, so the sides of a pair may start at once, each from a thread of its own:
        their start-ups overlap."""
        reason = self._call(Check())
        if reason:
            raise SideUnavailable(reason)
        self.prepared = self._call(Prepare())
        self.first_call = self._call(Step(1))
        self.park()

    def warm_up(self) -> None:
        """Wake the prepared worker, run its warm-up rule (alone: the rule reads step times), park it.
        The last warm-up calls' pace sizes its blocks."""
        if self.worker is None or self.prepared is None:
            raise RuntimeError(f"lockstep side {self.ctx.ref.id}: warmed up before it was started")
        self.wake()
        warmed = self._call(WarmUpAlone())
        self.warmup_calls, self.warmup_rule, self.call_s = warmed.calls, warmed.rule, warmed.call_s
        if not self.call_s and self.first_call:  # no warm-up calls (a fixed warm-up of none)
            self.call_s = self.first_call.wall_time_s
        marks = warmed.marks
        first = self.first_call.startup if self.first_call else None
        if first is not None:  # the first call ran at the start: the warm-up is it and the rule's calls
            self.warmup_calls += 1
            self.warmup_rule = f"{warmed.rule}, after the first step"
            # not the time between them, which the side spent parked while the others warmed up
            spent = (first.first_step_ended - first.first_step_started) + (warmed.ended - warmed.started)
            marks = dataclasses.replace(first, warmup_started=warmed.ended - spent, warmup_ended=warmed.ended)
        self.startup = footprint.Startup.of(self.worker.spawned, marks, self.prepared.compile_s)
        self.park()

    def calls_for(self, blocks: int, block_s: float) -> list[int]:
        """Calls each of this side's ``blocks`` takes: the asked steps split over them exactly (the
        first blocks one call more where they do not divide; a block of none is skipped), else as
        many as fill ``block_s`` at the pace of the last warm-up call (at least one)."""
        per_call = self._prepared().steps_per_call
        if self.ctx.config.timed_steps:
            calls = math.ceil(self.ctx.config.timed_steps / per_call)
            return [calls // blocks + (1 if r < calls % blocks else 0) for r in range(blocks)]
        return [max(1, round(block_s / self.call_s)) if self.call_s > 0 else 1] * blocks

    def block(self, calls: int, round_index: int, clock0: float) -> Block:
        """Continue the worker, time ``calls`` calls in its own timing loop, park it again."""
        self.wake()
        time.sleep(SETTLE_S)
        started = time.monotonic() - clock0
        before = busy.snapshot()
        timing = self._call(Step(calls, calls_per_sample(self.call_s)))
        load = busy.between(before, busy.snapshot())
        self.park()
        block = Block(
            round_index,
            timing.timed_steps,
            timing.wall_time_s,
            started,
            load.foreign_share if load else None,
            load.steal_share if load else None,
        )
        self.blocks.append(block)
        self.timings.append(timing)
        return block

    def teardown(self) -> None:
        """The framework's device peak and the backend's teardown, as after any trial's timed steps
        (WorkerFailure if either fails)."""
        self.wake()
        self.device_memory = self._call(ReadDeviceMemory())
        self._call(Teardown())

    def _call(self, request: Request[AnswerT]) -> AnswerT:
        # the timeout is per phase here: a lockstep worker lives for a whole pair of many blocks
        if self.worker is None:
            raise RuntimeError(f"lockstep side {self.ctx.ref.id}: {request.phase} before the side was opened")
        self.worker.deadline = time.monotonic() + self.worker.timeout_s
        progress = lambda phase, done, total: self.observer.progress(  # noqa: E731
            self.ctx.ref.id, self.trial, phase, done, total
        )
        return self.worker.call(request, on_progress=progress)

    def _prepared(self) -> Prepared:
        if self.prepared is None:
            raise RuntimeError(f"lockstep side {self.ctx.ref.id}: used before it was prepared")
        return self.prepared

    def park(self) -> None:
        self._signal(signal.SIGSTOP)

    def wake(self) -> None:
        self._signal(signal.SIGCONT)

    def _signal(self, which: int) -> None:
        if self.worker is not None and self.worker.process.poll() is None:
            os.kill(self.worker.process.pid, which)

    def outcome(self) -> TrialOutcome:
        """This side's trial: the counted blocks' steps as one timing, every block listed."""
        counted = [t for b, t in zip(self.blocks, self.timings) if b.counted]
        timing = Timing(
            step_times=[s for t in counted for s in t.step_times],
            wall_time_s=sum(t.wall_time_s for t in counted),
            timed_calls=sum(t.timed_calls for t in counted),
            steps_per_call=self._prepared().steps_per_call,
            losses=[loss for t in counted for loss in t.losses],
            warmup_calls=self.warmup_calls,
            warmup_rule=self.warmup_rule,
            timed_rule=f"lockstep: {len(counted)} blocks",
            calls_per_sample=calls_per_sample(self.call_s),
            usage=ProcessUsage.summed([t.usage for t in counted]),
            energy=EnergyUse.summed([t.energy for t in counted]),
        )
        return TrialOutcome(
            "ok",
            "",
            timing,
            self.prepared,
            blocks=list(self.blocks),
            started_utc=self.started_utc,
            device_memory=self.device_memory,
            startup=self.startup,
            installed=installed_by(self.worker),
        )

    def close(self) -> None:
        if self.worker is not None:
            self.wake()  # a stopped worker would not read its exit request
            self.worker.close()


class LockstepRun(ScheduledRun):
    """The state of a lockstep invocation: pairs of processes, one after another."""

    def __init__(self, plans: list[Plan], schedule: Schedule, create_envs: bool = True):
        super().__init__(plans, schedule, create_envs)
        self.clock0 = time.monotonic()
        #: plans whose side failed in the pair now running (their outcome is kept already)
        self._failed_now: set[int] = set()
        #: rounds of blocks per pair: the schedule's, re-chosen after each pair once there are three
        #: (``stats.blocks_per_pair``) when the schedule lets the run choose
        self.blocks = schedule.blocks
        self.allocation: stats.Allocation | None = None
        #: per pair: the first two sides' per-round log-ratios, seconds to open, seconds a round
        self.round_logs: list[list[float]] = []
        self.open_s: list[float] = []
        self.round_s: list[float] = []
        #: the block just run found the machine quiet (so the next need not watch it first)
        self._quiet_just_now = False
        self.unit = "pair"
        #: where the run's wall time went (``other_s`` is what is left of it when it is read)
        self.split = TimeSplit(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
        self._waited_s = 0.0
        #: the run's comparison of its first two sides at its last look, and how efficient it was
        self.efficiency: Efficiency | None = None

    def live(self) -> list[int]:
        return [i for i in range(len(self.plans)) if not self.finished[i]]

    def pairs(self, observer: RunObserver, on_pair: Callable[[], None]) -> None:
        """Run pairs until the count, the budget or (``until``) the answer says stop."""
        pair = 0
        # a run whose peers failed goes on alone: its measurement is still wanted (no comparison)
        while pair < self.schedule.round_limit and self.live():
            if self._out_of_time() or not self._fits_budget():
                break
            try:
                self.run_pair(pair, observer)
            except OutOfTime:
                break
            pair += 1
            self.rounds_run = pair
            self._allocate()
            decided = self._decided(pair)
            self._measure_efficiency()
            on_pair()
            if decided:
                break
        else:
            self.stop_reason = self.stop_reason or (self._limit_reason() if self.live() else "no run left that can run")

    def run_pair(self, pair: int, observer: RunObserver) -> None:
        order = self.live() if pair % 2 == 0 else self.live()[::-1]
        sides: list[Side] = []
        try:
            opened = time.monotonic()
            sides = self._open_all(order, observer)
            if sides:
                blocks_started = time.monotonic()
                self._blocks(sides, observer)
                blocks_ended = time.monotonic()
                self._measure_pair(sides, blocks_started - opened, blocks_ended - blocks_started)
                self.split.gaps_s += blocks_ended - blocks_started - self._in_blocks(sides)
                self._teardown(sides, observer)
            for position, side in enumerate(sides):  # the order of the pair's first block
                if side.index not in self._failed_now and any(b.counted for b in side.blocks):
                    self._keep(side.index, side.outcome(), pair, position)
        finally:
            closing = time.monotonic()
            for side in sides:
                side.close()
            self._failed_now = set()
            self.split.closing_s += time.monotonic() - closing

    def _in_blocks(self, sides: list[Side]) -> float:
        """The seconds of the pair's block phase spent in blocks (counted or not) and waiting for
        quiet, added to the run's split; what is left of the phase is gaps."""
        counted = sum(b.seconds or 0.0 for side in sides for b in side.blocks if b.counted)
        uncounted = sum(b.seconds or 0.0 for side in sides for b in side.blocks if not b.counted)
        self.split.counted_s += counted
        self.split.uncounted_s += uncounted
        waited, self._waited_s = self._waited_s, 0.0
        self.split.waiting_s += waited
        return counted + uncounted + waited

    def _open_all(self, order: list[int], observer: RunObserver) -> list[Side]:
        """The pair's sides, started at once (their imports, model builds and compilations
        overlap: nothing is measured while processes start), then warmed up one at a time (the
        warm-up rule reads step times, which a neighbour's start-up would disturb). A side that
        cannot run is kept as its outcome and left out."""
        began, making = time.monotonic(), self.making_envs_s
        sides = [Side(self.contexts[index], index, observer) for index in order]
        pythons = {side.index: self._side_python(side, observer) for side in sides}
        began += self.making_envs_s - making  # making an environment is "other", not opening
        errors: dict[int, BaseException] = {}
        starting = []
        for side in sides:
            if side.index in self._failed_now:
                continue
            try:
                side.spawn(pythons[side.index])
            except WorkerFailure as failure:
                errors[side.index] = failure
            starting.append(side)

        def start(side: Side) -> None:
            try:
                side.start()
            except BaseException as exc:  # noqa: BLE001 - judged below, in the run's own thread
                errors[side.index] = exc

        threads = [threading.Thread(target=start, args=(side,), daemon=True) for side in starting if side.index not in errors]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        started = [side for side in starting if self._started(side, errors.get(side.index), observer)]
        warming = time.monotonic()
        self.split.opening_s += warming - began
        warm = [side for side in started if self._warmed(side, observer)]
        self.split.warmup_s += time.monotonic() - warming
        return warm

    def _side_python(self, side: Side, observer: RunObserver) -> str | None:
        try:
            return self._python(side.index, observer)
        except envs.EnvironmentNotMade as exc:
            outcome = TrialOutcome("unavailable", f"no worker environment: {exc}", started_utc=side.started_utc)
            self._fail(side.index, outcome, observer)
            return None

    def _started(self, side: Side, error: BaseException | None, observer: RunObserver) -> bool:
        if error is None:
            return True
        if isinstance(error, SideUnavailable):
            side.close()
            self._fail(side.index, TrialOutcome("unavailable", str(error), started_utc=side.started_utc), observer)
        elif isinstance(error, WorkerFailure):
            self._side_failed(side, error, observer)
            side.close()
        else:
            side.close()
            raise error
        return False

    def _warmed(self, side: Side, observer: RunObserver) -> bool:
        try:
            side.warm_up()
        except WorkerFailure as failure:
            self._side_failed(side, failure, observer)
            side.close()
            return False
        return True

    def _fits_budget(self) -> bool:
        """``adapt_blocks``: size the next pair to end within the time budget, from what the pairs so
        far took to open and per round; False (and the stop reason) when not even the fewest rounds
        fit. A run with fixed ``--blocks`` starts its pairs whole, as trials are started."""
        budget = self.schedule.time_budget_s
        if not (self.schedule.adapt_blocks and budget is not None and self.open_s):
            return True
        left = budget - (time.monotonic() - self.started) - median(self.open_s)
        fit = math.floor(left / median(self.round_s)) if left > 0 else 0
        if fit < stats.MIN_BLOCKS:
            self.stop_reason = f"time budget of {budget:g} s: too little left for another pair before the answer was decided"
            return False
        self.blocks = min(self.blocks, fit)
        return True

    def _teardown(self, sides: list[Side], observer: RunObserver) -> None:
        for side in sides:
            if side.index in self._failed_now:
                continue
            try:
                side.teardown()
            except WorkerFailure as failure:
                self._side_failed(side, failure, observer)

    def _measure_pair(self, sides: list[Side], open_s: float, blocks_s: float) -> None:
        """What the allocation rule needs of a finished pair (the first two sides in plan order)."""
        if len(sides) < 2 or any(side.index in self._failed_now for side in sides):
            return
        first, second = sorted(sides, key=lambda side: side.index)[:2]
        rates = [{b.round: b.steps / b.seconds for b in side.blocks if b.counted and b.seconds} for side in (first, second)]
        self.round_logs.append([math.log(rates[0][r] / rates[1][r]) for r in sorted(rates[0]) if r in rates[1]])
        self.open_s.append(open_s)
        self.round_s.append(blocks_s / self.blocks)

    def _allocate(self) -> None:
        """``adapt_blocks``: the rounds of blocks the next pairs get, from the pairs so far."""
        if not self.schedule.adapt_blocks:
            return
        found = stats.blocks_per_pair(self.round_logs, median(self.open_s), median(self.round_s), self.blocks)
        if found is not None:
            self.allocation, self.blocks = found, found.blocks

    def _blocks(self, sides: list[Side], observer: RunObserver) -> None:
        """``blocks`` rounds of one block per side, the order reversed every other round; a side
        whose worker fails ends the pair (the blocks the others ran are kept)."""
        calls = {side.index: side.calls_for(self.blocks, self.schedule.block_s) for side in sides}
        redos = 0
        self._quiet_just_now = False  # the machine is watched before a pair's first block
        for round_index in range(self.blocks):
            for side in sides if round_index % 2 == 0 else sides[::-1]:
                if not calls[side.index][round_index]:
                    continue
                try:
                    redos = self._counted_block(side, calls[side.index][round_index], round_index, redos, observer)
                except WorkerFailure as failure:
                    self._side_failed(side, failure, observer)
                    return

    def _counted_block(self, side: Side, calls: int, round_index: int, redos: int, observer: RunObserver) -> int:
        """One block of ``side`` that counts: under ``--when-busy wait`` a busy one is kept uncounted
        and run again (at most ``MAX_REDOS_PER_PAIR`` times a pair). Returns the pair's redos so far."""
        while True:
            # a block that ran quiet is the latest watch of the machine: the next one goes at once
            # (watching again would leave the sides idle for longer than a short block takes)
            if not self._quiet_just_now:
                self._wait_for_quiet(observer)
            block = side.block(calls, round_index, self.clock0)
            self._quiet_just_now = not busy.is_busy(block.foreign_share)
            if self._quiet_just_now:
                return redos
            observer.note(
                f"warning: the machine was busy during a block of {side.ctx.ref.id}: "
                f"{block.foreign_share:.0%} of the CPU time went to other processes"
            )
            if self.schedule.when_busy != "wait" or redos >= MAX_REDOS_PER_PAIR:
                return redos
            block.counted, redos = False, redos + 1

    def _wait_for_quiet(self, observer: RunObserver) -> None:
        """``--when-busy wait``: watch the machine (every side parked) until other processes take at
        most ``BUSY_SHARE`` of it; OutOfTime when the budget runs out first."""
        if self.schedule.when_busy != "wait":
            return
        began = time.monotonic()
        try:
            self._wait_while_busy(observer)
        finally:
            # the first watch is part of the gap before a block; what follows it is waiting
            self._waited_s += max(0.0, time.monotonic() - began - busy.QUIET_CHECK_S * 0.2)

    def _wait_while_busy(self, observer: RunObserver) -> None:
        load, told = busy.watch(busy.QUIET_CHECK_S * 0.2), 0.0
        while load is not None and load.busy:
            if time.monotonic() - told >= QUIET_POLL_S:
                observer.note(
                    f"warning: the machine is busy ({busy.describe(load)}): waiting for it to "
                    f"quieten (--when-busy go to run anyway)"
                )
                told = time.monotonic()
            budget = self.schedule.time_budget_s
            if budget is not None and time.monotonic() - self.started >= budget:
                self.stop_reason = f"time budget of {budget:g} s spent waiting for a quiet machine ({busy.describe(load)})"
                raise OutOfTime
            load = busy.watch(busy.QUIET_CHECK_S)

    def _side_failed(self, side: Side, failure: WorkerFailure, observer: RunObserver) -> None:
        failure = side.worker.keep_log(failure) if side.worker else failure
        self._fail(
            side.index,
            TrialOutcome(
                failure.status,
                failure.reason,
                None,
                side.prepared,
                blocks=list(side.blocks) or None,
                started_utc=side.started_utc,
                installed=installed_by(side.worker),
            ),
            observer,
        )

    def _fail(self, index: int, outcome: TrialOutcome, observer: RunObserver) -> None:
        self._failed_now.add(index)
        self._keep(index, outcome, self.rounds_run)

    def _keep(self, index: int, outcome: TrialOutcome, pair: int, position: int | None = None) -> None:
        outcome.round, outcome.position, outcome.ended_utc = pair, position, records.utc_now("milliseconds")
        self.contexts[index].outcomes.append(outcome)
        self.finished[index] = self.finished[index] or outcome.status != "ok"

    def _measure_efficiency(self) -> None:
        """The comparison of the first two sides as the run reads it now (at its last look's
        confidence), against what its wall time so far would have allowed (``compare.efficiency``)."""
        from accelbench.analysis import compare

        built = self.records()
        if len(built) < 2 or self.rounds_run < 2:
            return
        first, second = (built[i] for i in sorted(built)[:2])
        if not (first.ok and second.ok):
            return
        runs = [compare.Run("a", first), compare.Run("b", second)]
        results = compare.comparisons(runs, None, confidence=self.confidence)
        self.efficiency = results[0].efficiency if results else None

    def time_split(self) -> TimeSplit:
        """Where the run's wall time went so far; ``other_s`` is the rest of it."""
        wall = time.monotonic() - self.started
        split = dataclasses.replace(self.split, wall_s=wall, other_s=0.0)
        parts = (split.opening_s, split.warmup_s, split.counted_s, split.uncounted_s, split.gaps_s)
        split.other_s = max(0.0, wall - sum(parts) - split.waiting_s - split.closing_s)
        return split

    def schedule_block(self, index: int) -> ScheduleBlock:
        block = super().schedule_block(index)
        block.lockstep = LockstepSettings(
            self.blocks,
            self.schedule.block_s,
            self.schedule.when_busy,
            busy.BUSY_SHARE,
            self.allocation.describe() if self.allocation is not None else None,
            time=self.time_split(),
            efficiency=self.efficiency,
        )
        return block


def execute(
    plans: list[Plan],
    on_records: Callable[[list[Record]], None],
    observer: RunObserver | None = None,
    schedule: Schedule | None = None,
    create_envs: bool = True,
) -> list[Record]:
    """Run the plans in lockstep pairs (``schedule.kind == "lockstep"``); return one record per plan.

    After every pair, ``on_records`` gets the records so far: a finished pair is never lost, even
    if the run is stopped in the middle of the next."""
    observer = observer or RunObserver()
    if any(p.config.workers > 1 for p in plans):
        raise UsageError("--schedule lockstep compares single-worker runs: give --schedule interleaved with --workers > 1")
    schedule = schedule or Schedule(kind="lockstep", rounds=max((p.config.trials for p in plans), default=1))
    run = LockstepRun(plans, schedule, create_envs)

    def pair_done() -> None:
        built = run.records()
        on_records(list(built.values()))
        for record in built.values():
            observer.finished(record)

    run.pairs(observer, pair_done)
    final = list(run.records(final=True).values())
    on_records(final)
    return final
