"""Starting workers and turning whatever happens in them into records.

Each (backend, config, trial) gets a fresh worker process. A backend that raises, kills its
process, runs out of memory or hangs past ``timeout_s`` produces a record with that status; the
other runs go on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

from . import config as configuration
from . import datasets, environment, envs, footprint, netns, records, stats
from .config import RunConfig
from .launch import Engine
from .planning import Plan, plan  # noqa: F401 - the Python API: runner.plan, then runner.execute
from .records import RunContext, TrialOutcome, build
from .registry import BackendRef
from .schedule import MIN_DECIDING_ROUNDS, Schedule
from .schedule import slots as schedule_slots
from .timing import StartupMarks, Timing
from .workers import Worker, WorkerFailure


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

    def finished(self, record: dict) -> None:
        """A trial ended; ``record`` is its run's record with every trial so far."""

    def note(self, text: str) -> None:
        """Something the user must be told while the run goes (an environment being made)."""
        print(text, file=sys.stderr, flush=True)


#: train mode's epochs are timed by core's epoch loop, which reads no counters (yet)
TRAIN_MODE_NOTES = {what: "train mode: not measured (its figures are the epochs' time to accuracy)"
                      for what in ("startup", "device_memory", "energy")}


def run_trial(ref: BackendRef, config: RunConfig, on_progress: Callable[[str, int, int], None] | None = None,
              python: str | None = None, on_environment: Callable[[dict], None] | None = None) -> TrialOutcome:
    """check → prepare → timing loop (or train mode's epoch loop) → teardown, in one fresh worker
    (of ``python``, else the host's; ``on_environment`` gets what is installed there)."""
    try:
        handle = Worker(ref, config, python=python)
    except WorkerFailure as failure:
        return TrialOutcome(failure.status, failure.reason)
    prepared = None
    try:
        if on_environment:
            info = ref.backend.describe()
            on_environment(handle.call("environment", list(info.requires),
                                       [*environment.CORE_PACKAGES, *info.environment]))
        reason = handle.call("check")
        if reason:
            return TrialOutcome("unavailable", reason)
        if config.mode == "train":
            prepared = handle.call("prepare_training")
            training = handle.call("train", on_progress=on_progress)
            device_memory = handle.call("device_memory")
            handle.call("teardown")
            return TrialOutcome("ok", "", training.steady, prepared, training=training, device_memory=device_memory,
                                startup=footprint.Startup.of(handle.spawned, training.steady.startup, prepared.compile_s),
                                footprint_notes=TRAIN_MODE_NOTES)
        prepared = handle.call("prepare")
        timing = handle.call("run", on_progress=on_progress)
        device_memory = handle.call("device_memory")
        handle.call("teardown")
        return TrialOutcome("ok", "", timing, prepared, device_memory=device_memory,
                            startup=footprint.Startup.of(handle.spawned, timing.startup, prepared.compile_s))
    except WorkerFailure as failure:
        failure = handle.keep_log(failure)
        return TrialOutcome(failure.status, failure.reason, None, prepared)
    finally:
        handle.close()


