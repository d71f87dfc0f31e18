"""The worker process: one backend, one config, a fresh interpreter.

The host sends requests over a pipe (``protocol``: each request names what the worker does and
the type of its answer); the worker answers each with ``Answer`` or ``Failed``, and may send
``Progress`` meanwhile. Its first message, before any request, is ``Hello``: the protocol it speaks
and what its own Python holds. ``Session`` is the worker's side of every request.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import os
import random
import signal
import sys
import traceback
from multiprocessing.connection import Connection
from typing import Any

from accelbench.backend import Backend, DeviceMemory, Prepared
from accelbench.environments import datasets
from accelbench.execution import allocators, energy, training
from accelbench.execution.protocol import PROTOCOL_VERSION, Answer, Exit, Failed, Hello, Progress, Request
from accelbench.execution.timing import Timing, TimingPlan, WarmUp, run_timed, warm_up_marked
from accelbench.planning.config import RunConfig
from accelbench.records.blocks import Installed, Lock


def apply_process_settings(config: RunConfig) -> None:
    """Settings that must be in place before any framework is imported in this process."""
    threads = str(config.effective_threads)
    # OpenMP/MKL read these once, at library load: some frameworks use half the cores without them.
    for variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[variable] = threads
    random.seed(config.seed)


def die_with_parent() -> None:
    """Linux: the kernel kills this process when the host dies, however it dies (SIGKILL
    included), so a worker never runs on orphaned under PID 1. Elsewhere the pipe's EOF ends it."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


class _HostPaths(importlib.abc.MetaPathFinder):
    """The host's extra import paths (plugins on its PYTHONPATH), searched after everything this
    Python finds itself: its site-packages and the finders of its editable installs, which come
    after ``sys.path`` in ``sys.meta_path``. On ``sys.path`` the host's copy of a plugin would
    shadow the one installed editable in the environment."""

    def __init__(self, paths: list[str]):
        self.paths = paths

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if path is not None:  # a submodule: its package's __path__ decides
            return None
        return importlib.machinery.PathFinder.find_spec(name, self.paths)


def main(fd: int) -> None:
    """Entry point of the worker process: ``python -m accelbench.execution.worker_main FD``.

    The host sends its ``sys.path`` first (plain strings), then the pickled backend and config,
    then the modules of every registered framework (to report which of them this worker loaded).
    """
    die_with_parent()
    conn = Connection(fd)
    host_path, own_python = conn.recv()
    if own_python:  # another Python (an environment): its packages first, the host's extra paths after
        sys.meta_path.append(_HostPaths([p for p in host_path if p not in sys.path]))
    else:
        sys.path[:] = host_path + [p for p in sys.path if p not in host_path]
    backend, config = conn.recv()
    frameworks = conn.recv()
    # the first message of every worker, unasked: what this Python has installed, so that every
    # record names what its worker ran, whichever path of the host started it
    conn.send(Hello(PROTOCOL_VERSION, installed_here(backend)))
    apply_process_settings(config)
    session = Session(conn, backend, config, frameworks)
    while True:
        try:
            request = conn.recv()
        except (EOFError, KeyboardInterrupt):
            return
        if isinstance(request, Exit):
            return
        try:
            if not isinstance(request, Request):
                raise TypeError(f"not a worker request: {request!r}"[:200])
            conn.send(Answer(request.answer(session)))
        except BaseException as exc:  # noqa: BLE001 - every failure goes back to the host
            conn.send(Failed(_describe(exc), out_of_memory=_out_of_memory(backend, exc)))


