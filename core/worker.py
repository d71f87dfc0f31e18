"""The worker process: one backend, one config, a fresh interpreter.

The host sends commands over a pipe; the worker answers each with ``("ok", payload)`` or
``("error", kind, message)``, and may send ``("progress", phase, done, total)`` meanwhile.

Commands: ``check``, ``prepare``, ``run`` (the timing loop), ``step`` (one synced step, for
pytest-benchmark), ``teardown``, ``serve`` (a distributed engine's service role), ``exit``; train
mode adds ``prepare_training``, ``train`` (core's epoch loop), ``write_dataset``, ``read_dataset``.
"""

from __future__ import annotations

import functools
import os
import random
import resource
import signal
import sys
import traceback
from dataclasses import asdict
from multiprocessing.connection import Connection
from typing import Any

from . import datasets, training
from .backend import Backend
from .config import RunConfig
from .timing import TimingPlan, run_timed

FRAMEWORK_MODULES = ("tensorflow", "mxnet", "torch", "jax")
#: exception type names that mean the device or host ran out of memory
OOM_ERRORS = ("MemoryError", "ResourceExhaustedError", "OutOfMemoryError")


def apply_process_settings(config: RunConfig) -> None:
    """Settings that must be in place before any framework is imported in this process."""
    threads = str(config.effective_threads)
    # OpenMP/MKL read these once, at library load: MXNet uses half the cores without them.
    for variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[variable] = threads
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    random.seed(config.seed)
    if config.memory_limit_mb:
        limit = config.memory_limit_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


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


def main(fd: int) -> None:
    """Entry point of the worker process: ``python -m accelbench.worker FD``.

    The host sends its ``sys.path`` first (plain strings), then the pickled backend and config.
    """
    die_with_parent()
    conn = Connection(fd)
    host_path = conn.recv()
    sys.path[:] = host_path + [p for p in sys.path if p not in host_path]
    backend, config = conn.recv()
    apply_process_settings(config)
    session = _Session(conn, backend, config)
    while True:
        try:
            command, *args = conn.recv()
        except (EOFError, KeyboardInterrupt):
            return
        if command == "exit":
            return
        try:
            conn.send(("ok", session.handle(command, args)))
        except BaseException as exc:  # noqa: BLE001 - every failure goes back to the host
            conn.send(("error", _error_kind(exc), _describe(exc)))


class _Session:
    def __init__(self, conn: Connection, backend: Backend, config: RunConfig):
        self.conn, self.backend, self.config = conn, backend, config
        self.steps_per_call = 1

    def handle(self, command: str, args: list[Any]) -> Any:
        if command == "check":
            return self.backend.check(self.config)
        if command in ("prepare", "prepare_training"):
            prepared = (self.backend.prepare(self.config) if command == "prepare"
                        else self.backend.prepare_training(self.config, self._dataset))
            self.steps_per_call = prepared.steps_per_call
            # evidence that each framework lives only in its own worker
            prepared.settings["frameworks_loaded"] = sorted(m for m in FRAMEWORK_MODULES if m in sys.modules)
            return asdict(prepared)
        if command == "train":
            spec = training.TrainSpec.from_dict(self.config.train)
            steps = training.steps_per_epoch(self._dataset, self.config.global_batch)
            return training.train(self.backend, spec, steps, self.config.global_batch,
                                  progress=self._progress).to_json()
        if command == "write_dataset":
            return self.backend.write_dataset(*args)
        if command == "read_dataset":
            return self.backend.read_dataset(*args)
        if command == "run":
            plan = TimingPlan.from_config(self.config, self.steps_per_call)
            return asdict(run_timed(self.backend.step, plan, progress=self._progress))
        if command == "step":  # one call through the same timing loop: its time excludes the pipe
            return asdict(run_timed(self.backend.step, TimingPlan(0, timed_calls=1, steps_per_call=self.steps_per_call)))
        if command == "teardown":
            return self.backend.teardown()
        if command == "serve":
            return self.backend.serve(self.config)
        raise ValueError(f"unknown worker command {command!r}")

    @functools.cached_property
    def _dataset(self) -> dict[str, Any]:
        """Train mode's dataset manifest, read once for prepare and train."""
        return datasets.load(self.config.train["dataset"])

    def _progress(self, phase: str, done: int, total: int) -> None:
        self.conn.send(("progress", phase, done, total))


def _error_kind(exc: BaseException) -> str:
    return "oom" if type(exc).__name__ in OOM_ERRORS else "error"


def _describe(exc: BaseException) -> str:
    last = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    where = f" (at {last[0].filename}:{last[0].lineno})" if last else ""
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {message}{where}"[:2000]


if __name__ == "__main__":
    main(int(sys.argv[1]))
