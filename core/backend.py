"""The backend protocol: what a framework plugin implements, and nothing more.

A backend never times itself. The host's timing loop (``accelbench.timing``) calls ``step`` and
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

The epoch loop, learning-rate schedule and stopping rule are core's (``accelbench.training``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .config import RunConfig


#: FLOPs of one training image per forward multiply-add: 2 FLOPs per multiply-add, and the
#: backward pass costs about twice the forward (gradients w.r.t. inputs and w.r.t. weights)
TRAINING_FLOPS_PER_FORWARD_MAC = 6


def training_flops(forward_macs: int) -> float:
    """Training FLOPs per image from the forward multiply-adds counted on the model."""
    return float(TRAINING_FLOPS_PER_FORWARD_MAC * forward_macs)


@dataclass(frozen=True)
class BackendInfo:
    """How a backend describes itself, without importing its framework."""

    name: str
    framework: str
    #: importable module names the backend needs; availability is checked with find_spec only
    requires: tuple[str, ...]
    models: tuple[str, ...] = ("resnet50",)
    variants: tuple[str, ...] = ("v1",)
    precisions: tuple[str, ...] = ("fp32",)
    devices: tuple[str, ...] = ("cpu",)
    default_variant: str = "v1"
    default_precision: str = "fp32"
    #: "global" or "per_device": how this workload's reference states its batch size
    batch_semantics: str = "per_device"
    #: default batch (in ``batch_semantics`` units) per device kind
    default_batch: dict[str, int] = field(default_factory=lambda: {"cpu": 8})
    version: str = "0"
    description: str = ""
    #: backend-specific ``config.options`` keys this backend understands, with their meaning
    options: dict[str, str] = field(default_factory=dict)
    #: the framework's own multi-worker engine this backend runs on, if any (``accelbench.launch``):
    #: "tf_config" (TF MultiWorkerMirroredStrategy) or "dmlc_ps" (MXNet dist_sync kvstore)
    distributed: str | None = None
    #: the dataset format this backend trains from in train mode ("tfrecord", "recordio"), if any
    data_format: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


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


class Backend:
    """Base class for backends. Subclasses set ``info`` and implement the worker-side methods."""

    info: BackendInfo

    def describe(self) -> BackendInfo:
        return self.info

    def check(self, config: "RunConfig") -> str | None:
        """Return None if this config can run here, else a one-line reason (→ ``unavailable``)."""
        return None

    def prepare(self, config: "RunConfig") -> Prepared:
        raise NotImplementedError

    def step(self) -> float | None:
        """Run one synced training step; return the loss (a host float) when there is one."""
        raise NotImplementedError

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

    def prepare_training(self, config: "RunConfig", dataset: dict[str, Any]) -> Prepared:
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
        """Run a non-worker role of the distributed engine (e.g. an MXNet ps-lite scheduler or
        server), as set by the launch layer's environment; returns when the job is over."""
        raise NotImplementedError(f"{self.info.name} has no distributed service role")


class RunBackend(Backend):
    """A backend whose ``prepare`` (or ``prepare_training``) builds ``self.run``, an object with
    ``step()`` (or ``train_step`` and ``evaluate``) and ``weights_checksum()``; stepping,
    evaluation and teardown delegate to it."""

    def step(self) -> float | None:
        return self.run.step()

    def train_step(self, learning_rate: float) -> float:
        return self.run.train_step(learning_rate)

    def evaluate(self) -> dict[str, float]:
        return self.run.evaluate()

    def teardown(self) -> dict[str, Any]:
        final = {"weights_checksum": self.run.weights_checksum()}
        del self.run
        return final
