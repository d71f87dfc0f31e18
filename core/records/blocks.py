"""The typed blocks of a record that other rooms fill in: the machine and software
(``Environment``), a multi-worker run (``Distributed``), the schedule a record's trials ran in
(``ScheduleBlock``), train mode's time to accuracy (``Training``), what a run cost (``Cost``), and a
lockstep trial's blocks (``Block``). Their JSON form is ``accelbench.records.jsonform``'s; the result
schema (``schemas/result.schema.json``) says what each field means."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from accelbench.records.jsonform import omitted_while_none, the_rest


@dataclass
class Lock:
    """Every distribution installed in a Python, that Python's version, and a hash of both."""

    python: str
    distributions: list[str]
    sha256: str


@dataclass(frozen=True)
class Installed:
    """What a worker process read of its own Python when it started (``accelbench.execution.worker_main``): its
    interpreter, that Python's version, the versions of the distributions its backend names, and
    the lock of every distribution installed there. Read in the worker, never in the host: a worker
    may run another Python than the host's (an environment of its own)."""

    python: str
    python_version: str
    packages: dict[str, str]
    lock: Lock


@dataclass
class Accelerator:
    kind: str
    name: str
    driver: str = ""
    memory: str = ""
    path: str | None = omitted_while_none()
    #: what other tools' records added
    more: dict[str, Any] = the_rest()


@dataclass
class WorkerEnvironment:
    """The Python the workers ran (``kind``: the host's, an environment made for them, one the
    user gave) and, read in a worker (``Installed``), its version and what was installed there."""

    kind: str
    python: str
    key: str | None = omitted_while_none()
    requirements: list[str] | None = omitted_while_none()
    plugin: str | None = omitted_while_none()
    added: list[str] | None = omitted_while_none()
    python_version: str | None = omitted_while_none()
    packages: dict[str, str] | None = omitted_while_none()
    lock: Lock | None = omitted_while_none()


@dataclass(kw_only=True)
class Environment:
    """The machine and software that produced a record (``accelbench.environments.machine.collect``), its
    fields in the order records have always written them."""

    hostname: str
    cpu_model: str
    #: the vector and matrix units that decide a framework's kernels (absent in the oldest records)
    cpu_flags: list[str] | None = omitted_while_none()
    cpu_cores: int
    #: physical CPU packages (distinct ``physical id`` in /proc/cpuinfo; since 1.14)
    cpu_sockets: int | None = omitted_while_none()
    memory_bytes: int
    memory_returned_to_host: bool | None = omitted_while_none()
    os: str
    python: str
    packages: dict[str, str]
    accelerators: list[Accelerator]
    lock: Lock | None = omitted_while_none()
    worker: WorkerEnvironment | None = omitted_while_none()
    #: keys a newer writer added
    more: dict[str, Any] = the_rest()

    def accelerators_of(self, kind: str) -> list[Accelerator]:
        return [a for a in self.accelerators if a.kind == kind]


@dataclass
class WorkerRow:
    """One worker of a multi-worker run, as its process timed its steps."""

    rank: int
    status: str
    images: int | None
    wall_time_s: float | None
    images_per_sec: float | None
    step_times_s: list[float]
    #: what the backend's ``teardown`` returned (e.g. a weights checksum)
    final: dict[str, Any]
    host: str | None = omitted_while_none()
    local_rank: int | None = omitted_while_none()


@dataclass
class Launcher:
    """What started a multi-host job's ranks (``accelbench.planning.launchers``): ``flags``
    when the user gave every rank by hand."""

    name: str
    job_id: str | None = omitted_while_none()
    #: the job's nodes, as the launcher listed them (a Slurm node list expanded)
    nodes: list[str] | None = omitted_while_none()


