"""RunConfig: what to run, validated once against ``schemas/config.schema.json``.

Batch semantics are resolved once per backend, by planning (``accelbench.planning.plan.resolve``): the
user gives a global batch or a per-device batch (or neither: the backend's default for the device
kind), and the other is derived. A global batch that does not divide by the device count is an
error. This room knows no backend.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tomllib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from accelbench.errors import UsageError
from accelbench.execution import allocators
from accelbench.planning import inputs
from accelbench.records import validation

T = TypeVar("T")


@dataclass(frozen=True)
class Flag:
    """How a RunConfig field appears on the command line: declared on the field, once; the
    commands' options are made from it (``accelbench.cli``)."""

    help: str
    #: "int", "finite" (a finite float), "timeout" (finite seconds, at most 30 days), "str", "bool"
    #: (an on/off pair), "int_list" (comma-separated)
    kind: str = "str"
    #: the option's name when it is not the field's (``--timeout`` for ``timeout_s``)
    name: str | None = None
    choices: tuple[str, ...] | None = None


def flag(help: str, kind: str = "str", name: str | None = None, choices: tuple[str, ...] | None = None) -> dict[str, Flag]:
    return {"flag": Flag(help, kind, name, choices)}


@dataclass(frozen=True)
class TrainSpec:
    """What train mode runs, beyond the RunConfig: dataset, stopping rule and the recipe. Each
    field is declared here once, with its flag (``metadata["flag"]``, as RunConfig's); None from
    the command line means "not given" (the dataset preset's value, then the default, stands)."""

    dataset: str
    target_top1: float = field(
        metadata=flag("Stop at this held-out top-1 (0..1; default 0.95 digits, 0.759 ImageNet).", "finite")
    )
    max_epochs: int = field(metadata=flag("Epoch budget (default 20 digits, 90 ImageNet).", "int"))
    eval_every: int = field(default=1, metadata=flag("Evaluate every N epochs (default 1).", "int"))
    stop_at_target: bool = field(default=True, metadata=flag("Stop when the target is reached (default on).", "bool"))
    augmentation: str = field(
        default="none", metadata=flag("Training augmentation (default: the preset's).", choices=("none", "imagenet"))
    )
    #: learning rate per 256 images: the run uses base * global_batch / 256
    base_learning_rate: float = field(
        default=0.1, metadata=flag("Learning rate per 256 images (scaled by batch/256).", "finite", name="base_lr")
    )
    warmup_epochs: float = field(default=0.0, metadata=flag("Linear warm-up epochs (default 5 ImageNet).", "finite"))
    decay_epochs: tuple[int, ...] = field(
        default=(), metadata=flag("Epochs of the x decay-factor steps, e.g. 30,60,80.", "int_list")
    )
    decay_factor: float = field(default=0.1, metadata=flag("Step decay factor (default 0.1).", "finite"))
    momentum: float = field(default=0.9, metadata=flag("SGD momentum (default 0.9).", "finite"))
    nesterov: bool = field(default=False, metadata=flag("Nesterov momentum (default off).", "bool"))
    #: L2 weight decay on convolution and dense weights, never on batch-norm parameters or biases
    weight_decay: float = field(default=1e-4, metadata=flag("L2 on weights, not batch-norm parameters (default 1e-4).", "finite"))
    label_smoothing: float = field(default=0.0, metadata=flag("Label smoothing (default 0).", "finite"))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "TrainSpec":
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["decay_epochs"] = tuple(values.get("decay_epochs", ()))
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["decay_epochs"] = list(self.decay_epochs)
        return out

    def __getitem__(self, key: str) -> NoReturn:
        # plugins written for API 2.2 read the spec as a dict: one line naming the replacement
        raise TypeError(f"config.train_spec is a TrainSpec since plugin API 2.3: read .{key}, not [{key!r}]")

    def peak_learning_rate(self, global_batch: int) -> float:
        return self.base_learning_rate * global_batch / 256

    def learning_rate(self, epoch: float, global_batch: int) -> float:
        """The rate at fractional epoch ``epoch`` (0 = first step): linear warm-up, then step decays."""
        rate = self.peak_learning_rate(global_batch)
        if epoch < self.warmup_epochs:
            return rate * epoch / self.warmup_epochs
        return rate * self.decay_factor ** sum(epoch >= boundary for boundary in self.decay_epochs)


#: the dataclass that declares the fields (and flags) of a nested config block, by its key
NESTED: dict[str, type] = {"train": TrainSpec}