def execute(plans: list[Plan], on_records: Callable[[list[dict]], None],
            observer: RunObserver | None = None, schedule: Schedule | None = None,
            create_envs: bool = True) -> list[dict]:
    """Run every plan's trials in the schedule's order; return one record per plan.

    After every trial, ``on_records`` gets the records of every plan so far (a finished trial is
    never lost, even if the run is stopped before its plan's last round).
    """
    schedule = schedule or Schedule(rounds=max((p.config.trials for p in plans), default=1))
    if schedule.kind == "lockstep":
        raise ValueError("runner.execute runs trials in rounds: a lockstep schedule runs with accelbench.lockstep.execute")
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
        self.stop_reason = f"time budget of {budget:g} s spent" + (" before the answer was decided"
                                                                    if self.schedule.until else "")
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
        from . import compare

        self.looks += 1
        self.confidence = stats.sequential_confidence(self.looks)
        decision = compare.decided(list(self.records().values()), rule, self.looks)
        if decision:
            self.stop_reason = decision
        return bool(decision)

    def run_trial(self, index: int, round_index: int, observer: RunObserver) -> None:
        ctx, trial = self.contexts[index], len(self.contexts[index].outcomes)
        progress = _trial_progress(ctx, trial, observer)
        started = records.utc_now("milliseconds")
        try:
            python = self._python(index, observer)
        except envs.EnvironmentError_ as exc:
            outcome = TrialOutcome("unavailable", f"no worker environment: {exc}")
        else:
            learn = self._learn_worker(index) if python else None
            if ctx.config.workers > 1:
                outcome = _multiworker_trial(ctx, progress, python)
            else:
                outcome = run_trial(ctx.ref, ctx.config, progress, python, learn)
        outcome.round, outcome.started_utc, outcome.ended_utc = round_index, started, records.utc_now("milliseconds")
        ctx.outcomes.append(outcome)
        self.finished[index] = outcome.status != "ok"
        self.rounds_run = max(self.rounds_run, round_index + 1)

    def _python(self, index: int, observer: RunObserver) -> str | None:
        """The plan's worker Python, its environment made on first use (said on the terminal)."""
        if index not in self.pythons:
            setup = self.plans[index].setup
            python, described = envs.interpreter(setup, self.create_envs, observer.note)
            self.pythons[index] = python
            self.contexts[index].worker = {**described, **({"added": list(setup.added)} if setup.added else {})}
        return self.pythons[index]

    def _learn_worker(self, index: int) -> Callable[[dict], None]:
        def learn(found: dict) -> None:
            self.contexts[index].worker = {**(self.contexts[index].worker or {}), **found}
        return learn

    def records(self, final: bool = False) -> dict[int, dict]:
        """The record of every plan that has run (or was refused), by plan index; all when ``final``."""
        baselines: dict[str, float] = {}
        built = {}
        for index, ctx in enumerate(self.contexts):
            if not ctx.outcomes and not final:
                continue
            if ctx.distributed is not None:
                ctx.distributed["baseline_images_per_sec"] = baselines.get(_baseline_key(ctx.ref, ctx.config))
            ctx.schedule = self.schedule_block(index) if len(self.plans) > 1 or self.schedule.until else None
            record = build(ctx)
            if record["throughput"] and ctx.config.workers == 1:
                baselines[_baseline_key(ctx.ref, ctx.config)] = record["throughput"]["images_per_sec"]
            built[index] = record
        return built

    def schedule_block(self, index: int) -> dict[str, Any]:
        rule = self.schedule.until
        return {"kind": self.schedule.kind, "run_id": self.run_id, "rounds": self.rounds_run,
                "plans": len(self.plans), "position": index,
                "stop_rule": rule.describe() if rule else None, "max_time_s": self.schedule.time_budget_s,
                "elapsed_s": time.monotonic() - self.started, "stop_reason": self.stop_reason or "running",
                "looks": self.looks, "confidence": self.confidence}


def _baseline_key(ref: BackendRef, config: RunConfig) -> str:
    """Runs that differ only in their worker count (same per-worker batch) share this key."""
    return configuration.single_worker_baseline(config).replace(seed=0).config_hash() + ref.id


def _multiworker_trial(ctx: RunContext, progress: Callable[[str, int, int], None] | None,
                       python: str | None = None) -> TrialOutcome:
    """One trial of a multi-worker plan; keeps the workers' block of the latest trial on ``ctx``."""
    from . import launch, multiworker

    engine, cfg = _engine(ctx.ref), ctx.config
    namespace, network = netns.start()
    try:
        launcher = namespace.launcher() if namespace else []
        with tempfile.TemporaryDirectory(prefix="accelbench-job-") as scratch:
            outcomes = multiworker.run_trial(ctx.ref, cfg, launch.plan_local(engine, cfg.workers, scratch), progress,
                                             launcher=launcher, python=python)
    finally:
        if namespace:
            namespace.close()
    ctx.distributed = _distributed_block(engine.name, cfg, outcomes, 0, None, network)
    return multiworker.merge(outcomes)


