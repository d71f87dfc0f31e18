"""A train-mode record as an MLPerf Training log, and the system description MLPerf's result
summarizer reads beside it.

The log is written through MLCommons' own logger (``mlperf_logging.mllog``), never formatted here,
and every time in it is one the record holds: the run started at ``training.run_start_unix_s``, the
worker ``training.init_s`` before that, and each epoch, block and evaluation where the curve says.
Every setting logged is one the record read back (the framework's optimizer settings) or the
recipe core applied (the learning-rate schedule, which core computes and feeds to every step).

Our runs are labelled ``open``: the closed ResNet rules ask for a schedule we do not run (SGD with
polynomial decay to 0.0001, or LARS), ImageNet's 75.9% top-1, and keys no CPU run on a small folder
can honestly log (``docs/guide/training.md`` lists them); the tests hold that such a log fails
the closed rules.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from accelbench.errors import UsageError

if TYPE_CHECKING:
    from accelbench.records.blocks import Training
    from accelbench.records.results import Record

#: MLPerf Training's ruleset whose ResNet rules the logs follow (``compliance_checker --ruleset``)
RULESET = "4.0.0"
BENCHMARK = "resnet"
DIVISION = "open"
#: what a system description says of a research run's availability (the checker's own words)
AVAILABILITY = "Research, Development, or Internal (RDI)"
EXTRA = "pip install 'accelbench[mlperf]'"


def require(flag: str = "--mlperf-log") -> None:
    """One line naming the extra, before any run, when MLCommons' package is missing."""
    try:
        import mlperf_logging  # noqa: F401
    except ImportError:
        raise UsageError(f"{flag} needs MLCommons' mlperf-logging, which is not installed: {EXTRA}") from None


class NoLog(Exception):
    """The record cannot be an MLPerf log; the message says why."""


@dataclass(frozen=True)
class Submission:
    """Who and what a log names: ``submission_org`` and ``submission_platform`` (None: from the
    record's machine: its hostname, its CPU or accelerator and framework)."""

    org: str | None = None
    platform: str | None = None

    def org_of(self, record: Record) -> str:
        return self.org or record.environment.hostname

    def platform_of(self, record: Record) -> str:
        if self.platform:
            return self.platform
        env, device = record.environment, record.device
        where = device.name if device.kind != "cpu" and device.name else f"{env.cpu_model} ({env.cpu_cores} cores)"
        return f"{where}, {record.framework.name} {record.framework.version}"

    def system_name(self, record: Record) -> str:
        """One system per machine, backend and precision: the summarizer scores each apart."""
        where = self.platform or (record.device.name if record.device.kind != "cpu" else record.environment.cpu_model)
        return _slug(f"{where}-{record.plugin.name}-{record.backend.name}-{record.precision}")


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_")[:120]


def write_log(record: Record, path: Path, submission: Submission) -> None:
    """Write ``record`` as an MLPerf Training log at ``path`` (NoLog: why it cannot be one)."""
    training = _loggable(record)
    from mlperf_logging.mllog import constants as keys
    from mlperf_logging.mllog.mllog import MLLogger

    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, mode="w", encoding="utf-8")
    logger = logging.getLogger(f"accelbench.mlperf.{id(handler)}")
    logger.propagate, logger.level = False, logging.INFO
    logger.addHandler(handler)
    try:
        _Events(MLLogger(logger=logger), keys, record, training, submission).write()
    finally:
        logger.removeHandler(handler)
        handler.close()


def _loggable(record: Record) -> Training:
    training = record.training
    if record.status != "ok" or training is None:
        raise NoLog(f"the run is {record.status}, not a finished train-mode run: {record.reason or 'no training block'}")
    if training.run_start_unix_s is None or training.init_s is None or any(row.started_s is None for row in training.curve):
        raise NoLog("the record has no timeline (written before result schema 1.14, or its start-up was not read)")
    return training


