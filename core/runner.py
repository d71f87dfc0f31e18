"""Spawning workers and turning whatever happens in them into records.

Each (backend, config, trial) gets a fresh 'spawn' process. A backend that raises, kills its
process, runs out of memory or hangs past ``timeout_s`` produces a record with that status; the
other runs go on.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import tempfile
from pathlib import Path
import signal
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from . import config as configuration
from . import environment, worker
from .config import RunConfig
from .records import RunContext, TrialOutcome, build
from .errors import UsageError
from .registry import BackendRef

Progress = Callable[[str, int, str, int, int], None]  # backend id, trial, phase, done, total


class WorkerFailure(Exception):
    def __init__(self, status: str, reason: str):
        super().__init__(reason)
        self.status, self.reason = status, reason


class Worker:
    """A fresh ``python -m accelbench.worker`` process for one backend and resolved config.

    A plain subprocess rather than multiprocessing's 'spawn', so the caller's ``__main__`` is
    never re-imported in the worker (scripts need no ``if __name__ == "__main__"`` guard). What the
    frameworks print goes to a log file, not the user's terminal.
    """

    def __init__(self, ref: BackendRef, config: RunConfig, timeout_s: float | None = None):
        self.conn, child = multiprocessing.Pipe()
        fd, self.log_path = tempfile.mkstemp(prefix=f"accelbench-{ref.id.replace(':', '-')}-", suffix=".log")
        with os.fdopen(fd, "w") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "accelbench.worker", str(child.fileno())],
                pass_fds=[child.fileno()], stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        child.close()
        self.conn.send(sys.path)  # so the worker imports plugins exactly as the host did
        self.conn.send((ref.backend, config))
        self.timeout_s = timeout_s or config.timeout_s
        self.deadline = time.monotonic() + self.timeout_s
        self.phase = "start"

    def call(self, command: str, *args: Any, on_progress: Callable[[str, int, int], None] | None = None) -> Any:
        """Send a command and wait for its answer; WorkerFailure on error, death or timeout."""
        self.phase = command
        self.conn.send((command, *args))
        while True:
            message = self._receive()
            if message[0] == "progress":
                if on_progress:
                    on_progress(*message[1:])
                continue
            if message[0] == "ok":
                return message[1]
            _, kind, text = message
            raise WorkerFailure("failed", f"out of memory: {text}" if kind == "oom" else text)

    def keep_log(self, failure: WorkerFailure) -> WorkerFailure:
        """The failure, with the path of the worker's log (kept for the user) appended."""
        return WorkerFailure(failure.status, f"{failure.reason} [worker log: {self.log_path}]")

    def discard_log(self) -> None:
        Path(self.log_path).unlink(missing_ok=True)

    def _receive(self) -> tuple:
        remaining = self.deadline - time.monotonic()
        if remaining <= 0 or not self.conn.poll(remaining):
            self.kill()
            raise WorkerFailure("timeout", f"no result within the {self.timeout_s:g} s timeout "
                                           f"(stopped during {self.phase})")
        try:
            return self.conn.recv()
        except (EOFError, ConnectionResetError):
            raise WorkerFailure("failed", f"worker process died during {self.phase}: "
                                          f"{_exit_text(self._wait(5))}") from None

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                self.conn.send(("exit",))
            except (BrokenPipeError, OSError):
                pass
            self._wait(10)
        self.kill()
        self.conn.close()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self._wait(5)

    def _wait(self, seconds: float) -> int | None:
        try:
            return self.process.wait(seconds)
        except subprocess.TimeoutExpired:
            return None


def _exit_text(code: int | None) -> str:
    if code is None:
        return "no exit status"
    if code < 0:
        name = signal.Signals(-code).name
        hint = " (the kernel's out-of-memory killer sends this)" if name == "SIGKILL" else ""
        return f"killed by {name}{hint}"
    return f"exited with code {code}"


def run_trial(ref: BackendRef, config: RunConfig, on_progress: Callable[[str, int, int], None] | None = None) -> TrialOutcome:
    """check → prepare → timing loop → teardown, in one fresh worker process."""
    handle = Worker(ref, config)
    prepared = None
    try:
        reason = handle.call("check")
        if reason:
            handle.discard_log()
            return TrialOutcome("unavailable", reason)
        prepared = handle.call("prepare")
        timing = handle.call("run", config.warmup_steps, config.timed_steps, on_progress=on_progress)
        handle.call("teardown")
        handle.discard_log()
        return TrialOutcome("ok", "", timing, prepared)
    except WorkerFailure as failure:
        failure = handle.keep_log(failure)
        return TrialOutcome(failure.status, failure.reason, None, prepared)
    finally:
        handle.close()


