"""The typed Record and its JSON form (made once, by ``to_json``), validation before every write,
and atomic results files."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from accelbench.analysis import peaks, stats
from accelbench.backend import DeviceMemory, Prepared
from accelbench.environments.locks import folder_lock
from accelbench.errors import UsageError
from accelbench.execution.timing import ProcessUsage, Timing
from accelbench.planning.config import RunConfig, lever_text
from accelbench.records import footprint, validation
from accelbench.records.blocks import Block, Cost, Distributed, Environment, Installed, ScheduleBlock, Training, WorkerEnvironment
from accelbench.records.jsonform import from_json, omitted_while_none, to_object
from accelbench.registry import BackendRef

if TYPE_CHECKING:
    from accelbench.execution.training import TrainingResult


class InvalidRecord(Exception):
    """A record failed its schema; it is never written."""


@dataclass
class TrialOutcome:
    """What one worker process produced."""

    status: str
    reason: str = ""
    timing: Timing | None = None
    prepared: Prepared | None = None
    #: what ``teardown`` returned (e.g. a weights checksum)
    final: dict[str, Any] | None = None
    #: train mode: the epoch loop's result
    training: TrainingResult | None = None
    #: the schedule's round this trial ran in (a lockstep run's pair), and when it started and ended (UTC)
    round: int | None = None
    #: its place in that round (0: it ran first)
    position: int | None = None
    started_utc: str | None = None
    ended_utc: str | None = None
    #: a lockstep trial's blocks, counted or not
    blocks: list[Block] | None = None
    #: the framework's device memory peak (``Backend.device_memory``), read after the timed steps
    device_memory: DeviceMemory | None = None
    #: when the worker's first step and warm-up ran, from the host starting it
    startup: footprint.Startup | None = None
    #: where a figure of ``accelbench.records.footprint`` differs from a single worker's: why it is missing
    #: ("startup", "host_memory", "device_memory", "energy") or what it is ("host_source")
    footprint_notes: dict[str, str] | None = None
    #: what each of its worker processes read of its own Python (``Worker.installed``): one per
    #: process, every rank of a multi-worker trial
    installed: list[Installed] | None = None


@dataclass
class RunContext:
    ref: BackendRef
    config: RunConfig  # resolved
    environment: Environment
    outcomes: list[TrialOutcome] = field(default_factory=list)
    #: the ``distributed`` block of a multi-worker run
    distributed: Distributed | None = None
    #: the ``schedule`` block: the run this record's trials were interleaved in, and why it stopped
    schedule: ScheduleBlock | None = None
    #: ``environment.worker``: the Python the workers ran when it was not the host's
    worker: WorkerEnvironment | None = None


def utc_now(timespec: str = "seconds") -> str:
    return datetime.now(timezone.utc).isoformat(timespec=timespec).replace("+00:00", "Z")


@dataclass
class Named:
    name: str
    version: str


@dataclass
class ModelRef:
    name: str
    variant: str | None


@dataclass
class DeviceRef:
    kind: str
    count: int
    #: as the framework reports it; empty when the run never reached the device
    name: str


@dataclass
class BatchRef:
    global_: int = field(metadata={"json_name": "global"})
    per_device: int
    source: str
    semantics: str


@dataclass
class DataRef:
    source: str
    placement: str | None


@dataclass
class Steps:
    warmup: int
    timed: int
    steps_per_sample: int
    warmup_rule: str | None = omitted_while_none()
    timed_rule: str | None = omitted_while_none()


@dataclass
class TrialRow:
    """One trial's (or one worker's) figures, as that process timed them."""

    index: int
    status: str
    reason: str
    images: int | None
    wall_time_s: float | None
    images_per_sec: float | None
    step_times_s: list[float]
    losses: list[float | None]
    warmup_steps: int | None = omitted_while_none()
    round: int | None = omitted_while_none()
    #: its place in its round, 0 for the trial that ran first (since 1.12)
    position: int | None = omitted_while_none()
    started_utc: str | None = omitted_while_none()
    ended_utc: str | None = omitted_while_none()
    process: ProcessUsage | None = omitted_while_none()
    #: lockstep: every block of this trial's process, with the machine's foreign load during it
    blocks: list[Block] | None = omitted_while_none()
    startup: footprint.Startup | None = omitted_while_none()
    #: the energy counters' joules over this trial's timed steps
    energy_j: float | None = omitted_while_none()

    @classmethod
    def of(cls, index: int, outcome: TrialOutcome, batch: int) -> TrialRow:
        """``batch`` images per step, as the trial's process timed them."""
        timing = outcome.timing
        row = cls(
            index,
            outcome.status,
            outcome.reason,
            None,
            None,
            None,
            [],
            [],
            round=outcome.round,
            position=outcome.position,
            started_utc=outcome.started_utc,
            ended_utc=outcome.ended_utc,
            blocks=outcome.blocks,
        )
        if not timing:
            return row
        images = batch * timing.timed_steps
        return dataclasses.replace(
            row,
            images=images,
            wall_time_s=timing.wall_time_s,
            images_per_sec=images / timing.wall_time_s,
            step_times_s=list(timing.step_times),
            losses=list(timing.losses),
            warmup_steps=timing.warmup_calls * timing.steps_per_call,
            process=timing.usage,
            startup=outcome.startup,
            energy_j=timing.energy.joules if timing.energy else None,
        )


