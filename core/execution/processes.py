"""Process management: a worker process per backend and config, talked to over a pipe.

``Worker`` starts ``python -m accelbench.execution.worker_main`` (the host's Python or an environment's), sends
it the backend and config, runs its commands with a deadline, watches its resident memory, and
turns every way it can end badly (an exception, a crash, a signal, a hang, too much memory) into
a ``WorkerFailure`` with a status and a reason. Execution (``runner``), multi-worker runs
(``multiworker``), lockstep sides and ``accelbench peak`` all drive workers through it.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, cast

from accelbench.execution import allocators, memwatch
from accelbench.execution.protocol import Answer, AnswerT, Exit, Failed, Progress, ProtocolMismatch, Request, check_hello
from accelbench.planning.config import RunConfig
from accelbench.records.blocks import Installed
from accelbench.registry import BackendRef, framework_modules

#: how often the host looks at a working worker's resident memory (when it has a limit)
MEMORY_CHECK_INTERVAL_S = 0.25


class WorkerFailure(Exception):
    def __init__(self, status: str, reason: str):
        super().__init__(reason)
        self.status, self.reason = status, reason


class Worker:
    """A fresh ``python -m accelbench.execution.worker_main`` process for one backend and resolved config.

    A plain subprocess rather than multiprocessing's 'spawn', so the caller's ``__main__`` is
    never re-imported in the worker (scripts need no ``if __name__ == "__main__"`` guard). What the
    frameworks print goes to a log file, not the user's terminal.
    """

    def __init__(
        self,
        ref: BackendRef,
        config: RunConfig,
        timeout_s: float | None = None,
        env: dict[str, str] | None = None,
        label: str = "worker",
        launcher: list[str] | None = None,
        python: str | None = None,
    ):
        self.label = label
        self.python = python or sys.executable
        self.conn, child = multiprocessing.Pipe()
        fd, self.log_path = tempfile.mkstemp(prefix=f"accelbench-{ref.id.replace(':', '-')}-{label}-", suffix=".log")
        #: the host's monotonic clock when it started the process (start-up is counted from here)
        self.spawned = time.monotonic()
        with os.fdopen(fd, "w") as log:
            self.process = subprocess.Popen(
                [*(launcher or []), python or sys.executable, "-m", "accelbench.execution.worker_main", str(child.fileno())],
                pass_fds=[child.fileno()],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env={
                    **_inherited_environment(python),
                    **allocators.worker_environment(config.allocator, config.huge_pages),
                    **(env or {}),
                },
            )
        child.close()
        # so the worker imports plugins exactly as the host did; another Python keeps its own
        # packages and gets only the host's extra paths (plugins on PYTHONPATH)
        self.conn.send((_extra_paths() if python else sys.path, bool(python)))
        try:
            self.conn.send((ref.backend, config))
            self.conn.send(framework_modules())
        except Exception as exc:  # a backend holding a lock, a lambda, an open file...
            self.kill()
            self.conn.close()
            self.discard_log()
            raise WorkerFailure(
                "failed", f"the backend cannot be sent to its worker process: pickling it raised {type(exc).__name__}: {exc}"
            ) from None
        self.timeout_s = timeout_s or config.timeout_s
        self.memory_limit_mb = config.memory_limit_mb
        self.deadline = time.monotonic() + self.timeout_s
        self.phase = "start"
        #: a command was sent and its answer has not come: the worker cannot read "exit" now
        self.busy = False
        #: a record names the log, so ``close`` keeps it; otherwise (success, refusal, an
        #: interrupted run) nothing points at it and it is removed
        self.log_named = False
        #: what the worker read of its own Python (its first message, taken with the first answer)
        self.installed: Installed | None = None

    def call(self, request: Request[AnswerT], on_progress: Callable[[str, int, int | None], None] | None = None) -> AnswerT:
        """Send a request and wait for its answer; WorkerFailure on error, death or timeout."""
        self.send(request)
        while True:
            done, answer = self.take(self._receive(), on_progress)
            if done:
                # the pipe carries pickles: the answer is of the type the request names (``protocol``)
                return cast(AnswerT, answer)

    def send(self, request: Request[Any]) -> None:
        self.phase, self.busy = request.phase, True
        self.conn.send(request)

    def take(self, message: object, on_progress: Callable[[str, int, int | None], None] | None = None) -> tuple[bool, Any]:
        """Interpret one message: (True, answer) for the final one, (False, None) for progress."""
        if isinstance(message, Progress):
            if on_progress:
                on_progress(message.phase, message.done, message.total)
            return False, None
        if self.installed is None:  # the first message: the worker's Hello
            try:
                self.installed = check_hello(message, self.python).installed
            except ProtocolMismatch as exc:
                self.kill()
                raise WorkerFailure("failed", str(exc)) from None
            return False, None
        self.busy = False
        if isinstance(message, Answer):
            return True, message.value
        if isinstance(message, Failed):
            raise WorkerFailure("failed", f"out of memory: {message.message}" if message.out_of_memory else message.message)
        raise WorkerFailure("failed", f"the worker sent {type(message).__name__}, not an answer, during {self.phase}")

    def receive_now(self) -> object:
        """One message that ``multiprocessing.connection.wait`` said is ready (or the death notice)."""
        try:
            message: object = self.conn.recv()
            return message
        except (EOFError, ConnectionResetError):
            raise WorkerFailure("failed", self._died(self.wait_exit(5))) from None

    def death(self, within_s: float) -> str | None:
        """How the process ended, if it ends within ``within_s`` seconds (None while it lives)."""
        code = self.wait_exit(within_s)
        return None if code is None else self._died(code)

    def _died(self, code: int | None) -> str:
        return f"process died during {self.phase}: {_exit_text(code)}"

    def keep_log(self, failure: WorkerFailure) -> WorkerFailure:
        """The failure, with the path of the worker's log (kept for the user) appended."""
        return WorkerFailure(failure.status, f"{failure.reason} [worker log: {self.name_log()}]")

    def check_memory(self) -> None:
        """Kill the worker (WorkerFailure) when it and its children hold more resident memory
        than ``memory_limit_mb``."""
        if not self.memory_limit_mb or self.process.poll() is not None:
            return
        used = memwatch.tree_rss_mb(self.process.pid)
        if used is not None and used > self.memory_limit_mb:
            self.kill()
            raise WorkerFailure(
                "failed",
                f"out of memory: the worker held {used:.0f} MB resident, over the "
                f"{self.memory_limit_mb} MB limit (--memory-limit-mb), during {self.phase}",
            )

    def name_log(self) -> str:
        """The log's path, for a record that names it (so it is kept)."""
        self.log_named = True
        return self.log_path

    def discard_log(self) -> None:
        Path(self.log_path).unlink(missing_ok=True)

    def _receive(self) -> object:
        while True:
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                self.kill()
                raise WorkerFailure("timeout", f"no result within the {self.timeout_s:g} s timeout (stopped during {self.phase})")
            # without a limit, one wait: a host that wakes up often steals a core from the framework
            if self.conn.poll(min(remaining, MEMORY_CHECK_INTERVAL_S) if self.memory_limit_mb else remaining):
                break
            self.check_memory()
        try:
            message: object = self.conn.recv()
            return message
        except (EOFError, ConnectionResetError):
            raise WorkerFailure("failed", f"worker {self._died(self.wait_exit(5))}") from None

    def request_exit(self) -> None:
        if self.process.poll() is None and not self.conn.closed:
            try:
                self.conn.send(Exit())
            except (BrokenPipeError, OSError):
                pass

    def close(self) -> None:
        """Let an idle worker exit on its own (a framework may flush or leave a job); a worker
        still in a phase (interrupted, failed peer) cannot read the request and is killed now."""
        if not self.busy:
            self.request_exit()
            if self.process.poll() is None:
                self.wait_exit(10)
        self.kill()
        self.conn.close()
        if not self.log_named:
            self.discard_log()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.wait_exit(5)

    def wait_exit(self, seconds: float) -> int | None:
        try:
            return self.process.wait(seconds)
        except subprocess.TimeoutExpired:
            return None