@dataclass
class Distributed:
    """A multi-worker run: global images/sec = all workers' images / the slowest worker's wall time."""

    engine: str
    workers: int
    per_worker_batch: int
    per_worker: list[WorkerRow]
    baseline_images_per_sec: float | None
    scaling_efficiency: float | None
    network: str | None = omitted_while_none()
    hosts: list[str] | None = omitted_while_none()
    #: a multi-host job's launcher (since result schema 1.14)
    launcher: Launcher | None = omitted_while_none()


@dataclass
class TimeSplit:
    """Where a lockstep run's wall time went, in seconds: the parts add up to ``wall_s``."""

    wall_s: float
    #: starting each pair's processes to the end of ``prepare`` (imports, model build, compile)
    opening_s: float
    #: the sides' warm-ups, one side at a time
    warmup_s: float
    #: the counted blocks: the steps the comparison rests on
    counted_s: float
    #: blocks run on a busy machine, kept in the record but not counted
    uncounted_s: float
    #: between blocks: parking and waking, settling, the pipe, a watch of the machine's load
    gaps_s: float
    #: waiting for a quiet machine
    waiting_s: float
    #: each pair's device-memory read, teardown and exit
    closing_s: float
    #: the rest: making worker environments, records and looks between pairs
    other_s: float

    @property
    def counted_share(self) -> float:
        return self.counted_s / self.wall_s if self.wall_s > 0 else 0.0

    def describe(self) -> str:
        parts = (
            ("opening processes", self.opening_s),
            ("warm-up", self.warmup_s),
            ("counted blocks", self.counted_s),
            ("busy blocks", self.uncounted_s),
            ("gaps between blocks", self.gaps_s),
            ("waiting for quiet", self.waiting_s),
            ("closing", self.closing_s),
            ("other", self.other_s),
        )
        shown = ", ".join(f"{name} {seconds:.0f} s" for name, seconds in parts if seconds >= 0.5)
        return f"{self.wall_s:.0f} s: {shown} ({self.counted_share:.0%} counted)"


@dataclass
class Efficiency:
    """How close a comparison came to what its wall time allowed: ``ideal_half_width`` is the 95%
    half-width (relative) if every second had been counted steps, split evenly between the two
    sides, with the step-time spread they showed; ``half_width`` the one the run reached (at its
    last look's confidence); ``efficiency`` is (ideal / reached) squared, the share of the run a
    perfect design would have needed for the same interval."""

    efficiency: float
    ideal_half_width: float
    half_width: float


@dataclass
class SpendingPlan:
    """How an ``until`` run spent its error over its looks (``accelbench.analysis.stats.Spending``): the
    looks after ``first`` .. ``last`` samples, ``error`` in all, and in words."""

    first: int
    last: int
    error: float
    method: str


@dataclass
class LockstepSettings:
    blocks_per_pair: int
    block_s: float
    when_busy: str
    busy_share: float
    allocation: str | None = omitted_while_none()
    #: since 1.13: where the run's wall time went, and (a comparison of two sides) its efficiency
    time: TimeSplit | None = omitted_while_none()
    efficiency: Efficiency | None = omitted_while_none()


@dataclass
class ScheduleBlock:
    """How a record's trials were ordered among the other runs of one invocation."""

    kind: str
    run_id: str
    rounds: int
    plans: int
    position: int
    stop_reason: str
    stop_rule: str | None = None
    max_time_s: float | None = None
    elapsed_s: float | None = omitted_while_none()
    looks: int | None = omitted_while_none()
    confidence: float | None = omitted_while_none()
    #: since 1.13: how an ``until`` run spent its error over its looks
    spending: SpendingPlan | None = omitted_while_none()
    lockstep: LockstepSettings | None = omitted_while_none()

    def paired_with(self, other: ScheduleBlock | None) -> bool:
        """Both ran in one interleaved or lockstep run: their trials pair by round."""
        return (
            other is not None
            and self.run_id == other.run_id
            and self.kind == other.kind
            and self.kind in ("interleaved", "lockstep")
        )