@dataclass
class Throughput:
    """Pooled images/sec over every trial: all images / all wall time of the timed steps."""

    images_per_sec: float
    images: int
    wall_time_s: float
    ci95: tuple[float, float]
    ci_method: str
    #: drift over the rounds of an interleaved run
    trend: stats.Trend | None = omitted_while_none()


@dataclass
class Flops:
    per_image: float
    achieved_per_s: float | None = None
    peak_per_sec: float | None = omitted_while_none()
    peak_source: str | None = omitted_while_none()
    utilisation: float | None = omitted_while_none()
    #: why there is no peak to compare with (and how to get one), when there is none
    peak_reason: str | None = omitted_while_none()


@dataclass
class Record:
    """One run's record; ``to_json`` gives the form the result schema checks and files hold."""

    schema_version: str
    status: str
    reason: str
    timestamp_utc: str
    config_hash: str
    plugin: Named
    backend: Named
    #: as the framework reports itself, else its installed distribution's version
    framework: Named
    model: ModelRef
    precision: str
    device: DeviceRef
    batch: BatchRef
    image_size: int
    data: DataRef
    steps: Steps
    trials: list[TrialRow]
    throughput: Throughput | None
    step_time: stats.StepTimeSummary | None
    flops: Flops | None
    #: what the backend read back from its framework, free-form per plugin
    settings: dict[str, Any]
    #: the resolved RunConfig's fields (``run_config()`` reads them back)
    config: dict[str, Any]
    environment: Environment
    warnings: list[str]
    distributed: Distributed | None = omitted_while_none()
    schedule: ScheduleBlock | None = omitted_while_none()
    mode: str | None = omitted_while_none()
    training: Training | None = omitted_while_none()
    #: what the run cost besides time (ok records, since 1.11)
    memory: footprint.Memory | None = omitted_while_none()
    energy: footprint.Energy | None = omitted_while_none()
    startup: footprint.StartupSummary | None = omitted_while_none()
    #: cost-performance at a price, set by ``accelbench.analysis.cost`` when a command prices its records
    cost: Cost | None = omitted_while_none()

    def to_json(self) -> dict[str, Any]:
        """The form the result schema checks and results files hold."""
        return to_object(self)

    @classmethod
    def from_json(cls, form: dict[str, Any]) -> Record:
        """A record as a results file holds it, of any result schema version since 1.0."""
        return from_json(cls, form)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def __getitem__(self, key: NoReturn) -> NoReturn:
        # records were dicts until result schema 1.11's accelbench: say what replaced the subscript.
        # (``key: NoReturn``: the type checker refuses every subscript, as it would without this)
        raise TypeError(
            f"a Record is typed: record[{key!r}] is record.{'global_' if key == 'global' else key} "
            f"(record.to_json() gives the JSON form)"
        )

    def run_config(self) -> RunConfig:
        return RunConfig.from_fields(self.config)

    def variation(self) -> list[str]:
        """What sets this run apart from its backend's other runs in one invocation: the
        requirements added to its environment (``--env``) and its lever (``--lever``)."""
        added = self.environment.worker.added if self.environment.worker else None
        lever = self.config.get("lever") or {}
        return [*(added or []), *([f"lever {lever_text(lever)}"] if lever else [])]

    def devices(self) -> int:
        """Devices across every worker of the run."""
        return self.device.count * (self.distributed.workers if self.distributed else 1)

    def images_per_sec(self) -> float:
        """The pooled throughput of an ok record (ValueError for one without)."""
        if self.throughput is None:
            raise ValueError(f"a {self.status} record has no throughput")
        return self.throughput.images_per_sec

    def ok_trials(self) -> list[TrialRow]:
        return [t for t in self.trials if t.status == "ok"]


