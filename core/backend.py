"""The backend protocol: what a framework plugin implements, and nothing more.

A backend never times itself. The host's timing loop (``accelbench.execution.timing``) calls ``step`` and
reads the clock; the backend only prepares the work and performs one synced step.

Life cycle, all but ``describe`` inside a fresh worker process::

    describe()            host and worker; no framework import
    check(config)         worker; framework may be imported now. A reason string means "cannot run"
    prepare(config)       worker; build model, optimizer, synthetic data on the device
    step()  (many times)  worker; one training step (or ``steps_per_call`` steps), returns after
                          the device has finished
    teardown()            worker; release what prepare made

Train mode (``accelbench train``; only backends whose ``info.data_format`` is set)::

    write_dataset / read_dataset        worker; write one split in the framework's own format,
                                        read it back (for the converter's round-trip check)
    prepare_training(config, dataset)   worker; model, optimizer, input pipelines over the dataset
    train_step(learning_rate)  (many)   worker; one synced step on the next training batch
    evaluate()                          worker; top-1/top-5/loss over the whole held-out split

The epoch loop, learning-rate schedule and stopping rule are core's (``accelbench.execution.training``).
"""

from __future__ import annotations

import functools
import importlib
import math
import re
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from accelbench.environments.datasets import DatasetManifest
    from accelbench.launch import Engine
    from accelbench.planning.config import RunConfig


#: FLOPs of one training image per forward multiply-add: 2 FLOPs per multiply-add, and the
#: backward pass costs about twice the forward (gradients w.r.t. inputs and w.r.t. weights)
TRAINING_FLOPS_PER_FORWARD_MAC = 6


def training_flops(forward_macs: int) -> float:
    """Training FLOPs per image from the forward multiply-adds counted on the model."""
    return float(TRAINING_FLOPS_PER_FORWARD_MAC * forward_macs)


#: what a declared name may look like (model, variant, precision, device kind, data format, engine):
#: the result schema's ``identifier``
IDENTIFIER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}$")


OPTION_KINDS = ("any", "bool", "int", "float", "str")


@dataclass(frozen=True)
class Option:
    """A backend option (``--option KEY=VALUE``): its meaning and the values it accepts.

    The host checks a value against its declaration before any worker starts, so a bad value is
    the user's one-line usage error (exit 2), not an ``unavailable`` record after a worker ran.
    Values arrive parsed as JSON where they parse (``2``, ``true``), else as strings.
    """

    description: str
    #: "bool", "int", "float", "str", or "any" (not checked)
    kind: str = "any"
    #: the only values accepted, when not empty
    choices: tuple[Any, ...] = ()
    #: the smallest number accepted (int and float kinds)
    minimum: float | None = None

    def problem(self, value: Any) -> str | None:
        """Why ``value`` is not accepted, or None."""
        if self.choices:
            return None if value in self.choices else f"must be one of {', '.join(map(str, self.choices))}, got {value!r}"
        expected = {"bool": (bool,), "int": (int,), "float": (int, float), "str": (str,)}.get(self.kind)
        if expected is None:
            return None
        if not isinstance(value, expected) or (self.kind != "bool" and isinstance(value, bool)):
            return f"must be {'an' if self.kind == 'int' else 'a'} {_KIND_WORDS[self.kind]}, got {value!r}"
        number: Any = value  # an int or a float now: the isinstance check above
        if self.kind == "float" and not math.isfinite(number):
            return f"must be a finite number, got {value!r}"
        if self.minimum is not None and self.kind in ("int", "float") and number < self.minimum:
            return f"must be at least {self.minimum:g}, got {value!r}"
        return None


_KIND_WORDS = {"bool": "boolean (true or false)", "int": "integer", "float": "number", "str": "string"}


def option_spec(declared: "str | Option") -> Option:
    """A declaration as an Option (a plain description accepts any value)."""
    return declared if isinstance(declared, Option) else Option(str(declared))