@dataclass
class Plan:
    ref: BackendRef
    config: RunConfig  # resolved, or the unresolved one when ``precheck`` is set
    precheck: TrialOutcome | None = None


def plan(refs: list[BackendRef], config: RunConfig) -> list[Plan]:
    """Resolve every (backend, sweep point) up front, so bad input fails before anything runs."""
    _refuse_unknown_options(refs, config)
    counts = environment.device_counts()
    plans = []
    for ref in refs:
        for point in configuration.expand_sweep(config):
            refusal = _host_precheck(ref, point)
            if refusal:
                plans.append(Plan(ref, _resolve_for_record(ref, point, counts), refusal))
                continue
            plans.append(Plan(ref, _resolve(ref, point, counts)))
    return plans


def _refuse_unknown_options(refs: list[BackendRef], config: RunConfig) -> None:
    known = {key for ref in refs for key in ref.backend.describe().options}
    unknown = sorted(set(config.options) - known)
    if unknown:
        raise UsageError(f"unknown option {unknown[0]!r} for the selected backends "
                         f"(known: {', '.join(sorted(known)) or 'none'})")


def _resolve(ref: BackendRef, config: RunConfig, counts: dict[str, int]) -> RunConfig:
    info = ref.backend.describe()
    device = pick_device(info.devices, config.device, counts)
    count = config.device_count or max(1, counts.get(device, 0))
    return configuration.resolve(config, info, device, count)


def _resolve_for_record(ref: BackendRef, config: RunConfig, counts: dict[str, int]) -> RunConfig:
    """A resolved config for a refused run's record: the batch cannot be wrong here."""
    try:
        return _resolve(ref, config, counts)
    except Exception:  # noqa: BLE001 - the refusal reason is what the record reports
        info = ref.backend.describe()
        device = config.device if config.device != "auto" else "cpu"
        return configuration.resolve(config.replace(global_batch=None, per_device_batch=None),
                                     info, device, 1)


def pick_device(supported: tuple[str, ...], requested: str, counts: dict[str, int]) -> str:
    """The requested device kind, or for 'auto' the best present one the backend supports."""
    if requested != "auto":
        return requested
    for kind in ("tpu", "gpu"):
        if kind in supported and counts.get(kind, 0) > 0:
            return kind
    return "cpu"


def _host_precheck(ref: BackendRef, config: RunConfig) -> TrialOutcome | None:
    """Refusals the host can decide without a worker: missing framework, unsupported request."""
    info = ref.backend.describe()
    missing = ref.unavailable_reason()
    if missing:
        return TrialOutcome("unavailable", missing)
    wanted = {"model": (config.model, info.models), "variant": (config.variant, info.variants),
              "precision": (config.precision, info.precisions), "device": (config.device, info.devices)}
    for what, (value, supported) in wanted.items():
        if value not in (None, "auto") and value not in supported:
            return TrialOutcome("unavailable", f"{info.name} does not support {what} {value} "
                                               f"(supports {', '.join(supported)})")
    return None


def execute(plans: list[Plan], on_record: Callable[[dict], None],
            on_progress: Progress | None = None) -> Iterator[dict]:
    """Run every plan's trials; yield (and hand to ``on_record``) one record per plan."""
    env = environment.collect()
    for item in plans:
        ctx = RunContext(item.ref, item.config, env)
        if item.precheck:
            ctx.outcomes.append(item.precheck)
        else:
            _run_trials(ctx, on_progress)
        record = build(ctx)
        on_record(record)
        yield record


def _run_trials(ctx: RunContext, on_progress: Progress | None) -> None:
    for trial in range(ctx.config.trials):
        report = (lambda phase, done, total, t=trial: on_progress(ctx.ref.id, t, phase, done, total)) \
            if on_progress else None
        outcome = run_trial(ctx.ref, ctx.config, report)
        ctx.outcomes.append(outcome)
        if outcome.status != "ok":
            return