@dataclass
class ResultsDocument:
    """A results file: its records, and the command that wrote it."""

    schema_version: str
    created_utc: str
    records: list[Record]
    command: list[str] | None = omitted_while_none()

    def to_json(self) -> dict[str, Any]:
        return to_object(self)

    @classmethod
    def from_json(cls, form: dict[str, Any]) -> ResultsDocument:
        return from_json(cls, form)


def backend_label(record: Record) -> str:
    """``plugin:backend``, as tables and the docs name a record's backend."""
    return f"{record.plugin.name}:{record.backend.name}"


def build(ctx: RunContext) -> Record:
    """The run's record, always schema-valid. When what the backend reported breaks the schema
    (a third-party plugin broke the contract), the record is ``failed`` with the validation
    error as its reason, and none of the backend's figures are kept."""
    try:
        record = _assemble(ctx)
        problems = validation.errors("result", record.to_json())
    except (TypeError, ValueError, KeyError, AttributeError) as exc:  # values no record can hold
        problems = [f"{type(exc).__name__}: {exc}"]
    else:
        if not problems:
            return record
    reason = f"the backend's results broke the result schema: {problems[0]}"
    failed = [
        TrialOutcome("failed", reason, round=o.round, position=o.position, started_utc=o.started_utc, ended_utc=o.ended_utc)
        for o in ctx.outcomes
    ] or [TrialOutcome("failed", reason)]
    return _assemble(RunContext(ctx.ref, ctx.config, ctx.environment, failed, schedule=ctx.schedule, worker=ctx.worker))


def _assemble(ctx: RunContext) -> Record:
    """Assemble a record; statistics only when every trial is ok (a number is never invented)."""
    info = ctx.ref.backend.describe()
    cfg = ctx.config
    reported = next((o.prepared for o in ctx.outcomes if o.prepared), None)
    prepared = reported or Prepared(device_name="")  # a run that never prepared reports nothing
    status, reason = _overall_status(ctx.outcomes)
    record = Record(
        schema_version=validation.RESULT_SCHEMA_VERSION,
        status=status,
        reason=reason,
        timestamp_utc=utc_now(),
        config_hash=cfg.config_hash(),
        plugin=Named(ctx.ref.plugin.name, ctx.ref.plugin.version),
        backend=Named(info.name, info.version),
        framework=Named(info.framework, prepared.framework_version or ctx.ref.framework_version()),
        model=ModelRef(cfg.resolved_model, cfg.variant),
        precision=cfg.resolved_precision,
        device=DeviceRef(cfg.device, cfg.resolved_device_count, prepared.device_name),
        batch=BatchRef(cfg.resolved_global_batch, cfg.resolved_per_device_batch, cfg.resolved_batch_source, info.batch_semantics),
        image_size=cfg.image_size,
        data=DataRef(cfg.data, reported.data_placement if reported else None),
        steps=_steps(cfg, prepared.steps_per_call, ctx.outcomes),
        trials=[TrialRow.of(i, o, cfg.resolved_global_batch) for i, o in enumerate(ctx.outcomes)],
        throughput=None,
        step_time=None,
        flops=None,
        # a copy: the record is rebuilt after every trial, and its building edits settings
        settings=dict(prepared.settings),
        config=cfg.to_dict(),
        environment=_environment(ctx),
        warnings=list(prepared.warnings) + _differing_workers(ctx),
        distributed=dataclasses.replace(ctx.distributed) if ctx.distributed else None,
        schedule=ctx.schedule,
    )
    if cfg.mode == "train":
        record.mode = "train"
        _add_training(record, cfg, ctx.outcomes[-1])
    if status == "ok":
        record.throughput, record.step_time, warnings = statistics(record.trials, cfg)
        record.warnings += warnings
        _add_scaling_efficiency(record)
        record.memory = footprint.memory_of(ctx.outcomes)
        record.energy = footprint.energy_of(ctx.outcomes, record.throughput.images)
        record.startup = footprint.startup_of(ctx.outcomes)
    if prepared.flops_per_image:
        record.flops = Flops(prepared.flops_per_image)
        record.warnings += complete_flops(
            record.flops,
            record.throughput,
            record.precision,
            record.device,
            record.framework,
            record.environment,
            record.devices(),
        )
    return record