@dataclass(frozen=True)
class BackendInfo:
    """How a backend describes itself, without importing its framework.

    The vocabulary a run may ask of this backend is what it declares here; the first name listed
    is the default (first model, first variant of a model, first precision). Core knows none of
    these names: a request for one the backend does not list is refused before any worker starts.
    """

    name: str
    framework: str
    #: importable module names the backend needs; availability is checked with find_spec only
    requires: tuple[str, ...]
    models: tuple[str, ...]
    #: model -> its variants, default first; a model not listed has no variants
    variants: dict[str, tuple[str, ...]] = field(default_factory=dict)
    precisions: tuple[str, ...] = ("fp32",)
    #: device kinds, as ``accelbench.environments.machine.device_counts`` names them ("cpu" always exists)
    devices: tuple[str, ...] = ("cpu",)
    #: "global" or "per_device": how this workload's reference states its batch size
    batch_semantics: str = "per_device"
    #: default batch (in ``batch_semantics`` units) per device kind
    default_batch: dict[str, int] = field(default_factory=lambda: {"cpu": 8})
    version: str = "0"
    description: str = ""
    #: backend-specific ``config.options`` keys this backend understands: an ``Option`` (meaning
    #: and accepted values, checked by the host) or just its meaning (any value accepted)
    options: dict[str, "str | Option"] = field(default_factory=dict)
    #: the dataset format this backend trains from in train mode, if any (a name of the plugin's)
    data_format: str | None = None
    #: requirements of the backend's own worker environment (``"someframework>=2.0"``, ...), for a
    #: framework that cannot share the host's environment; empty: workers use the host's Python.
    #: accelbench makes the environment on first use and caches it (``accelbench env``)
    environment: tuple[str, ...] = ()
    #: the memory allocator this backend's workers run fastest with, as measured side by side
    #: (``tests/benchmarks/bench_levers.py``): a name of ``accelbench.execution.allocators.KNOWN``, preloaded
    #: when the run leaves ``--allocator`` at ``auto`` and it is installed; None: the system's
    allocator: str | None = None
    #: whether this backend's workers ran faster with their allocator's memory in transparent huge
    #: pages, as measured side by side (``bench_levers.py``'s thp lever): on when the run leaves
    #: ``--huge-pages`` at ``auto`` and this machine's kernel and allocator can give them
    huge_pages: bool = False

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["variants"] = {model: list(names) for model, names in self.variants.items()}
        out["environment"] = list(self.environment)
        return out

    def problems(self) -> list[str]:
        """What is wrong with this description (wrong types, names that are not identifiers)."""
        found = [
            f"{name} must be a string"
            for name in ("name", "framework", "version", "description")
            if not isinstance(getattr(self, name), str)
        ]
        found += _name_problems("name", [self.name]) + _name_problems("framework", [self.framework])
        for what in ("requires", "models", "precisions", "devices"):
            found += _tuple_problems(what, getattr(self, what), allow_empty=what == "requires")
        if not isinstance(self.variants, dict):
            found.append("variants must be a dict of model -> tuple of variant names")
        else:
            for model, names in self.variants.items():
                if model not in self.models:
                    found.append(f"variants name model {model!r}, which is not in models")
                found += _tuple_problems(f"variants[{model!r}]", names, allow_empty=False)
        if self.batch_semantics not in ("global", "per_device"):
            found.append(f"batch_semantics must be 'global' or 'per_device', not {self.batch_semantics!r}")
        if not isinstance(self.default_batch, dict) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in self.default_batch.values()
        ):
            found.append("default_batch must map device kinds to positive integers")
        if not isinstance(self.options, dict) or not all(
            isinstance(k, str) and isinstance(v, (str, Option)) for k, v in self.options.items()
        ):
            found.append("options must map option names to an accelbench.Option or a description")
        elif any(option_spec(v).kind not in OPTION_KINDS for v in self.options.values()):
            found.append(f"an option's kind must be one of {', '.join(OPTION_KINDS)}")
        if self.data_format is not None:
            found += _name_problems("data_format", [self.data_format])
        if not isinstance(self.environment, tuple) or not all(isinstance(r, str) for r in self.environment):
            found.append("environment must be a tuple of requirement strings")
        from accelbench.execution.allocators import KNOWN

        if self.allocator is not None and self.allocator not in KNOWN:
            found.append(f"allocator must be None or one of {', '.join(KNOWN)}, not {self.allocator!r}")
        if not isinstance(self.huge_pages, bool):
            found.append(f"huge_pages must be True or False, not {self.huge_pages!r}")
        return found

    def default_variant(self, model: str) -> str | None:
        names = self.variants.get(model, ())
        return names[0] if names else None


def _tuple_problems(what: str, value: Any, allow_empty: bool) -> list[str]:
    if not isinstance(value, tuple):
        return [f"{what} must be a tuple of names, not {type(value).__name__}"]
    if not value and not allow_empty:
        return [f"{what} must name at least one"]
    return _name_problems(what, value)


def _name_problems(what: str, names: Any) -> list[str]:
    return [
        f"{what}: {name!r} is not a name (letters, digits, _ . + -)"
        for name in names
        if not isinstance(name, str) or not IDENTIFIER.match(name)
    ]


class PluginAPIError(TypeError):
    """A plugin uses a name the plugin API removed; the message is one line naming its replacement."""


#: what plugin API 1's ``BackendInfo`` took that API 2 does not, and what replaced it
REMOVED_IN_API_2 = {
    "default_variant": "list the default first in variants={model: (default, ...)}",
    "default_precision": "list the default first in precisions=(default, ...)",
}


