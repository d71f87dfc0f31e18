"""The worker protocol: every message between the host and a worker process, typed.

The host (``processes.Worker``) sends a ``Request``; the worker (``worker_main``) answers it by
``Request.answer`` on its side of the pipe, so each request names, once, what the worker does and
the type of what the host gets back (``Worker.call(Prepare()) -> Prepared``, checked by mypy on
both sides). The worker's messages are ``Hello`` (first, unasked: the protocol it speaks and what
its Python holds), ``Progress`` while a request runs, and ``Answer`` or ``Failed`` to end it.

A worker environment made by another accelbench may speak another protocol: the host refuses it in
one line, before it sends any request (``check_hello``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from accelbench.backend import DeviceMemory, Prepared
from accelbench.execution.timing import Timing, WarmUp
from accelbench.execution.training import TrainingResult
from accelbench.records.blocks import Installed

#: the version of these messages; a worker that speaks another is refused (version 1 was a tuple
#: of a command's name and its arguments, before 2026-12-07)
PROTOCOL_VERSION = 2

R = TypeVar("R", covariant=True)
#: the type of a request's answer, in a function that sends any request (``Worker.call``)
AnswerT = TypeVar("AnswerT")


class WorkerSide(Protocol):
    """What a worker process does for each request (``worker_main``'s session implements it)."""

    def check(self) -> str | None: ...
    def prepare(self) -> Prepared: ...
    def prepare_training(self) -> Prepared: ...
    def train(self) -> TrainingResult: ...
    def write_dataset(self, examples: list[tuple[str, int]], stem: str) -> list[str]: ...
    def read_dataset(self, files: list[str]) -> list[tuple[str, int]]: ...
    def run(self) -> Timing: ...
    def warm_up(self) -> WarmUp: ...
    def step(self, calls: int, calls_per_sample: int) -> Timing: ...
    def device_memory(self) -> DeviceMemory: ...
    def prepare_matmul(self, size: int) -> Prepared: ...
    def matmul(self, calls: int, repeats: int) -> list[Timing]: ...
    def teardown(self) -> dict[str, Any] | None: ...
    def serve(self) -> None: ...


class Request(Generic[R]):
    """One thing the host asks of a worker; ``R`` is the type of the answer."""

    #: the phase a failure during it names ("process died during prepare")
    phase: ClassVar[str]

    def answer(self, worker: WorkerSide) -> R:
        raise NotImplementedError


@dataclass(frozen=True)
class Check(Request[str | None]):
    """Whether the backend can run the config here: None, or the reason it cannot."""

    phase = "check"

    def answer(self, worker: WorkerSide) -> str | None:
        return worker.check()


@dataclass(frozen=True)
class Prepare(Request[Prepared]):
    """Build the model and its synthetic inputs (throughput mode)."""

    phase = "prepare"

    def answer(self, worker: WorkerSide) -> Prepared:
        return worker.prepare()


@dataclass(frozen=True)
class PrepareTraining(Request[Prepared]):
    """Train mode: build the model and the input pipelines over the config's dataset."""

    phase = "prepare_training"

    def answer(self, worker: WorkerSide) -> Prepared:
        return worker.prepare_training()


@dataclass(frozen=True)
class Train(Request[TrainingResult]):
    """Train mode: core's epoch loop, to the target or the epoch budget."""

    phase = "train"

    def answer(self, worker: WorkerSide) -> TrainingResult:
        return worker.train()


@dataclass(frozen=True)
class WriteDataset(Request[list[str]]):
    """``accelbench data``: one split written in the backend's format; the files written."""

    examples: list[tuple[str, int]]
    stem: str
    phase = "write_dataset"

    def answer(self, worker: WorkerSide) -> list[str]:
        return worker.write_dataset(self.examples, self.stem)


@dataclass(frozen=True)
class ReadDataset(Request[list[tuple[str, int]]]):
    """``accelbench data``: the (sha256, label) of every record of these files, read back."""

    files: list[str]
    phase = "read_dataset"

    def answer(self, worker: WorkerSide) -> list[tuple[str, int]]:
        return worker.read_dataset(self.files)


@dataclass(frozen=True)
class TimedRun(Request[Timing]):
    """The timing loop of ``accelbench run``: the config's warm-up, then its timed calls."""

    phase = "run"

    def answer(self, worker: WorkerSide) -> Timing:
        return worker.run()


@dataclass(frozen=True)
class WarmUpAlone(Request[WarmUp]):
    """Lockstep: the config's warm-up rule alone; the blocks follow as ``Step``."""

    phase = "warm_up"

    def answer(self, worker: WorkerSide) -> WarmUp:
        return worker.warm_up()


@dataclass(frozen=True)
class Step(Request[Timing]):
    """``calls`` calls of the step through the timing loop, ``calls_per_sample`` to a sample:
    pytest-benchmark's rounds and lockstep's blocks."""

    calls: int = 1
    calls_per_sample: int = 1
    phase = "step"

    def answer(self, worker: WorkerSide) -> Timing:
        return worker.step(self.calls, self.calls_per_sample)


@dataclass(frozen=True)
class ReadDeviceMemory(Request[DeviceMemory]):
    """The framework's peak device memory, after the timed steps."""

    phase = "device_memory"

    def answer(self, worker: WorkerSide) -> DeviceMemory:
        return worker.device_memory()


@dataclass(frozen=True)
class PrepareMatmul(Request[Prepared]):
    """``accelbench peak``: a ``size``-square matrix product, ready to time."""

    size: int
    phase = "prepare_matmul"

    def answer(self, worker: WorkerSide) -> Prepared:
        return worker.prepare_matmul(self.size)


@dataclass(frozen=True)
class TimeMatmul(Request[list[Timing]]):
    """``accelbench peak``: ``repeats`` timed regions of ``calls`` matrix products each."""

    calls: int
    repeats: int
    phase = "matmul"

    def answer(self, worker: WorkerSide) -> list[Timing]:
        return worker.matmul(self.calls, self.repeats)


@dataclass(frozen=True)
class Teardown(Request[dict[str, Any] | None]):
    """Release the model; the backend's final figures, if any."""

    phase = "teardown"

    def answer(self, worker: WorkerSide) -> dict[str, Any] | None:
        return worker.teardown()


@dataclass(frozen=True)
class Serve(Request[None]):
    """A distributed engine's service role (a parameter server, a scheduler), until the job ends."""

    phase = "serve"

    def answer(self, worker: WorkerSide) -> None:
        worker.serve()


@dataclass(frozen=True)
class Exit:
    """The host is done with this worker: it exits without an answer."""


@dataclass(frozen=True)
class Hello:
    """A worker's first message, before any request: the protocol it speaks, and what its own
    Python holds (so every record names what its worker ran)."""

    protocol: int
    installed: Installed


@dataclass(frozen=True)
class Progress:
    """Sent while a request runs (warm-up steps, epochs): for the host's progress bar."""

    phase: str
    done: int
    total: int | None


@dataclass(frozen=True)
class Answer:
    """A request's answer, of the type the request names."""

    value: Any


@dataclass(frozen=True)
class Failed:
    """A request raised in the worker: ``out_of_memory`` when the backend says the error is one."""

    message: str
    out_of_memory: bool = False


def check_hello(message: object, python: str) -> Hello:
    """The worker's first message, if it speaks this protocol; else ProtocolMismatch, one line."""
    if isinstance(message, Hello) and message.protocol == PROTOCOL_VERSION:
        return message
    spoken = message.protocol if isinstance(message, Hello) else 1
    raise ProtocolMismatch(
        f"the worker in {python} speaks worker protocol {spoken}, this accelbench {PROTOCOL_VERSION}: "
        "its environment was made by another accelbench (remove it with `accelbench env remove`, and run again)"
    )


class ProtocolMismatch(Exception):
    """A worker that speaks another protocol than this host's."""