def _engine(ref: BackendRef) -> Engine:
    """The backend's multi-worker engine (planning refuses ``--workers`` for a backend without one)."""
    if ref.backend.engine is None:
        raise WorkerFailure("failed", f"{ref.id} has no multi-worker engine")
    return ref.backend.engine


#: a multi-host job's engine must be reachable from the other hosts: the network must be trusted
MULTI_HOST_NETWORK = "the host's network (a multi-host job: its engine's ports are open to the other hosts)"


def _distributed_block(engine: str, cfg: RunConfig, outcomes: list[TrialOutcome], first_rank: int,
                       baseline: float | None, network: str) -> dict:
    """The record's ``distributed`` block; ``records.build`` adds the scaling efficiency."""
    from . import multiworker

    per_worker_batch = cfg.resolved_per_device_batch * cfg.resolved_device_count
    return {"engine": engine, "workers": cfg.workers, "per_worker_batch": per_worker_batch,
            "per_worker": multiworker.per_worker(outcomes, per_worker_batch, first_rank),
            "baseline_images_per_sec": baseline, "scaling_efficiency": None, "network": network}


def _trial_progress(ctx: RunContext, trial: int, observer: RunObserver):
    return lambda phase, done, total: observer.progress(ctx.ref.id, trial, phase, done, total)


class Unavailable(Exception):
    """The backend cannot run this config here; the message says why."""


#: a session's calls are timed one ``steps`` at a time by its caller (pytest-benchmark)
SESSION_NOTES = {"energy": "not read for a session's calls, which its caller times a few at a time",
                 "host_memory": "not read for a session's calls"}


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
        except envs.EnvironmentError_ as exc:
            raise Unavailable(f"no worker environment: {exc}") from None
        self.worker = Worker(ref, self.config, python=python)
        try:
            reason = self.worker.call("check")
            if reason:
                raise Unavailable(reason)
            self.prepared = self.worker.call("prepare")
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
        timing = self.worker.call("step", calls)
        self.first_marks = self.first_marks or timing.startup
        self.call_times.extend(t * timing.steps_per_call for t in timing.step_times)
        self.losses.extend(timing.losses)
        return timing.losses[-1] if timing.losses else None

    def record(self, timed_calls: int, warmup_calls: int, timed_by: str) -> dict:
        """A record of the last ``timed_calls`` calls, timed in the worker by the core timing loop
        (so the host<->worker pipe is not counted, as in ``accelbench run``)."""
        per_call = self.prepared.steps_per_call
        calls = self.call_times[-timed_calls:]
        config = self.config.replace(warmup_steps=warmup_calls * per_call, timed_steps=timed_calls * per_call,
                                     time_s=None, warmup="fixed")
        timing = Timing(step_times=[t / per_call for t in calls], wall_time_s=sum(calls),
                        timed_calls=timed_calls, steps_per_call=per_call,
                        losses=self.losses[-timed_calls:] if self.losses else [],
                        warmup_calls=warmup_calls, warmup_rule=f"fixed: {warmup_calls * per_call} steps",
                        timed_rule=f"counted: {timed_calls * per_call} steps")
        prepared = dataclasses.replace(self.prepared, settings={**self.prepared.settings, "timed_by": timed_by})
        outcome = TrialOutcome("ok", "", timing, prepared, device_memory=self.worker.call("device_memory"),
                               startup=self._startup(timed_calls, warmup_calls), footprint_notes=SESSION_NOTES)
        ctx = RunContext(self.ref, config, environment.collect(self.ref.backend.describe().requires),
                         [outcome], worker=self.worker_described)
        return build(ctx)

    def _startup(self, timed_calls: int, warmup_calls: int) -> footprint.Startup | None:
        """From the worker's start to its first call's end, that call, and the warm-up: the caller's
        calls before the ones it times."""
        if self.first_marks is None:
            return None
        end = len(self.call_times) - timed_calls
        marks = self.first_marks
        return footprint.Startup(marks.first_step_ended - self.worker.spawned,
                                 marks.first_step_ended - marks.first_step_started,
                                 sum(self.call_times[max(0, end - warmup_calls):end]), self.prepared.compile_s)

    def close(self) -> None:
        self.worker.close()