class _Events:
    """The log's lines in MLPerf's order: submission and configuration during initialisation,
    then the run's blocks, epochs and evaluations, then its stop."""

    def __init__(self, logger: Any, keys: Any, record: Record, training: Training, submission: Submission):
        self.log, self.keys, self.record, self.training = logger, keys, record, training
        self.submission = submission
        self.start_ms = training.run_start_unix_s * 1000.0 if training.run_start_unix_s else 0.0
        self.block_first = 1

    def at(self, seconds: float) -> float:
        """Milliseconds since the Unix epoch of ``seconds`` after the run's start (µs kept)."""
        return round(self.start_ms + seconds * 1000.0, 3)

    def write(self) -> None:
        init = self.at(-(self.training.init_s or 0.0))
        self._event("submission_benchmark", BENCHMARK, init)
        self._event("submission_division", DIVISION, init)
        self._event("submission_status", "research", init)
        self._event("submission_org", self.submission.org_of(self.record), init)
        self._event("submission_platform", self.submission.platform_of(self.record), init)
        # accelbench drops no page cache: the dataset may be in memory from an earlier run
        self._event("cache_clear", False, init)
        self.log.start(key=self.keys.INIT_START, time_ms=init)
        for key, value in self._configuration():
            self._event(key, value, init)
        self.log.end(key=self.keys.INIT_STOP, time_ms=self.at(0.0))
        self.log.start(key=self.keys.RUN_START, time_ms=self.at(0.0))
        self._epochs()
        status = self.keys.SUCCESS if self.training.target_reached else self.keys.ABORTED
        self.log.end(key=self.keys.RUN_STOP, time_ms=self.at(self.training.wall_time_s), metadata={"status": status})

    def _event(self, key: str, value: Any, time_ms: float, **metadata: Any) -> None:
        self.log.event(key=key, value=value, time_ms=time_ms, metadata=metadata or None)

    def _configuration(self) -> list[tuple[str, Any]]:
        t, settings, recipe = self.training, self.record.settings, self.training.recipe
        seed = self.record.config.get("seed")
        found = [
            ("seed", seed),
            ("global_batch_size", t.global_batch_size),
            ("train_samples", t.train_samples),
            ("eval_samples", t.eval_samples),
            # the schedule core computes and feeds to every step, in every framework
            ("opt_base_learning_rate", t.opt_base_learning_rate),
            ("opt_learning_rate_warmup_epochs", recipe.get("warmup_epochs")),
            ("opt_learning_rate_decay_boundary_epochs", recipe.get("decay_epochs")),
            ("opt_learning_rate_decay_factor", recipe.get("decay_factor")),
            # what the framework read back of its optimizer
            ("opt_name", _optimizer_name(settings.get("optimizer"))),
            ("sgd_opt_momentum", settings.get("momentum")),
            ("sgd_opt_weight_decay", settings.get("weight_decay", settings.get("wd"))),
        ]
        return [(key, value) for key, value in found if value is not None]

    def _epochs(self) -> None:
        every = int(self.training.recipe.get("eval_every") or 1)
        for row in self.training.curve:
            started, trained = row.started_s or 0.0, row.trained_s or row.wall_time_s
            if (row.epoch_num - 1) % every == 0:
                count = min(every, self.training.epochs_run - row.epoch_num + 1)
                self.log.start(
                    key=self.keys.BLOCK_START,
                    time_ms=self.at(started),
                    metadata={"first_epoch_num": row.epoch_num, "epoch_count": count},
                )
                self.block_first = row.epoch_num
            self.log.start(key=self.keys.EPOCH_START, time_ms=self.at(started), metadata={"epoch_num": row.epoch_num})
            self.log.end(key=self.keys.EPOCH_STOP, time_ms=self.at(trained), metadata={"epoch_num": row.epoch_num})
            if row.eval_accuracy is None:
                continue
            self.log.end(key=self.keys.BLOCK_STOP, time_ms=self.at(trained), metadata={"first_epoch_num": self.block_first})
            self.log.start(
                key=self.keys.EVAL_START, time_ms=self.at(row.eval_started_s or trained), metadata={"epoch_num": row.epoch_num}
            )
            self._event(self.keys.EVAL_ACCURACY, row.eval_accuracy, self.at(row.wall_time_s), epoch_num=row.epoch_num)
            self.log.end(key=self.keys.EVAL_STOP, time_ms=self.at(row.wall_time_s), metadata={"epoch_num": row.epoch_num})