def _environment(ctx: RunContext) -> Environment:
    """The host's environment, with the Python the workers ran and what they read installed there:
    ``packages`` names the worker's version wherever it differs from the host's (the host's own
    stay in ``lock``), ``worker`` holds the worker's Python, its version, packages and lock."""
    reading = next(iter(worker_readings(ctx)), None)
    worker = ctx.worker
    if reading is not None:
        worker = dataclasses.replace(
            worker or WorkerEnvironment("host", reading.python),
            python=reading.python,
            python_version=reading.python_version,
            packages=dict(reading.packages),
            lock=reading.lock,
        )
    if not worker:
        return ctx.environment
    packages = {**ctx.environment.packages, **(worker.packages or {})}
    return dataclasses.replace(ctx.environment, packages=packages, worker=worker)


def _differing_workers(ctx: RunContext) -> list[str]:
    """A warning when the run's worker processes did not all run the same installed distributions
    (ranks on hosts installed apart, an environment changed between trials): the record keeps
    the first one's."""
    readings = worker_readings(ctx)
    if len(readings) < 2:
        return []
    first, *others = readings
    changed = sorted({pin for other in others for pin in set(other.lock.distributions) ^ set(first.lock.distributions)})
    return [
        f"the run's worker processes ran {len(readings)} different sets of installed distributions "
        f"(environment.worker keeps the first's; differing: {', '.join(changed[:8]) or 'the interpreter'})"
    ]


def worker_readings(ctx: RunContext) -> list[Installed]:
    """The distinct readings of the run's worker processes (by their lock), in the order read."""
    distinct: dict[str, Installed] = {}
    for outcome in ctx.outcomes:
        for reading in outcome.installed or ():
            distinct.setdefault(reading.lock.sha256, reading)
    return list(distinct.values())


def complete_flops(
    flops: Flops,
    throughput: Throughput | None,
    precision: str,
    device: DeviceRef,
    framework: Named,
    environment: Environment,
    devices: int,
) -> list[str]:
    """Achieved FLOP/s from the throughput, and the share of the run's peak; the warnings that
    go with them."""
    if throughput is None:
        return []
    flops.achieved_per_s = throughput.images_per_sec * flops.per_image
    warning = add_utilisation(flops, run_peak(precision, device, framework, environment, devices), device.kind)
    return [warning] if warning else []


def run_peak(precision: str, device: DeviceRef, framework: Named, environment: Environment, devices: int) -> peaks.Peak | None:
    """The peak a run is compared with: its accelerators' published one, else one ``accelbench
    peak`` measured here with its framework (None: neither, and none is invented)."""
    names = [device.name] + [a.name for a in environment.accelerators_of(device.kind)]
    published = (peaks.published(device.kind, name, precision, devices) for name in names if name)
    return next((peak for peak in published if peak), None) or peaks.measured(
        environment, device.kind, device.name or "", framework.name, framework.version or "", precision, devices
    )