def run_rank(ref: BackendRef, config: RunConfig, launch_plan, rank: int) -> dict:
    """One rank of a multi-host job (``accelbench worker``): its record, merged later with the
    other ranks' by ``accelbench merge``. Its throughput is the job's as this rank timed it."""
    from . import multiworker

    [setup] = envs.setups_for(ref)
    try:
        python, described = envs.interpreter(setup, True, lambda text: print(text, file=sys.stderr))
    except envs.EnvironmentError_ as exc:
        return build(RunContext(ref, config, environment.collect(ref.backend.describe().requires),
                                [TrialOutcome("unavailable", f"no worker environment: {exc}")]))
    outcomes = multiworker.run_trial(ref, config, launch_plan, python=python)
    ctx = RunContext(ref, config, environment.collect(ref.backend.describe().requires), [multiworker.merge(outcomes)],
                     worker=described)
    ctx.distributed = _distributed_block(_engine(ref).name, config, outcomes, rank, None,
                                         MULTI_HOST_NETWORK)
    return build(ctx)


#: converting a full ImageNet copy takes hours; a hang is the user's to stop here
DATASET_TIMEOUT_S = 7 * 24 * 3600.0


class DatasetWriter:
    """Writes one split in one format, and reads it back, in a worker of the backend owning the
    format (the framework's own writer and reader); one worker serves every split."""

    def __init__(self, ref: BackendRef):
        self.ref = ref
        self.worker: Worker | None = None

    def __call__(self, examples: list, stem: str) -> tuple[list[str], list[tuple[str, int]]]:
        files = self._call("write_dataset", [(e.path, e.label) for e in examples], stem)
        return files, self.read(files)

    def read(self, files: list[str]) -> list[tuple[str, int]]:
        """(sha256, label) of every record of these files, read by the framework."""
        return [tuple(item) for item in self._call("read_dataset", files)]

    def _call(self, command: str, *args: Any) -> Any:
        if self.worker is None:
            [setup] = envs.setups_for(self.ref)
            try:
                python, _ = envs.interpreter(setup, True, lambda text: print(text, file=sys.stderr))
            except envs.EnvironmentError_ as exc:
                raise RuntimeError(f"{self.ref.id}: no worker environment: {exc}") from None
            self.worker = Worker(self.ref, RunConfig(device="cpu", device_count=1), DATASET_TIMEOUT_S, label="data",
                                 python=python)
        worker = self.worker
        try:
            return worker.call(command, *args)
        except WorkerFailure as failure:
            raise RuntimeError(f"{self.ref.id}: {command} failed: {worker.keep_log(failure).reason}") from None

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()


@contextlib.contextmanager
def dataset_writers(refs: list[BackendRef]) -> Iterator[dict[str, DatasetWriter]]:
    """One writer per dataset format, from the first available backend that trains from it;
    their workers are closed on leaving."""
    writers: dict[str, DatasetWriter] = {}
    # a backend the host's Python runs first: no environment is made just to write a format
    for ref in sorted(refs, key=lambda r: not envs.host_satisfies(r.backend.describe().environment)):
        fmt = ref.backend.describe().data_format
        if fmt and fmt not in writers and ref.unavailable_reason() is None:
            writers[fmt] = DatasetWriter(ref)
    try:
        yield writers
    finally:
        for writer in writers.values():
            writer.close()


def convert_dataset(source: str, out: Path, refs: list[BackendRef], preset: str | None = None,
                    seed: int = 0) -> dict[str, Any]:
    """``accelbench data``: the source in every installed framework's format, verified."""
    with dataset_writers(refs) as writers:
        return datasets.convert(source, out, writers, preset, seed)


def default_dataset(refs: list[BackendRef]) -> Path:
    """The embedded digits, converted once (for every installed format) into the user's cache."""
    with dataset_writers(refs) as writers:
        return datasets.default_digits(datasets.cache_folder(), writers)