def flag_of(path: tuple[str | int, ...]) -> str | None:
    """The command-line flag of a config field by its JSON path (``("train", "max_epochs")`` is
    ``--max-epochs``), or the config key where the field has no flag; None for the whole config."""
    declared: type = RunConfig
    if len(path) == 2 and path[0] in NESTED:
        declared, path = NESTED[str(path[0])], path[1:]
    if len(path) != 1 or not isinstance(path[0], str):
        return "config key " + ".".join(map(str, path)) if path else None
    metadata: Mapping[str, Any] = next((f.metadata for f in dataclasses.fields(declared) if f.name == path[0]), {})
    if "cli" in metadata:
        return str(metadata["cli"])
    spec = metadata.get("flag")
    return "--" + (spec.name or path[0]).replace("_", "-") if spec else f"config key {path[0]}"


def parsed_by_cli(name: str) -> dict[str, str]:
    """A field the command line gives in a shape of its own (a duration, KEY=VALUE): its flag is
    made by hand in cli.py, but a refusal of its value still names it."""
    return {"cli": name}


@dataclass(frozen=True)
class RunConfig:
    """One run's request. Every field is declared here once: its type and default, its flag
    (``metadata["flag"]``), and ``schemas/config.schema.json`` holds exactly these fields."""

    #: model, variant and precision: names the backend declares; None: the backend's default
    model: str | None = field(
        default=None, metadata=flag("Model, as the backend names it (default: its first; `accelbench plugins` lists them).")
    )
    variant: str | None = field(
        default=None, metadata=flag("Variant of the model, as the backend names it (default: its first).")
    )
    global_batch: int | None = field(default=None, metadata=flag("Global batch (split over the devices).", "int"))
    per_device_batch: int | None = field(
        default=None, metadata=flag("Per-device batch (tf_cnn_benchmarks' --batch_size).", "int")
    )
    batch_sizes: tuple[int, ...] | None = field(
        default=None, metadata=flag("Sweep of global batch sizes, e.g. 8,16,32.", "int_list")
    )
    device: str = field(default="auto", metadata=flag("Device kind the backend lists (cpu, gpu, ...), or auto (default)."))
    device_count: int | None = field(default=None, metadata=flag("Devices to use (default: all of the kind).", "int"))
    #: worker processes of a multi-worker data-parallel run (each with ``device_count`` devices)
    workers: int = field(
        default=1, metadata=flag("Worker processes of a multi-worker run, all on this machine (loopback).", "int")
    )
    #: with workers > 1, first run one worker of the same per-worker batch (scaling efficiency)
    scaling_baseline: bool = field(
        default=True, metadata=flag("With --workers > 1, also run 1 worker for scaling efficiency (default on).", "bool")
    )
    precision: str | None = field(default=None, metadata=flag("Numeric precision, as the backend names it (default: its first)."))
    image_size: int = field(default=224, metadata=flag("Square image side (default 224).", "int"))
    num_classes: int = field(default=1000, metadata=flag("Classes of the synthetic labels (default 1000).", "int"))
    data: str = "synthetic"
    #: warm-up steps: all of them ("fixed"), or the cap of a warm-up that ends once the step time
    #: is stable ("stable"); ``warmup`` None: stable when time-boxed, fixed when counted
    warmup_steps: int = field(
        default=10, metadata=flag("Untimed steps first; with --warmup stable, the most (default 10).", "int")
    )
    warmup: str | None = field(
        default=None,
        metadata=flag(
            "Warm up --warmup-steps steps, or until the step time is stable (default: stable with a time box, "
            "fixed with counted steps).",
            choices=("fixed", "stable"),
        ),
    )
    #: timed steps (counted, the tf_cnn_benchmarks protocol), or ``time_s`` seconds of whole steps
    #: (a time box); neither: a time box of ``DEFAULT_TIME_S`` (counted for multi-worker runs)
    timed_steps: int | None = field(
        default=None, metadata=flag("Count this many timed steps (the tf_cnn_benchmarks protocol).", "int")
    )
    #: the CLI's --time takes a duration ("45s", "2m"): cli.py parses it
    time_s: float | None = field(default=None, metadata=parsed_by_cli("--time"))
    trials: int = field(default=1, metadata=flag("Independent worker processes per run (default 1).", "int"))
    threads: int | None = field(default=None, metadata=flag("Compute threads (default: all cores).", "int"))
    inter_op_threads: int | None = field(default=None, metadata=flag("Inter-op threads where the framework has them.", "int"))
    seed: int = field(default=0, metadata=flag("Random seed.", "int"))
    timeout_s: float = field(
        default=1800.0, metadata=flag("Seconds before a run's worker is stopped.", "timeout", name="timeout")
    )
    #: "auto" until planning resolves it per backend (``accelbench.execution.allocators.resolve``)
    allocator: str = field(
        default="auto",
        metadata=flag(
            "Memory allocator preloaded into each worker: system (the C library's malloc), jemalloc, "
            "tcmalloc, a shared library's absolute path, or auto (default: the one the plugin measured "
            "fastest, when installed, else system)."
        ),
    )
    #: "auto" until planning resolves it per backend (``accelbench.execution.allocators.resolve_huge_pages``)
    huge_pages: str = field(
        default="auto",
        metadata=flag(
            "Transparent huge pages for the memory each worker's allocator maps: on, off, or auto (default: on "
            "where the plugin measured them faster and this machine's kernel and allocator can give them).",
            choices=allocators.HUGE_PAGE_CHOICES,
        ),
    )
    memory_limit_mb: int | None = field(
        default=None,
        metadata=flag(
            "Resident-memory limit for each worker process and its children, watched by the host "
            "(train mode: 3/4 of this machine's memory unless given).",
            "int",
        ),
    )
    options: dict[str, Any] = field(default_factory=dict, metadata=parsed_by_cli("--option"))
    #: levers (``--lever``): sets of backend options or ``LEVER_FIELDS``, each run beside the
    #: config as given (a run of every selected backend with the set applied), so that a
    #: comparison decides whether the lever helps here; a sweep, expanded by ``expand_sweep`` as
    #: ``batch_sizes`` is
    levers: tuple[dict[str, Any], ...] | None = field(default=None, metadata=parsed_by_cli("--lever"))
    #: what a lever run changed from the config as given (set by ``expand_sweep``, and in its
    #: record): empty for the run as configured
    lever: dict[str, Any] = field(default_factory=dict)
    #: "throughput" (synthetic data, the timing loop) or "train" (a real dataset, to a target top-1)
    mode: str = "throughput"
    #: train mode's dataset, stopping rule and recipe
    train: TrainSpec | None = None
    #: set by ``planning.resolve``: where the batch size came from ("config" or "backend default")
    batch_source: str | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunConfig":
        validation.validate_or_raise("config", data, what="config", names=flag_of)
        return cls.from_fields(data)

    @classmethod
    def from_fields(cls, data: Mapping[str, Any]) -> "RunConfig":
        """A RunConfig from its fields as ``to_dict`` gives them (a record's ``config``), not validated."""
        values = dict(data)
        for name in ("batch_sizes", "levers"):
            if values.get(name) is not None:
                values[name] = tuple(values[name])
        if isinstance(values.get("train"), Mapping):
            values["train"] = TrainSpec.from_dict(values["train"])
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        for name in ("batch_sizes", "levers"):
            if out[name] is not None:
                out[name] = list(out[name])
        out["train"] = self.train.to_dict() if self.train else None
        return out

    def replace(self, **changes: Any) -> "RunConfig":
        return dataclasses.replace(self, **changes)

    def config_hash(self) -> str:
        """sha256 of the canonical JSON of the config (resolved configs hash what actually ran)."""
        blob = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()

    # What ``planning.resolve`` always fills: read through these, a resolved config's fields are never None
    # (an unresolved one raises, naming the field, rather than letting a None travel on).
    @property
    def resolved_model(self) -> str:
        return _resolved(self.model, "model")

    @property
    def resolved_precision(self) -> str:
        return _resolved(self.precision, "precision")

    @property
    def resolved_global_batch(self) -> int:
        return _resolved(self.global_batch, "global_batch")

    @property
    def resolved_per_device_batch(self) -> int:
        return _resolved(self.per_device_batch, "per_device_batch")

    @property
    def resolved_device_count(self) -> int:
        return _resolved(self.device_count, "device_count")

    @property
    def resolved_batch_source(self) -> str:
        return _resolved(self.batch_source, "batch_source")

    @property
    def train_spec(self) -> TrainSpec:
        """Train mode's spec (a train-mode config always has one)."""
        return _resolved(self.train, "train")

    @property
    def replicas(self) -> int:
        """Devices across all workers: the global batch is split over these."""
        return (self.device_count or 1) * self.workers

    @property
    def effective_threads(self) -> int:
        """Threads per worker: as given, else this machine's cores shared by the local workers."""
        return self.threads or max(1, (os.cpu_count() or 1) // self.workers)


#: the timed phase of a run given neither steps nor time: long enough for a tight interval at a
#: few images/sec, short enough that every built-in plugin runs in about 5 minutes on 2 cores
DEFAULT_TIME_S = 45.0
#: multi-worker runs count steps: workers in lock step must agree on the count before they start
DEFAULT_TIMED_STEPS = 100
#: ``--protocol tf_cnn``: tf_cnn_benchmarks' own warm-up and step counts
TF_CNN_PROTOCOL = {"warmup": "fixed", "warmup_steps": 10, "timed_steps": 100}


def timed_phase(config: RunConfig) -> dict[str, Any]:
    """The warm-up rule and timed-phase length a run will use; UsageError for a contradiction."""
    if config.timed_steps is not None and config.time_s is not None:
        raise UsageError("give one of --timed-steps and --time")
    if config.workers > 1 and (config.time_s is not None or config.warmup == "stable"):
        raise UsageError("multi-worker runs count steps in lock step: give --timed-steps and --warmup fixed, not --time")
    timed_steps, time_s = config.timed_steps, config.time_s
    if timed_steps is None and time_s is None:
        timed_steps, time_s = (DEFAULT_TIMED_STEPS, None) if config.workers > 1 else (None, DEFAULT_TIME_S)
    return {
        "timed_steps": timed_steps,
        "time_s": time_s,
        "warmup": config.warmup or ("stable" if time_s is not None else "fixed"),
    }


def parse_option(text: str, flag: str = "--option") -> tuple[str, Any]:
    """``--option KEY=VALUE``: the value as JSON where it is JSON (numbers, booleans), else the text."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise UsageError(f"{flag} must be KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a JSON or TOML config file into a dict of known run fields (not yet validated); every
    refusal names ``--config`` and the file."""
    path = Path(path)
    what = f"--config {inputs.shown_path(path)}"
    text = inputs.read_text(path, "--config")
    if path.suffix == ".toml":
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise UsageError(f"{what} is malformed: {exc}") from None
    else:
        data = inputs.parse_json(text, what)
    if not isinstance(data, dict):
        raise UsageError(f"{what}: must hold an object of run fields, not {type(data).__name__}")
    unknown = sorted(set(data) - {f.name for f in dataclasses.fields(RunConfig)})
    if unknown:  # a results file given as a config, or a typo: said here, not as "additional properties at $"
        verb = "is not a run field" if len(unknown) == 1 else "are not run fields"
        raise UsageError(f"{what}: {', '.join(map(repr, unknown))} {verb}")
    inputs.check_finite(data, what)
    return data


#: the run fields a lever may set besides the backend's options: how the same work is executed
#: (the worker's malloc, its huge pages, its thread pools), never what is computed
LEVER_FIELDS = ("allocator", "huge_pages", "threads", "inter_op_threads")


def expand_sweep(config: RunConfig) -> list[RunConfig]:
    """One config per batch size of a sweep (global batches), each as given and then with each
    lever (applied, and named in ``lever``); or the config itself."""
    sizes = (
        [config.replace(batch_sizes=None, global_batch=b, per_device_batch=None) for b in config.batch_sizes]
        if config.batch_sizes
        else [config]
    )
    if not config.levers:
        return sizes
    return [with_lever(point.replace(levers=None), lever) for point in sizes for lever in ({}, *config.levers)]


def split_lever(lever: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A lever's run fields (``LEVER_FIELDS``) and its backend options."""
    fields = {key: value for key, value in lever.items() if key in LEVER_FIELDS}
    return fields, {key: value for key, value in lever.items() if key not in fields}


def with_lever(config: RunConfig, lever: dict[str, Any]) -> RunConfig:
    """The config with a lever applied: its run fields set, its other keys added to the options."""
    if not lever:
        return config
    fields, options = split_lever(lever)
    return config.replace(**fields, lever=lever, options={**config.options, **options})


def lever_unchanged(config: RunConfig, lever: dict[str, Any]) -> list[str]:
    """The keys of ``lever`` whose value the config already has."""
    unset = object()  # an option the config does not set (None may be a value)
    return [
        key
        for key, value in lever.items()
        if (getattr(config, key) if key in LEVER_FIELDS else config.options.get(key, unset)) == value
    ]


def lever_text(lever: dict[str, Any]) -> str:
    """A lever as ``--lever`` takes it: ``compile=true,memory_format=contiguous``."""
    return ",".join(f"{key}={value if isinstance(value, str) else json.dumps(value)}" for key, value in lever.items())


def parse_lever(text: str) -> dict[str, Any]:
    """``--lever KEY=VALUE[,KEY=VALUE]``: one lever, each value read as ``--option``'s."""
    items = [item.strip() for item in text.split(",")]
    if "" in items:
        raise UsageError(f"--lever must be KEY=VALUE[,KEY=VALUE...], got {text!r}")
    lever = {}
    for item in items:
        key, value = parse_option(item, "--lever")
        if key in lever:
            raise UsageError(f"--lever {text!r} sets {key} twice")
        lever[key] = value
    return lever


def _resolved(value: T | None, name: str) -> T:
    if value is None:
        raise ValueError(f"the config's {name} is read before the config was resolved for a backend")
    return value


def single_worker_baseline(resolved: RunConfig) -> RunConfig:
    """The 1-worker run of a resolved multi-worker config's per-worker batch."""
    return resolved.replace(workers=1, global_batch=resolved.resolved_per_device_batch * resolved.resolved_device_count)