def installed_by(*workers: Worker | None) -> list[Installed] | None:
    """What the workers read of their own Pythons, for a trial's outcome (None: none read yet)."""
    found = [w.installed for w in workers if w is not None and w.installed is not None]
    return found or None


def _inherited_environment(python: str | None) -> dict[str, str]:
    """The host's environment variables for a worker; without PYTHONPATH for another Python, whose
    own packages must come first (a host path holding numpy 1.26 would shadow an environment's
    numpy 2): the host's extra paths reach that worker after its own (``_extra_paths``)."""
    inherited = dict(os.environ)
    if python:
        inherited.pop("PYTHONPATH", None)
    return inherited


def _extra_paths() -> list[str]:
    """The host's import paths that are neither its standard library nor installed packages."""
    installed = ("site-packages", "dist-packages")
    prefixes = (sys.base_prefix, sys.prefix, sys.exec_prefix)
    return [p for p in sys.path if p and not any(part in p for part in installed) and not p.startswith(prefixes)]


def _exit_text(code: int | None) -> str:
    if code is None:
        return "no exit status"
    if code < 0:
        name = signal.Signals(-code).name
        hint = " (the kernel's out-of-memory killer sends this)" if name == "SIGKILL" else ""
        return f"killed by {name}{hint}"
    return f"exited with code {code}"