def _optimizer_name(described: Any) -> str | None:
    """MLPerf's ``opt_name`` from the framework's own description of its optimizer."""
    text = str(described or "").lower()
    if "lars" in text:
        return "lars"
    if "sgd" in text or "nag" in text:
        return "sgd"
    return None


def system_description(record: Record, submission: Submission) -> dict[str, Any]:
    """The system description the summarizer and ``system_desc_checker`` read, from the record's
    machine block; a field the record does not hold is empty, never guessed."""
    env, device = record.environment, record.device
    on_cpu = device.kind == "cpu"
    accelerators = [a for a in env.accelerators if a.kind == device.kind] if not on_cpu else []
    packages = ", ".join(f"{name} {version}" for name, version in sorted(env.packages.items()))
    return {
        "submitter": submission.org_of(record),
        "division": DIVISION,
        "status": AVAILABILITY,
        "system_name": submission.system_name(record),
        "number_of_nodes": "1",
        "host_processors_per_node": str(env.cpu_sockets) if env.cpu_sockets else "",
        "host_processor_model_name": env.cpu_model,
        "host_processor_core_count": "",
        "host_processor_vcpu_count": str(env.cpu_cores),
        "host_processor_frequency": "",
        "host_processor_caches": "",
        "host_processor_interconnect": "",
        "host_memory_capacity": f"{env.memory_bytes / 2**30:.0f} GiB",
        "host_storage_type": "",
        "host_storage_capacity": "",
        "host_networking": "",
        "host_networking_topology": "",
        "host_memory_configuration": "",
        "accelerators_per_node": str(device.count if not on_cpu else 0),
        "accelerator_model_name": device.name if not on_cpu else "none (CPU run)",
        "accelerator_host_interconnect": "",
        "accelerator_frequency": "",
        "accelerator_on-chip_memories": "",
        "accelerator_memory_configuration": "",
        "accelerator_memory_capacity": accelerators[0].memory if accelerators else "",
        "accelerator_interconnect": "",
        "accelerator_interconnect_topology": "",
        "cooling": "",
        "hw_notes": f"{env.cpu_cores} logical CPUs" + (f", {', '.join(env.cpu_flags)}" if env.cpu_flags else ""),
        "framework": f"{record.framework.name} {record.framework.version}",
        "other_software_stack": f"Python {env.python}; {packages}",
        "operating_system": env.os,
        "sw_notes": f"accelbench {record.plugin.name}:{record.backend.name}, {record.precision}, {record.model.name}",
    }


@dataclass(frozen=True)
class LoggedRun:
    """What ``accelbench report`` draws of an MLPerf log, ours or a published submission's."""

    label: str
    #: (epoch_num, eval_accuracy) of every evaluation
    points: list[tuple[float, float]]
    #: run_start to run_stop, in minutes (None when the log has no run_stop)
    minutes: float | None
    status: str | None


def read_logs(folder: Path, ruleset: str = RULESET) -> list[LoggedRun]:
    """Every MLPerf log under ``folder`` (``*.txt`` files with ``:::MLLOG`` lines), parsed by
    MLCommons' own parser."""
    from mlperf_logging.compliance_checker.mlp_parser import parse_file

    runs = []
    for path in sorted(folder.rglob("*.txt")):
        lines, _ = parse_file(str(path), ruleset=ruleset)
        if lines:
            runs.append(_logged_run(path.relative_to(folder), lines))
    return runs


def _logged_run(name: Path, lines: list[Any]) -> LoggedRun:
    points: list[tuple[float, float]] = []
    started = stopped = status = None
    for line in lines:
        value, metadata = line.value.get("value"), line.value.get("metadata") or {}
        epoch = metadata.get("epoch_num")
        if line.key == "eval_accuracy" and epoch is not None:
            points.append((float(epoch), float(value)))
        elif line.key == "run_start":
            started = line.timestamp
        elif line.key == "run_stop":
            stopped, status = line.timestamp, metadata.get("status")
    minutes = (stopped - started) / 60_000 if started is not None and stopped is not None else None
    return LoggedRun(str(name), points, minutes, status)