def _migrating(init: Callable[..., None]) -> Callable[..., None]:
    """``BackendInfo.__init__``, answering a plugin written for plugin API 1 with one line naming
    what replaced the field it used, where Python would say only 'unexpected keyword argument'."""

    @functools.wraps(init)
    def __init__(self: BackendInfo, *args: Any, **kwargs: Any) -> None:
        for name, replacement in REMOVED_IN_API_2.items():
            if name in kwargs:
                raise PluginAPIError(f"BackendInfo: {name!r} was removed in plugin API 2: {replacement}")
        if "models" not in kwargs and len(args) < 4:
            raise PluginAPIError(
                "BackendInfo: 'models' is required since plugin API 2 (it defaulted to "
                "('resnet50',)): name the models the backend trains, e.g. models=('resnet50',)"
            )
        if isinstance(kwargs.get("variants"), (tuple, list)):
            raise PluginAPIError(
                "BackendInfo: variants is a dict {model: (default, ...)} since plugin API 2 (it was one tuple for the one model)"
            )
        init(self, *args, **kwargs)

    return __init__


BackendInfo.__init__ = _migrating(BackendInfo.__init__)  # type: ignore[method-assign]


@dataclass
class Prepared:
    """What ``prepare`` reports about the run it set up. Every field is a fact, not a guess."""

    device_name: str
    #: training FLOPs per image (forward + backward), counted from the model, or None if unknown
    flops_per_image: float | None = None
    #: steps executed by one ``step()`` call (several steps per host round-trip, TPU style)
    steps_per_call: int = 1
    #: where the synthetic data lives, e.g. "device" or "host"
    data_placement: str = "device"
    #: framework-specific settings actually used (threads, kvstore, jit, ...)
    settings: dict[str, Any] = field(default_factory=dict)
    framework_version: str = ""
    #: what the user must know to read the figure (e.g. a precision this hardware only emulates);
    #: shown in the terminal and kept in the record's warnings
    warnings: list[str] = field(default_factory=list)
    #: seconds the framework spent compiling the step ahead of its first call, where it compiles
    #: ahead (an ahead-of-time compile in ``prepare``); None where compilation happens inside the
    #: first step, which the record's ``startup.first_step_s`` then holds (plugin API 2.1)
    compile_s: float | None = None

    def problems(self) -> list[str]:
        """Fields of the wrong type (a third-party backend's mistake, caught before any record)."""

        def number(v: object) -> bool:
            return isinstance(v, (int, float)) and not isinstance(v, bool)

        checks = {
            "device_name must be a string": isinstance(self.device_name, str),
            "flops_per_image must be a number or None": self.flops_per_image is None or number(self.flops_per_image),
            "steps_per_call must be a positive integer": isinstance(self.steps_per_call, int)
            and not isinstance(self.steps_per_call, bool)
            and self.steps_per_call > 0,
            "data_placement must be a string": isinstance(self.data_placement, str),
            "settings must be a dict with string keys": isinstance(self.settings, dict)
            and all(isinstance(k, str) for k in self.settings),
            "framework_version must be a string": isinstance(self.framework_version, str),
            "warnings must be a list of strings": isinstance(self.warnings, list)
            and all(isinstance(w, str) for w in self.warnings),
            "compile_s must be a number >= 0 or None": self.compile_s is None or (number(self.compile_s) and self.compile_s >= 0),
        }
        return [message for message, ok in checks.items() if not ok]


@dataclass(frozen=True)
class DeviceMemory:
    """What ``Backend.device_memory`` reports: the device memory the process's framework held at
    its peak (model, optimizer state, activations of the batch, its caching allocator's pools), and
    which counter said so; or no figure and why (``peak_bytes`` None)."""

    peak_bytes: int | None
    #: the framework's own counter, named as the framework names it
    source: str = ""
    reason: str = ""

    @classmethod
    def on_host(cls) -> DeviceMemory:
        """A run on the CPU: its device memory is the host's, which the record counts already."""
        return cls(None, reason="a CPU run: its device memory is the host's (memory.host_peak_bytes)")