def add_utilisation(flops: Flops, peak: peaks.Peak | None, device_kind: str = "cpu") -> str | None:
    """Achieved / peak into ``flops`` (or, with no peak, the reason and what gives one); a
    warning when the run beat its peak."""
    if flops.achieved_per_s is None:
        return None
    if peak is None:
        flops.peak_reason = (
            f"no published peak for this {device_kind} and no peak measured here for this framework, "
            f"version and precision: run `accelbench peak`"
        )
        return None
    flops.peak_per_sec, flops.peak_source = peak.flops_per_s, peak.source
    flops.utilisation = flops.achieved_per_s / peak.flops_per_s
    if flops.utilisation <= 1:
        return None
    # reported as measured, never clamped: the peak is what is wrong
    return (
        f"this run achieved {flops.utilisation:.0%} of the peak it is compared with: that peak "
        f"({peak.flops_per_s / 1e9:.0f} GFLOP/s) is too low (measured while the machine was busy?); "
        f"run `accelbench peak` again"
    )


def _add_scaling_efficiency(record: Record) -> None:
    """Multi-worker throughput / (workers x the 1-worker baseline of the same per-worker batch)."""
    dist = record.distributed
    if dist and dist.baseline_images_per_sec and record.throughput:
        dist.scaling_efficiency = record.throughput.images_per_sec / (dist.workers * dist.baseline_images_per_sec)


def _add_training(record: Record, cfg: RunConfig, outcome: TrialOutcome) -> None:
    """Train mode's block: the curve and time to target (absent when the run did not finish)."""
    from accelbench.execution import training

    if outcome.training is None:
        return
    preprocessing = record.settings.pop("preprocessing", {})
    spec = cfg.train_spec
    startup = outcome.startup
    # the host started the worker this long before the first step began (one clock for both: footprint.Startup)
    init_s = startup.worker_to_first_step_s - startup.first_step_s if startup else None
    record.training = training.summary(outcome.training, spec, cfg.resolved_global_batch, preprocessing, init_s)


def _steps(cfg: RunConfig, per_call: int, outcomes: list[TrialOutcome]) -> Steps:
    """Steps actually run (the first trial's; every trial row has its own), and how their number
    was decided. In train mode: the first epoch is the warm-up, the later epochs' steps the timed
    ones; a run of one epoch times that epoch and excludes nothing (the rules say so). A run that
    never stepped shows the counts it was given (0 timed steps for a time box)."""
    trained = next((o for o in outcomes if o.training and o.timing), None)
    if trained and trained.timing:
        steady = trained.timing
        return Steps(steady.warmup_calls, max(1, steady.timed_calls), 1, steady.warmup_rule, steady.timed_rule)
    timing = next((o.timing for o in outcomes if o.timing), None)
    if timing:
        return Steps(
            timing.warmup_calls * per_call,
            timing.timed_calls * per_call,
            timing.steps_per_sample,
            timing.warmup_rule,
            timing.timed_rule,
        )

    def whole(steps: int) -> int:
        return math.ceil(steps / per_call) * per_call

    return Steps(whole(cfg.warmup_steps), whole(cfg.timed_steps or 0), per_call)


def _overall_status(outcomes: list[TrialOutcome]) -> tuple[str, str]:
    for outcome in outcomes:
        if outcome.status != "ok":
            return outcome.status, outcome.reason or outcome.status
    if not outcomes:
        return "skipped", "no trial ran"
    return "ok", ""


def statistics(trials: list[TrialRow], cfg: RunConfig) -> tuple[Throughput, stats.StepTimeSummary, list[str]]:
    """Pooled throughput with its interval, the step-time summary, and the warnings they call for."""
    timed = [(t.images, t.wall_time_s) for t in trials if t.images is not None and t.wall_time_s is not None]
    images, wall = sum(i for i, _ in timed), sum(w for _, w in timed)
    steps = [s for t in trials for s in t.step_times_s]
    ci, method = stats.throughput_ci(
        [i for i, _ in timed], [w for _, w in timed], steps, images_per_step=cfg.resolved_global_batch, seed=cfg.seed
    )
    throughput = Throughput(images / wall, images, wall, ci, method)
    step_time = stats.step_time_summary(steps)
    warnings = []
    if step_time.cv > stats.CV_WARNING:
        warnings.append(
            f"step-time coefficient of variation {step_time.cv:.1%} exceeds "
            f"{stats.CV_WARNING:.0%}: the machine was noisy or the run too short"
        )
    if any(loss is None for t in trials for loss in t.losses):
        warnings.append("the training loss was NaN or infinite during timed steps")
    throughput.trend = _trend(trials)
    if throughput.trend and throughput.trend.significant:
        warnings.append(_drift_warning(throughput.trend))
    return throughput, step_time, warnings


