"""Multi-worker trials: N worker processes (plus the engine's services) driven in lock step.

Every phase (check, prepare, timing loop, teardown) is sent to all workers before any answer is
awaited, because the frameworks' collectives block until every worker joins. The first worker
or service to fail ends the whole run at once: the rest are killed (a peer blocked in an
all-reduce would otherwise wait for the timeout) and the record names the worker.
"""

from __future__ import annotations

import dataclasses
import socket
import time
from multiprocessing.connection import wait
from typing import Any, Callable

from accelbench.execution.processes import MEMORY_CHECK_INTERVAL_S, Worker, WorkerFailure, installed_by
from accelbench.execution.protocol import AnswerT, Check, Prepare, ReadDeviceMemory, Request, Serve, Teardown, TimedRun
from accelbench.execution.timing import ProcessUsage
from accelbench.launch import LaunchPlan
from accelbench.planning.config import RunConfig
from accelbench.records.blocks import WorkerRow
from accelbench.records.footprint import Startup
from accelbench.records.results import TrialOutcome, TrialRow
from accelbench.registry import BackendRef

SERVICE_EXIT_GRACE_S = 20
# how long a worker's error waits for a peer's death to show (the kernel closes a dying process's
# sockets before its parent can reap it)
PEER_DEATH_WAIT_S = 1.0


def run_trial(
    ref: BackendRef,
    config: RunConfig,
    launch: LaunchPlan,
    on_progress: Callable[[str, int, int | None], None] | None = None,
    on_started: Callable[[list[Worker]], None] | None = None,
    launcher: list[str] | None = None,
    python: str | None = None,
) -> list[TrialOutcome]:
    """One trial across ``launch.workers`` processes; one outcome per rank (all failed if one did).
    ``launcher`` prefixes every process's command (a private network namespace: ``accelbench.execution.netns``)."""
    services: list[Worker] = []
    workers: list[Worker] = []
    completed = False
    try:
        for role, env in launch.services:
            services.append(Worker(ref, config, env=env, label=role, launcher=launcher, python=python))
            services[-1].send(Serve())
        for rank, env in enumerate(launch.worker_envs):
            workers.append(Worker(ref, config, env=env, label=f"rank{rank}", launcher=launcher, python=python))
        if on_started:
            on_started(workers + services)
        reasons = _all(workers, services, Check())
        refusal = next((r for r in reasons if r), None)
        if refusal:
            return [TrialOutcome("unavailable", refusal, installed=installed_by(w)) for w in workers]
        prepared = _all(workers, services, Prepare())
        timings = _all(workers, services, TimedRun(), on_progress=on_progress)
        memories = _all(workers, services, ReadDeviceMemory())
        finals = _all(workers, services, Teardown())
        completed = True
        return [
            TrialOutcome(
                "ok",
                "",
                t,
                p,
                f,
                device_memory=m,
                startup=Startup.of(w.spawned, t.startup, p.compile_s),
                installed=installed_by(w),
            )
            for t, p, f, m, w in zip(timings, prepared, finals, memories, workers)
        ]
    except WorkerFailure as failure:
        return [TrialOutcome(failure.status, failure.reason, installed=installed_by(*workers)) for _ in launch.worker_envs]
    finally:
        for process in workers:  # all at once: a framework's shutdown may wait for every peer
            process.request_exit()
        for process in workers:
            process.close()
        # a job that did not complete leaves its services waiting for peers that will never come
        # (a parameter server waits for a dead worker): nothing to wait for, they are killed
        _finish_services(services, SERVICE_EXIT_GRACE_S if completed else 0.0)


def _all(
    workers: list[Worker],
    services: list[Worker],
    request: Request[AnswerT],
    on_progress: Callable[[str, int, int | None], None] | None = None,
) -> list[AnswerT]:
    for process in workers:
        process.send(request)
    answers: dict[int, Any] = {}
    deadline = min(w.deadline for w in workers)
    by_conn: dict[Any, tuple[int | None, Worker]] = {w.conn: (rank, w) for rank, w in enumerate(workers)}
    # during teardown the workers leave the job, and a service may end with it
    by_conn.update({s.conn: (None, s) for s in services if not isinstance(request, Teardown)})
    while len(answers) < len(workers):
        pending = [c for c, (rank, _) in by_conn.items() if rank is None or rank not in answers]
        remaining = max(0.0, deadline - time.monotonic())
        watched = any(w.memory_limit_mb for w in workers)  # else one wait (see Worker._receive)
        ready = wait(pending, timeout=min(remaining, MEMORY_CHECK_INTERVAL_S) if watched else remaining)
        if not ready and watched and remaining > MEMORY_CHECK_INTERVAL_S:
            for rank, process in enumerate(workers):
                _check_memory(process, rank)
            continue
        if not ready:
            late = [rank for rank in range(len(workers)) if rank not in answers]
            logs = ", ".join(workers[rank].name_log() for rank in late)
            raise WorkerFailure(
                "timeout",
                f"no result from worker rank(s) {', '.join(map(str, late))} within the "
                f"{workers[0].timeout_s:g} s timeout (during {request.phase}) [logs: {logs}]",
            )
        for conn in ready:
            who, process = by_conn[conn]
            try:
                _take(process, who, answers, on_progress if who == 0 else None)
            except WorkerFailure as failure:
                raise _root_cause(failure, process, list(by_conn.values())) from None
    return [answers[rank] for rank in range(len(workers))]