@dataclass
class CurvePoint:
    """One epoch of a train-mode run (MLPerf's key names)."""

    epoch_num: int
    learning_rate: float
    train_loss: float | None
    train_time_s: float
    wall_time_s: float
    eval_accuracy: float | None = None
    eval_top5_accuracy: float | None = None
    eval_loss: float | None = None
    #: seconds from the run's start when this epoch's first step began, its last step ended and
    #: its evaluation began (since result schema 1.14: the MLPerf log's epoch and eval intervals)
    started_s: float | None = omitted_while_none()
    trained_s: float | None = omitted_while_none()
    eval_started_s: float | None = omitted_while_none()


@dataclass
class MlperfLog:
    """This run's MLPerf Training log (``accelbench train --mlperf-log``) and what MLCommons'
    tools said of it (``accelbench.analysis.mlperf_checks``)."""

    #: the log, ``<dir>/results/<system>/resnet/result_<i>.txt``
    log: str
    ruleset: str
    division: str
    #: the system description's name (``<dir>/systems/<system>.json``): one per backend and machine
    system: str
    #: what the compliance checker said: "passed", or its first error
    compliance: str
    #: the result summarizer's score of the system's runs (minutes, olympic mean), or None and why
    score_minutes: float | None
    runs_scored: int
    reason: str | None = omitted_while_none()


@dataclass
class CostToTarget:
    price_per_hour: float
    currency: str
    hours: float
    cost: float


@dataclass
class Training:
    """Train mode: time to accuracy on a real dataset (``accelbench.execution.training``)."""

    dataset: str
    target_top1: float
    target_reached: bool
    epochs_to_target: int | None
    time_to_target_s: float | None
    best_eval_accuracy: float | None
    best_epoch: int | None
    epochs_run: int
    wall_time_s: float
    train_time_s: float
    eval_time_s: float
    train_images_per_sec: float | None
    global_batch_size: int
    opt_base_learning_rate: float
    #: the TrainSpec the run followed, every field
    recipe: dict[str, Any]
    curve: list[CurvePoint]
    #: what the backend's input pipelines did (free-form per framework)
    preprocessing: dict[str, Any] = field(default_factory=dict)
    cost_to_target: CostToTarget | None = None
    #: the wall clock (Unix seconds) at the first step: the curve's times count from it (since 1.14)
    run_start_unix_s: float | None = omitted_while_none()
    #: from the host starting the worker to the first step (MLPerf's initialisation)
    init_s: float | None = omitted_while_none()
    #: images in the dataset's training and held-out splits
    train_samples: int | None = omitted_while_none()
    eval_samples: int | None = omitted_while_none()
    mlperf: MlperfLog | None = omitted_while_none()


@dataclass
class PriceRef:
    name: str
    price_per_hour: float
    currency: str
    pricing: str
    source: str


@dataclass
class EnergyCost:
    price_per_kwh: float
    currency: str
    per_image: float | None
    per_epoch: float | None
    reason: str | None = omitted_while_none()


@dataclass
class Cost:
    """Cost-performance at a price (``accelbench.analysis.cost``); no price: no figure, and the reason."""

    price: PriceRef | None
    reason: str
    images_per_dollar: float | None = omitted_while_none()
    cost_per_epoch: float | None = omitted_while_none()
    epochs: int | None = omitted_while_none()
    cost_of_epochs: float | None = omitted_while_none()
    epoch_images: int | None = omitted_while_none()
    energy: EnergyCost | None = omitted_while_none()


@dataclass
class Block:
    """One block of one lockstep side: when it ran, what it timed, and what the machine did meanwhile."""

    round: int
    steps: int
    seconds: float | None
    #: seconds since the run started
    started_s: float
    foreign_share: float | None = None
    steal_share: float | None = None
    #: False: the block was busy and run again (``--when-busy wait``); its steps are not in the timing
    counted: bool = True