def _trend(trials: list[TrialRow]) -> stats.Trend | None:
    """Drift diagnostic: does images/sec move with the round index? (interleaved runs only)"""
    rounds = [(t.round, t.images_per_sec) for t in trials if t.round is not None and t.images_per_sec is not None]
    return stats.trend([r for r, _ in rounds], [rate for _, rate in rounds])


def _drift_warning(found: stats.Trend) -> str:
    return (
        f"images/sec trended {found.slope_per_round:+.2%} per round over {found.rounds} rounds "
        f"({found.change_over_run:+.1%} in all, p={found.p_value:.3f}): the machine's speed drifted; "
        f"compare runs interleaved in one invocation (paired rounds), not across invocations"
    )


def check(record: Record) -> None:
    problems = validation.errors("result", record.to_json())
    if problems:
        raise InvalidRecord("; ".join(problems))


def check_all(records: list[Record]) -> None:
    for record in records:
        check(record)


def results_document(records: list[Record], command: list[str] | None = None) -> ResultsDocument:
    return ResultsDocument(validation.RESULT_SCHEMA_VERSION, utc_now(), list(records), list(command) if command else None)


def write_results(path: Path, records: list[Record], command: list[str] | None = None) -> None:
    """Validate every record, then write atomically (temp file in the same folder + rename);
    ``command``: the command line that wrote it, kept in the file."""
    document = results_document(records, command).to_json()
    problems = validation.errors("results", document)
    if problems:
        raise InvalidRecord("; ".join(problems))
    write_document(path, document)