def _root_cause(failure: WorkerFailure, failed: Worker, members: list[tuple[int | None, Worker]]) -> WorkerFailure:
    """A worker that reports an error may only be the first to notice a peer's death (a collective
    that reads from a killed peer's socket fails at once, sometimes before the host has read that
    peer's end): a peer among ``members`` (rank, or None for a service) that has died, or dies
    within a moment, is named first as the cause."""
    if failed.process.poll() is not None:  # its own death: it is the cause
        return failure
    peers = [(rank, peer) for rank, peer in members if peer is not failed]
    deadline = time.monotonic() + PEER_DEATH_WAIT_S
    while True:
        for rank, peer in peers:
            death = peer.death(0)
            if death:
                return WorkerFailure("failed", f"{_who(rank, peer)}: {death} [log: {peer.name_log()}]; then {failure.reason}")
        if not peers or time.monotonic() >= deadline:
            return failure
        time.sleep(0.05)


def _who(rank: int | None, process: Worker) -> str:
    return f"worker rank {rank}" if rank is not None else f"{process.label} process"


def _check_memory(process: Worker, rank: int) -> None:
    try:
        process.check_memory()
    except WorkerFailure as failure:
        raise WorkerFailure(failure.status, f"worker rank {rank}: {failure.reason} [log: {process.name_log()}]") from None


def _take(
    process: Worker, rank: int | None, answers: dict[int, Any], on_progress: Callable[[str, int, int | None], None] | None
) -> None:
    who = _who(rank, process)
    try:
        done, answer = process.take(process.receive_now(), on_progress)
    except WorkerFailure as failure:
        raise WorkerFailure(failure.status, f"{who}: {failure.reason} [log: {process.name_log()}]") from None
    if rank is None and done:  # a service answering means it stopped serving while workers still need it
        raise WorkerFailure("failed", f"{who} ended before the workers finished [log: {process.name_log()}]")
    if done and rank is not None:
        answers[rank] = answer


def _finish_services(services: list[Worker], grace_s: float) -> None:
    """Services end on their own once every worker has left; give them ``grace_s``, then kill."""
    deadline = time.monotonic() + grace_s
    for service in services:  # queued behind "serve": read once the role has ended
        service.request_exit()
    for service in services:
        service.wait_exit(max(0.1, deadline - time.monotonic()))
        service.close()


def merge(outcomes: list[TrialOutcome]) -> TrialOutcome:
    """One outcome for the whole run: the slowest worker's timing (global images/sec = all
    workers' images / the slowest worker's wall time), rank 0's losses; the workers' peak resident
    sets summed, the largest device peak, the last rank's start-up (the job waits for it)."""
    timings = [o.timing for o in outcomes if o.status == "ok" and o.timing is not None]
    # every rank's reading: the record says so when the ranks ran different distributions
    installed = [reading for o in outcomes for reading in o.installed or ()] or None
    if len(timings) != len(outcomes):
        worst = next((o for o in outcomes if o.status != "ok"), outcomes[0])
        return TrialOutcome(
            worst.status if worst.status != "ok" else "failed",
            worst.reason or "a worker timed nothing",
            None,
            outcomes[0].prepared,
            installed=installed,
        )
    slowest = max(timings, key=lambda t: t.wall_time_s)
    timing = dataclasses.replace(
        slowest, losses=timings[0].losses, energy=None, usage=_summed_peaks(slowest.usage, [t.usage for t in timings])
    )
    memories = [o.device_memory for o in outcomes if o.device_memory is not None]
    device_memory = max(memories, key=lambda m: m.peak_bytes or -1) if memories else None
    startups = [o.startup for o in outcomes if o.startup is not None]
    notes = {
        "host_source": f"the sum of the {len(outcomes)} workers' peak resident sets (getrusage ru_maxrss each)",
        "energy": "multi-worker runs: every worker reads the whole machine's counters; they are not added up",
    }
    return TrialOutcome(
        "ok",
        "",
        timing,
        outcomes[0].prepared,
        outcomes[0].final,
        device_memory=device_memory,
        startup=max(startups, key=lambda s: s.worker_to_first_step_s) if startups else None,
        footprint_notes=notes,
        installed=installed,
    )


def _summed_peaks(usage: ProcessUsage | None, ranks: list[ProcessUsage | None]) -> ProcessUsage | None:
    peaks = [u.peak_resident_bytes for u in ranks if u is not None and u.peak_resident_bytes]
    if usage is None or len(peaks) != len(ranks):
        return usage and dataclasses.replace(usage, peak_resident_bytes=None)
    return dataclasses.replace(usage, peak_resident_bytes=sum(peaks))


def per_worker(
    outcomes: list[TrialOutcome], per_worker_batch: int, first_rank: int = 0, first_local_rank: int = 0
) -> list[WorkerRow]:
    """Each rank run here: its figures, its host and its index among this host's ranks (a
    launcher's process may hold one of several: ``first_local_rank``)."""
    rows = []
    for index, outcome in enumerate(outcomes):
        rank, local_rank = first_rank + index, first_local_rank + index
        row = TrialRow.of(rank, outcome, per_worker_batch)
        rows.append(
            WorkerRow(
                rank,
                row.status,
                row.images,
                row.wall_time_s,
                row.images_per_sec,
                row.step_times_s,
                outcome.final or {},
                host=socket.gethostname(),
                local_rank=local_rank,
            )
        )
    return rows
