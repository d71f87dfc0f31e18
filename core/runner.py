"""Starting workers and turning whatever happens in them into records.

Each (backend, config, trial) gets a fresh worker process. A backend that raises, kills its
process, runs out of memory or hangs past ``timeout_s`` produces a record with that status; the
other runs go on.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from . import config as configuration
from . import datasets, environment, training
from .config import RunConfig
from .errors import UsageError
from .records import RunContext, TrialOutcome, build
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

    def __init__(self, ref: BackendRef, config: RunConfig, timeout_s: float | None = None,
                 env: dict[str, str] | None = None, label: str = "worker"):
        self.label = label
        self.conn, child = multiprocessing.Pipe()
        fd, self.log_path = tempfile.mkstemp(prefix=f"accelbench-{ref.id.replace(':', '-')}-{label}-", suffix=".log")
        with os.fdopen(fd, "w") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "accelbench.worker", str(child.fileno())],
                pass_fds=[child.fileno()], stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                env={**os.environ, **(env or {})})
        child.close()
        self.conn.send(sys.path)  # so the worker imports plugins exactly as the host did
        self.conn.send((ref.backend, config))
        self.timeout_s = timeout_s or config.timeout_s
        self.deadline = time.monotonic() + self.timeout_s
        self.phase = "start"

    def call(self, command: str, *args: Any, on_progress: Callable[[str, int, int], None] | None = None) -> Any:
        """Send a command and wait for its answer; WorkerFailure on error, death or timeout."""
        self.send(command, *args)
        while True:
            done, answer = self.take(self._receive(), on_progress)
            if done:
                return answer

    def send(self, command: str, *args: Any) -> None:
        self.phase = command
        self.conn.send((command, *args))

    def take(self, message: tuple, on_progress: Callable[[str, int, int], None] | None = None) -> tuple[bool, Any]:
        """Interpret one message: (True, answer) for the final one, (False, None) for progress."""
        if message[0] == "progress":
            if on_progress:
                on_progress(*message[1:])
            return False, None
        if message[0] == "ok":
            return True, message[1]
        _, kind, text = message
        raise WorkerFailure("failed", f"out of memory: {text}" if kind == "oom" else text)

    def receive_now(self) -> tuple:
        """One message that ``multiprocessing.connection.wait`` said is ready (or the death notice)."""
        try:
            return self.conn.recv()
        except (EOFError, ConnectionResetError):
            raise WorkerFailure("failed", f"process died during {self.phase}: {_exit_text(self.wait_exit(5))}") from None

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
                                          f"{_exit_text(self.wait_exit(5))}") from None

    def request_exit(self) -> None:
        if self.process.poll() is None and not self.conn.closed:
            try:
                self.conn.send(("exit",))
            except (BrokenPipeError, OSError):
                pass

    def close(self) -> None:
        self.request_exit()
        if self.process.poll() is None:
            self.wait_exit(10)
        self.kill()
        self.conn.close()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.wait_exit(5)

    def wait_exit(self, seconds: float) -> int | None:
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
    """check → prepare → timing loop (or train mode's epoch loop) → teardown, in one fresh worker."""
    handle = Worker(ref, config)
    prepared = None
    try:
        reason = handle.call("check")
        if reason:
            handle.discard_log()
            return TrialOutcome("unavailable", reason)
        if config.mode == "train":
            prepared = handle.call("prepare_training")
            training = handle.call("train", on_progress=on_progress)
            timing = training.pop("steady")
        else:
            prepared = handle.call("prepare")
            training, timing = None, handle.call("run", config.warmup_steps, config.timed_steps, on_progress=on_progress)
        handle.call("teardown")
        handle.discard_log()
        return TrialOutcome("ok", "", timing, prepared, training=training)
    except WorkerFailure as failure:
        failure = handle.keep_log(failure)
        return TrialOutcome(failure.status, failure.reason, None, prepared)
    finally:
        handle.close()


@dataclass
class Plan:
    ref: BackendRef
    config: RunConfig  # resolved (as far as a refused run allows)
    #: the host's refusal (framework missing, unsupported request), when there is one
    precheck: TrialOutcome | None = None


def plan(refs: list[BackendRef], config: RunConfig) -> list[Plan]:
    """Resolve every (backend, sweep point) up front, so bad input fails before anything runs."""
    _refuse_unknown_options(refs, config)
    counts = environment.device_counts()
    dataset = datasets.load(config.train["dataset"]) if config.mode == "train" else None
    plans = []
    for ref in refs:
        for point in configuration.expand_sweep(config):
            refusal = _host_precheck(ref, point) or _dataset_precheck(ref, dataset)
            if refusal:
                plans.append(Plan(ref, _resolve_for_record(ref, point, counts), refusal))
                continue
            resolved = _resolve(ref, point, counts)
            if dataset and training.steps_per_epoch(dataset, resolved.global_batch) < 1:
                raise UsageError(f"global batch {resolved.global_batch} is larger than the training split "
                                 f"({dataset['splits']['train']['count']} images)")
            if resolved.workers > 1 and resolved.scaling_baseline:
                plans.append(Plan(ref, configuration.single_worker_baseline(resolved)))
            plans.append(Plan(ref, resolved))
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
    if config.workers > 1 and not info.distributed:
        return TrialOutcome("unavailable", f"{info.name} has no multi-worker engine")
    return None


def _dataset_precheck(ref: BackendRef, dataset: dict[str, Any] | None) -> TrialOutcome | None:
    """Train mode: the backend must train from a format this dataset was converted into."""
    if dataset is None:
        return None
    fmt = ref.backend.describe().data_format
    if fmt is None:
        return TrialOutcome("unavailable", f"{ref.id} has no train mode")
    if fmt not in dataset["formats"]:
        return TrialOutcome("unavailable", f"the dataset at {dataset['root']} has no {fmt} files "
                                           f"(formats: {', '.join(dataset['formats'])}); convert it again "
                                           f"with `accelbench data` where {ref.backend.describe().framework} is installed")
    return None


def execute(plans: list[Plan], on_record: Callable[[dict], None],
            on_progress: Progress | None = None) -> Iterator[dict]:
    """Run every plan's trials; yield (and hand to ``on_record``) one record per plan."""
    env = environment.collect()
    baselines: dict[str, float] = {}
    for item in plans:
        ctx = RunContext(item.ref, item.config, env)
        if item.precheck:
            ctx.outcomes.append(item.precheck)
        elif item.config.workers > 1:
            _run_multiworker_trials(ctx, on_progress, baselines.get(_baseline_key(item.ref, item.config)))
        else:
            _run_trials(ctx, on_progress)
        record = build(ctx)
        if record["throughput"] and item.config.workers == 1:
            baselines[_baseline_key(item.ref, item.config)] = record["throughput"]["images_per_sec"]
        on_record(record)
        yield record


def _baseline_key(ref: BackendRef, config: RunConfig) -> str:
    """Runs that differ only in their worker count (same per-worker batch) share this key."""
    return configuration.single_worker_baseline(config).replace(seed=0).config_hash() + ref.id


def _run_multiworker_trials(ctx: RunContext, on_progress: Progress | None, baseline: float | None) -> None:
    from . import launch, multiworker

    engine, cfg = ctx.ref.backend.describe().distributed, ctx.config
    for trial in range(cfg.trials):
        outcomes = multiworker.run_trial(ctx.ref, cfg, launch.plan_local(engine, cfg.workers),
                                         _trial_progress(ctx, trial, on_progress))
        merged = multiworker.merge(outcomes)
        ctx.outcomes.append(merged)
        ctx.distributed = _distributed_block(engine, cfg, outcomes, 0, baseline)  # the last trial's workers
        if merged.status != "ok":
            break


def _distributed_block(engine: str, cfg: RunConfig, outcomes: list[TrialOutcome], first_rank: int,
                       baseline: float | None) -> dict:
    """The record's ``distributed`` block; ``records.build`` adds the scaling efficiency."""
    from . import multiworker

    per_worker_batch = cfg.per_device_batch * cfg.device_count
    return {"engine": engine, "workers": cfg.workers, "per_worker_batch": per_worker_batch,
            "per_worker": multiworker.per_worker(outcomes, per_worker_batch, first_rank),
            "baseline_images_per_sec": baseline, "scaling_efficiency": None}


def _trial_progress(ctx: RunContext, trial: int, on_progress: Progress | None):
    if on_progress is None:
        return None
    return lambda phase, done, total: on_progress(ctx.ref.id, trial, phase, done, total)


def _run_trials(ctx: RunContext, on_progress: Progress | None) -> None:
    for trial in range(ctx.config.trials):
        outcome = run_trial(ctx.ref, ctx.config, _trial_progress(ctx, trial, on_progress))
        ctx.outcomes.append(outcome)
        if outcome.status != "ok":
            return



class Unavailable(Exception):
    """The backend cannot run this config here; the message says why."""


class BackendSession:
    """A persistent worker for one backend and config: prepared once, then stepped on demand.

    This is what pytest-benchmark drives: each ``step()`` is one synced training step in the
    worker, timed by the caller. ``record(step_times)`` turns the caller's timings into a
    schema-valid record.
    """

    def __init__(self, ref: BackendRef, config: RunConfig):
        [item] = plan([ref], config)
        if item.precheck:
            raise Unavailable(item.precheck.reason)
        self.ref, self.config = ref, item.config
        self.call_times: list[float] = []
        self.losses: list[float | None] = []
        self.worker = Worker(ref, self.config)
        try:
            reason = self.worker.call("check")
            if reason:
                raise Unavailable(reason)
            self.prepared = self.worker.call("prepare")
        except BaseException:
            self.close()
            raise

    def step(self) -> float | None:
        """One synced call in the worker; its worker-side time is kept for ``record``."""
        timing = self.worker.call("step")
        self.call_times.append(timing["wall_time_s"])
        self.losses.extend(timing["losses"])
        return timing["losses"][-1] if timing["losses"] else None

    def record(self, timed_calls: int, warmup_calls: int, timed_by: str) -> dict:
        """A record of the last ``timed_calls`` calls, timed in the worker by the core timing loop
        (so the host<->worker pipe is not counted, as in ``accelbench run``)."""
        per_call = self.prepared["steps_per_call"]
        calls = self.call_times[-timed_calls:]
        config = self.config.replace(warmup_steps=warmup_calls * per_call, timed_steps=timed_calls * per_call)
        timing = {"step_times": [t / per_call for t in calls], "wall_time_s": sum(calls),
                  "timed_calls": timed_calls, "steps_per_call": per_call,
                  "losses": self.losses[-timed_calls:] if self.losses else []}
        prepared = {**self.prepared, "settings": {**self.prepared["settings"], "timed_by": timed_by}}
        ctx = RunContext(self.ref, config, environment.collect(), [TrialOutcome("ok", "", timing, prepared)])
        return build(ctx)

    def close(self) -> None:
        self.worker.close()
        self.worker.discard_log()


def run_rank(ref: BackendRef, config: RunConfig, launch_plan, rank: int) -> dict:
    """One rank of a multi-host job (``accelbench worker``): its record, merged later with the
    other ranks' by ``accelbench merge``. Its throughput is the job's as this rank timed it."""
    from . import multiworker

    outcomes = multiworker.run_trial(ref, config, launch_plan)
    ctx = RunContext(ref, config, environment.collect(), [multiworker.merge(outcomes)])
    ctx.distributed = _distributed_block(ref.backend.describe().distributed, config, outcomes, rank, None)
    return build(ctx)


#: converting a full ImageNet copy takes hours; a hang is the user's to stop here
DATASET_TIMEOUT_S = 7 * 24 * 3600.0


class DatasetWriter:
    """Writes one split in one format, and reads it back, in a worker of the backend owning the
    format (the framework's own writer and reader); one worker serves every split."""

    def __init__(self, ref: BackendRef):
        self.ref, self.worker = ref, None

    def __call__(self, examples: list, stem: str) -> tuple[list[str], list[tuple[str, int]]]:
        files = self._call("write_dataset", [(e.path, e.label) for e in examples], stem)
        return files, self.read(files)

    def read(self, files: list[str]) -> list[tuple[str, int]]:
        """(sha256, label) of every record of these files, read by the framework."""
        return [tuple(item) for item in self._call("read_dataset", files)]

    def _call(self, command: str, *args: Any) -> Any:
        if self.worker is None:
            self.worker = Worker(self.ref, RunConfig(device="cpu", device_count=1), DATASET_TIMEOUT_S, label="data")
        try:
            return self.worker.call(command, *args)
        except WorkerFailure as failure:
            raise RuntimeError(f"{self.ref.id}: {command} failed: {self.worker.keep_log(failure).reason}") from None

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()
            self.worker.discard_log()


@contextlib.contextmanager
def dataset_writers(refs: list[BackendRef]) -> Iterator[dict[str, DatasetWriter]]:
    """One writer per dataset format, from the first available backend that trains from it;
    their workers are closed on leaving."""
    writers: dict[str, DatasetWriter] = {}
    for ref in refs:
        fmt = ref.backend.describe().data_format
        if fmt and fmt not in writers and ref.unavailable_reason() is None:
            writers[fmt] = DatasetWriter(ref)
    try:
        yield writers
    finally:
        for writer in writers.values():
            writer.close()


def convert_dataset(source: str, out: Path, refs: list[BackendRef], preset: str | None = None,
                    seed: int = 0) -> dict[str, Any]:
    """``accelbench data``: the source in every installed framework's format, verified."""
    with dataset_writers(refs) as writers:
        return datasets.convert(source, out, writers, preset, seed)


def default_dataset(refs: list[BackendRef]) -> Path:
    """The embedded digits, converted once (for every installed format) into the user's cache."""
    with dataset_writers(refs) as writers:
        return datasets.default_digits(datasets.cache_folder(), writers)