def write_document(path: Path, document: dict[str, Any]) -> None:
    """Write a JSON document atomically: a temp file in the same folder, fsynced, then renamed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(document, fh, indent=1, allow_nan=False)  # NaN is not JSON: never write it
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide results from other users
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class ResultsWriter:
    """One invocation's records, written into a results file other invocations may be writing
    too (two teammates, or a scheduler's array job, pointing at one file).

    Every write takes an exclusive lock (on the file's folder: ``accelbench.environments.locks``, which leaves
    no lock file behind), reads what
    is on disk at that moment, replaces this writer's own earlier records (told by their exact
    JSON) with its current ones, keeps every other writer's, and writes atomically. So N
    concurrent runs end with all N runs' records. ``force``: the first write starts the file
    afresh. A writer that cannot get the lock within ``LOCK_TIMEOUT_S``, or finds the file no
    longer a results file, keeps its records in a side file (``side_path``), never drops them."""

    LOCK_TIMEOUT_S = 60.0

    def __init__(self, path: Path, command: list[str] | None = None, force: bool = False):
        self.path, self.command, self.fresh = path, command, force
        self.mine: set[str] = set()
        #: where the records went instead, when the file could not be written (None: the file)
        self.side_path: Path | None = None

    def write(self, records: list[Record]) -> Path:
        """Merge ``records`` (this run's, all of them so far) into the file; the path written."""
        # checked once, here; the other writers' records were checked with their file in _on_disk
        for record in records:
            check(record)
        try:
            with folder_lock(self.path.absolute().parent, self.LOCK_TIMEOUT_S):
                others = [] if self.fresh else [r for r in self._on_disk() if _canonical(r) not in self.mine]
                write_document(self.path, results_document([*others, *records], self.command).to_json())
        except (TimeoutError, InvalidRecord, OSError, ValueError) as exc:
            self.side_path = self.side_path or self.path.with_name(f"{self.path.stem}.{os.getpid()}.json")
            write_document(self.side_path, results_document(records, self.command).to_json())
            print(f"warning: could not write {self.path} ({exc}); this run's records are in {self.side_path}", file=sys.stderr)
            return self.side_path
        self.fresh = False
        self.mine = {_canonical(r) for r in records}
        return self.path

    def _on_disk(self) -> list[Record]:
        if not self.path.exists():
            return []
        document = json.loads(self.path.read_text())
        problems = validation.errors("results", document)
        if problems:
            raise InvalidRecord(f"it is no longer a results file: {problems[0]}")
        return ResultsDocument.from_json(document).records


def _canonical(record: Record) -> str:
    return json.dumps(record.to_json(), sort_keys=True)


def read_json(path: str | Path, what: str = "results file") -> Any:
    """A JSON document; UsageError naming ``what`` and the file when it is unreadable, not UTF-8 or
    not strict JSON (NaN and Infinity are not JSON)."""
    from accelbench.planning import inputs

    return inputs.read_json(path, what)


def read_document(path: str | Path) -> ResultsDocument:
    """An accelbench results file; UsageError when it is unreadable or invalid."""
    return results_from_json(read_json(path), f"results file {path}")


def results_from_json(document: Any, what: str) -> ResultsDocument:
    """A results document read from JSON, validated first; UsageError naming ``what`` when invalid."""
    validation.validate_or_raise("results", document, what=what)
    return ResultsDocument.from_json(document)


def read_results(path: str | Path) -> list[Record]:
    """Records of an accelbench results file; UsageError when it is unreadable or invalid."""
    return read_document(path).records


def merge_ranks(rank_records: list[Record]) -> Record:
    """One record from the per-rank records of a multi-host job (``accelbench merge``).

    Global images/sec = all workers' images / the slowest worker's wall time; every worker's
    figures stay in ``distributed.per_worker``.
    """
    import copy

    blocks = [r.distributed for r in rank_records]
    if not rank_records or any(block is None for block in blocks):
        raise UsageError("merge needs the per-rank records written by `accelbench worker`")
    if len({r.config_hash for r in rank_records}) != 1:
        raise UsageError("these records come from different run configs")
    rows = sorted((row for block in blocks if block for row in block.per_worker), key=lambda row: row.rank)
    workers = _distributed(rank_records[0]).workers
    if [row.rank for row in rows] != list(range(workers)):
        raise UsageError(f"need exactly one record per rank 0..{workers - 1}, got ranks {[row.rank for row in rows]}")
    merged = copy.deepcopy(next(r for r in rank_records if _distributed(r).per_worker[0].rank == 0))
    dist = _distributed(merged)
    dist.per_worker = rows
    hosts = list(dict.fromkeys(row.host for row in rows if row.host is not None))  # in rank order
    if hosts:
        dist.hosts = hosts
    failed = next((r for r in rank_records if not r.ok), None)
    merged.timestamp_utc = utc_now()
    merged.throughput = merged.step_time = None
    merged.warnings = []
    if failed:
        rank = _distributed(failed).per_worker[0].rank
        merged.status, merged.reason = failed.status, f"rank {rank}: {failed.reason}"
        return merged
    slowest = max(rows, key=lambda row: row.wall_time_s or 0.0)
    wall = slowest.wall_time_s or 0.0
    images = sum(row.images or 0 for row in rows)
    merged.trials = [
        dataclasses.replace(
            merged.trials[0], images=images, wall_time_s=wall, images_per_sec=images / wall, step_times_s=slowest.step_times_s
        )
    ]
    merged.throughput, merged.step_time, warnings = statistics(merged.trials, merged.run_config())
    merged.warnings += warnings
    if merged.flops:
        merged.flops = Flops(merged.flops.per_image)
        merged.warnings += complete_flops(
            merged.flops,
            merged.throughput,
            merged.precision,
            merged.device,
            merged.framework,
            merged.environment,
            merged.device.count * workers,
        )
    return merged


def _distributed(record: Record) -> Distributed:
    if record.distributed is None:
        raise UsageError("merge needs the per-rank records written by `accelbench worker`")
    return record.distributed