class Session:
    """The worker's side of every request (``protocol.WorkerSide``): one backend and its config."""

    def __init__(self, conn: Connection, backend: Backend, config: RunConfig, frameworks: tuple[str, ...]):
        self.conn, self.backend, self.config, self.frameworks = conn, backend, config, frameworks
        self.steps_per_call = 1
        #: whether ``step`` has been called: the first calls carry the start-up's marks
        self.stepped = False

    def check(self) -> str | None:
        return self.backend.check(self.config)

    def prepare(self) -> Prepared:
        return self._prepared(self.backend.prepare(self.config), "prepare")

    def prepare_training(self) -> Prepared:
        return self._prepared(self.backend.prepare_training(self.config, self._dataset), "prepare_training")

    def write_dataset(self, examples: list[tuple[str, int]], stem: str) -> list[str]:
        return self.backend.write_dataset(examples, stem)

    def read_dataset(self, files: list[str]) -> list[tuple[str, int]]:
        return self.backend.read_dataset(files)

    def device_memory(self) -> DeviceMemory:
        """After the timed steps: the framework's peak."""
        return _device_memory(self.backend)

    def prepare_matmul(self, size: int) -> Prepared:
        return _checked(self.backend.prepare_matmul(self.config, size), "prepare_matmul")

    def teardown(self) -> dict[str, Any] | None:
        return self.backend.teardown()

    def serve(self) -> None:
        self.backend.serve(self.config)

    def _prepared(self, prepared: Prepared, command: str) -> Prepared:
        """What prepare reported, checked, with what only the worker can read back added."""
        _checked(prepared, command)
        self.steps_per_call = prepared.steps_per_call
        # evidence that each framework lives only in its own worker
        prepared.settings["frameworks_loaded"] = sorted(m for m in self.frameworks if m in sys.modules)
        prepared.settings["allocator"] = allocators.loaded()  # what is mapped, not what was asked
        prepared.settings["huge_pages"] = allocators.huge_pages_setting(self.config.allocator)
        missing = allocators.missing_preference(self.backend.describe().allocator, self.config.device)
        if missing:
            prepared.warnings.append(missing)
        return prepared

    def train(self) -> training.TrainingResult:
        spec = self.config.train_spec
        batch = self.config.resolved_global_batch
        result = training.train(
            self.backend, spec, training.steps_per_epoch(self._dataset, batch), batch, progress=self._progress, meter=self._meter
        )
        result.train_samples, result.eval_samples = self._dataset.count("train"), self._dataset.count("val")
        return result

    def run(self) -> Timing:
        """The timing loop of ``accelbench run``: the config's warm-up, then its timed calls."""
        self.stepped = True
        plan = TimingPlan.from_config(self.config, self.steps_per_call)
        return run_timed(self.backend.step, plan, progress=self._progress, meter=self._meter, first_steps=True)

    def warm_up(self) -> WarmUp:
        """Lockstep: the config's warm-up rule alone; its blocks come as ``step``."""
        self.stepped = True
        return warm_up_marked(self.backend.step, TimingPlan.from_config(self.config, self.steps_per_call))

    def step(self, calls: int = 1, calls_per_sample: int = 1) -> Timing:
        """``calls`` calls through the same timing loop (the pipe not timed): pytest-benchmark's
        rounds (one call a sample) and lockstep's blocks (a side's calls of a tiny step timed in
        samples of several)."""
        first, self.stepped = not self.stepped, True
        return run_timed(
            self.backend.step,
            TimingPlan(0, timed_calls=calls, steps_per_call=self.steps_per_call, calls_per_sample=calls_per_sample),
            meter=self._meter,
            first_steps=first,
        )

    def matmul(self, calls: int, repeats: int) -> list[Timing]:
        """Repeats of a timed region of matrix products (``accelbench peak``)."""
        return [
            run_timed(self.backend.matmul, TimingPlan(warmup_calls=2 if r == 0 else 0, timed_calls=calls)) for r in range(repeats)
        ]

    @functools.cached_property
    def _meter(self) -> energy.Meter:
        """The machine's energy counters, found once, before the first timed phase (a GPU's
        counters only for a run on a GPU: idle GPUs beside a CPU run are not its cost)."""
        return energy.Meter.find(gpus=self.config.device != "cpu")

    @functools.cached_property
    def _dataset(self) -> datasets.DatasetManifest:
        """Train mode's dataset manifest, read once for prepare and train."""
        return datasets.load(self.config.train_spec.dataset, validate=False)

    def _progress(self, phase: str, done: int, total: int | None) -> None:
        self.conn.send(Progress(phase, done, total))


def installed_here(backend: Backend) -> Installed:
    """This Python and the versions of the distributions providing the backend's framework modules
    and named by its environment's requirements and core's own (read here, not in the host)."""
    from accelbench.environments.machine import CORE_PACKAGES

    info = backend.describe()
    return _installed(list(info.requires), [*CORE_PACKAGES, *info.environment])


def _installed(modules: list[str], requirements: list[str]) -> Installed:
    """This Python and the versions of the distributions providing ``modules`` and named by
    ``requirements``."""
    import platform
    import re
    from importlib import metadata

    by_module = metadata.packages_distributions()
    names = [d for m in modules for d in by_module.get(m.partition(".")[0], [])]
    names += [re.split(r"[\[<>=!~;\s]", r, maxsplit=1)[0] for r in requirements]
    packages = {}
    for name in dict.fromkeys(names):
        try:
            packages[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    from accelbench.environments.machine import lock

    return Installed(sys.executable, platform.python_version(), packages, Lock(**lock()))


class ContractError(TypeError):
    """A backend returned something the protocol does not allow."""


def _checked(prepared: Any, command: str) -> Prepared:
    if not isinstance(prepared, Prepared):
        raise ContractError(f"{command}() must return accelbench.Prepared, not {type(prepared).__name__}")
    problems = prepared.problems()
    if problems:
        raise ContractError(f"{command}() broke the contract: {'; '.join(problems)}")
    return prepared


def _device_memory(backend: Backend) -> DeviceMemory:
    """The backend's report, checked: a broken one is a figure missing with its reason, not a
    failed run (the steps were measured already)."""
    try:
        found = backend.device_memory()
    except Exception as exc:  # noqa: BLE001 - the timed steps are done; keep them
        return DeviceMemory(None, reason=f"device_memory() raised {_describe(exc)}")
    peak = getattr(found, "peak_bytes", "missing")
    if not isinstance(found, DeviceMemory) or not (peak is None or (isinstance(peak, int) and peak >= 0)):
        return DeviceMemory(
            None,
            reason=f"device_memory() must return accelbench.DeviceMemory with peak_bytes an integer >= 0 or None, not {found!r}"[
                :300
            ],
        )
    return found


def _out_of_memory(backend: Backend, exc: BaseException) -> bool:
    try:
        return bool(backend.is_out_of_memory(exc))
    except Exception:  # noqa: BLE001 - a broken classifier must not hide the original error
        return False


def _describe(exc: BaseException) -> str:
    last = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    where = f" (at {last[0].filename}:{last[0].lineno})" if last else ""
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {message}{where}"[:2000]


if __name__ == "__main__":
    main(int(sys.argv[1]))