class Backend:
    """Base class for backends. Subclasses set ``info`` and implement the worker-side methods."""

    info: BackendInfo
    #: the framework's own multi-worker engine (``accelbench.launch.Engine``), if it has one; a
    #: class attribute, so it stays in the host (instances travel to workers pickled)
    engine: "Engine | None" = None

    def describe(self) -> BackendInfo:
        return self.info

    def check(self, config: "RunConfig") -> str | None:
        """Return None if this config can run here, else a one-line reason (→ ``unavailable``)."""
        return None

    def is_out_of_memory(self, error: BaseException) -> bool:
        """Whether an exception a step raised means the device or host ran out of memory (the
        record then says so). A framework with an exception type of its own overrides this."""
        return isinstance(error, MemoryError) or "out of memory" in str(error).lower()

    def prepare(self, config: "RunConfig") -> Prepared:
        raise NotImplementedError

    def device_memory(self) -> DeviceMemory:
        """Optional (plugin API 2.1): called once after the timed steps, in the worker. The
        framework's own peak of device memory since the process started, as its caching allocator
        counts it (the plugin guide names the built-in plugins' counters); on a CPU, where the
        device's memory is the host's, no figure and that reason (the record's host peak counts it)."""
        return DeviceMemory(None, reason=f"{self.describe().name} does not report device memory")

    def step(self) -> float | None:
        """Run one synced training step; return the loss (a host float) when there is one."""
        raise NotImplementedError

    def prepare_matmul(self, config: "RunConfig", size: int) -> Prepared:
        """Optional, for ``accelbench peak``: make two ``size`` x ``size`` matrices at
        ``config.precision`` on the run's device (one device), with the framework's usual settings.
        ``Prepared`` names the device and the framework version. Not overridden: the framework
        gives no measured peak."""
        raise NotImplementedError

    def matmul(self) -> None:
        """One product of the prepared matrices (2 x size^3 FLOPs), returning once the device has
        finished it. Core times it as it times a step."""
        raise NotImplementedError

    def measures_peak(self) -> bool:
        return type(self).prepare_matmul is not Backend.prepare_matmul

    def teardown(self) -> dict[str, Any] | None:
        """Release resources; called once after the last step. May return final facts about the
        run (e.g. ``{"weights_checksum": ...}``, compared across workers of a multi-worker run)."""

    def write_dataset(self, examples: list[tuple[str, int]], stem: str) -> list[str]:
        """Write one split, ``(image file, label)`` pairs with the files' bytes unchanged, to files
        named from ``stem`` (a path without suffix); return the paths written."""
        raise NotImplementedError(f"{self.info.name} writes no dataset format")

    def read_dataset(self, files: list[str]) -> list[tuple[str, int]]:
        """Read a split back with the framework's reader: (sha256 of the image bytes, label) each."""
        raise NotImplementedError(f"{self.info.name} reads no dataset format")

    def prepare_training(self, config: "RunConfig", dataset: "DatasetManifest") -> Prepared:
        """Build model, optimizer and input pipelines for ``config.train`` over ``dataset`` (its
        manifest, with ``root``)."""
        raise NotImplementedError(f"{self.info.name} has no train mode")

    def train_step(self, learning_rate: float) -> float:
        """One synced step on the next training batch at this learning rate; return the loss."""
        raise NotImplementedError

    def evaluate(self) -> dict[str, float]:
        """Score the whole held-out split once: {"top1": ..., "top5": ..., "loss": ...}."""
        raise NotImplementedError

    def serve(self, config: "RunConfig") -> None:
        """Run a service role of this backend's engine (a parameter server, a scheduler), as its
        ``LaunchPlan`` environment says; returns when the job is over."""
        raise NotImplementedError(f"{self.info.name} has no distributed service role")


class RunBackend(Backend):
    """A backend whose ``prepare`` (or ``prepare_training``) builds ``self.run``, an object with
    ``step()`` (or ``train_step`` and ``evaluate``), ``weights_checksum()`` and optionally
    ``close()`` (e.g. leaving a distributed job, which peers wait for); stepping, evaluation and
    teardown delegate to it."""

    #: what ``prepare`` (or ``prepare_training``) built, until ``teardown``
    run: Any
    #: train mode: ``"module:Class"`` of what ``prepare_training`` builds over the dataset, called
    #: with the config and the ``DatasetManifest``; its module is imported only then, in the
    #: worker (it imports the framework). Empty: the backend has no train mode of this kind.
    dataset_run: str = ""

    def prepare_training(self, config: "RunConfig", dataset: "DatasetManifest") -> Prepared:
        if not self.dataset_run:
            return super().prepare_training(config, dataset)
        module, _, name = self.dataset_run.partition(":")
        self.run = getattr(importlib.import_module(module), name)(config, dataset)
        prepared: Prepared = self.run.prepared()
        return prepared

    def step(self) -> float | None:
        loss: float | None = self.run.step()
        return loss

    def train_step(self, learning_rate: float) -> float:
        loss: float = self.run.train_step(learning_rate)
        return loss

    def evaluate(self) -> dict[str, float]:
        scores: dict[str, float] = self.run.evaluate()
        return scores

    def device_memory(self) -> DeviceMemory:
        """``self.run.device_memory()`` where the run object has one."""
        if hasattr(self.run, "device_memory"):
            memory: DeviceMemory = self.run.device_memory()
            return memory
        return super().device_memory()

    def teardown(self) -> dict[str, Any]:
        final = {"weights_checksum": self.run.weights_checksum()}
        if hasattr(self.run, "close"):
            self.run.close()
        del self.run
        return final
