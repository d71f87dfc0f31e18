"""Multi-worker launch, engine-neutral: addresses, free ports and the plan each engine fills in.

A framework's own distributed engine (its collective all-reduce, its parameter server) is the
plugin's knowledge: a backend names an ``Engine`` object, and the engine says which environment
each worker process needs and which service processes (run by the backend's ``serve``) must run
beside the workers. Core starts and watches those processes, drives them in lock step and merges
their results (``accelbench.execution.multiworker``).

Local runs bind only to 127.0.0.1, on ports picked free at run time.
"""

from __future__ import annotations

import socket
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Callable, Iterator

from accelbench.errors import UsageError

LOOPBACK = "127.0.0.1"


@dataclass
class LaunchPlan:
    engine: str
    workers: int
    #: one environment per worker rank started here (all ranks locally; one rank on a cluster)
    worker_envs: list[dict[str, str]]
    #: processes the engine needs beside the workers, as (role, environment); each runs the
    #: backend's ``serve`` and ends on its own once the workers have left
    services: list[tuple[str, dict[str, str]]] = field(default_factory=list)


@dataclass(frozen=True)
class LocalCluster:
    """Every process on this machine: the address to bind, a source of free ports on it, and a
    private directory for the job's files (a rendezvous file) that the host removes after the trial."""

    workers: int
    scratch: str
    host: str
    #: a port free on ``host`` and not yet given to this plan (``distinct_free_ports``)
    free_port: Callable[[], int]


@dataclass(frozen=True)
class ClusterRank:
    """One rank of a job a cluster scheduler started on several hosts (``accelbench worker``).

    Nothing is guessed from network interfaces: the user gives every address an engine needs.
    """

    rank: int
    workers: int
    #: HOST:PORT of the job's coordinator (a scheduler, a rendezvous), as every host reaches it
    coordinator: str
    #: every worker's HOST:PORT in rank order, for engines that need the whole list
    peers: tuple[str, ...] = ()
    #: this host's address as the other hosts reach it, for engines that need it
    node_host: str | None = None
    #: service processes per job, for engines that run them (rank 0 starts them)
    servers: int = 1
    #: this rank's index among the ranks its host runs, and how many its host runs (one per
    #: device, as a launcher's nproc-per-node): what an engine sets as the local rank
    local_rank: int = 0
    local_workers: int = 1
    #: ranks on this host across every process a launcher started there (LOCAL_WORLD_SIZE; None:
    #: ``local_workers``, this process's)
    local_world_size: int | None = None

    @property
    def coordinator_host(self) -> str:
        return self.coordinator.rpartition(":")[0]

    @property
    def coordinator_port(self) -> int:
        return int(self.coordinator.rpartition(":")[2])


class Engine:
    """A framework's multi-worker engine, as a plugin describes it. Lives in the host: it must
    not import its framework (the workers do that)."""

    #: the name records carry in ``distributed.engine`` (an identifier)
    name: str = ""
    description: str = ""

    def local(self, cluster: LocalCluster) -> LaunchPlan:
        """Every worker (and service) on this machine, bound to ``cluster.host`` only."""
        raise NotImplementedError

    def rank(self, cluster: ClusterRank) -> LaunchPlan:
        """This host's worker (and, on rank 0, the services) of a job spread over several hosts.
        Raise ``accelbench.UsageError`` naming the flag when an address the engine needs is missing."""
        raise UsageError(f"engine {self.name} runs on one machine only")


@contextmanager
def distinct_free_ports(host: str = LOOPBACK) -> Iterator[Callable[[], int]]:
    """A source of free ports on ``host`` that never gives one twice.

    Each port stays bound until the block ends: a port closed at once can come straight back from
    the next bind (CI once planned two workers on one port)."""
    held: list[socket.socket] = []

    def take() -> int:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        held.append(sock)
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port

    try:
        yield take
    finally:
        for sock in held:
            sock.close()


def plan_local(engine: Engine, workers: int, scratch: str, host: str = LOOPBACK) -> LaunchPlan:
    """``scratch``: a directory that lives as long as the trial (the caller makes and removes it)."""
    with distinct_free_ports(host) as free_port:
        return engine.local(LocalCluster(workers, scratch, host, free_port))


def plan_rank(engine: Engine, cluster: ClusterRank) -> LaunchPlan:
    """Check the addresses every engine needs, then ask the engine for this rank's processes."""
    host, _, port = cluster.coordinator.rpartition(":")
    if not host or not port.isdigit():
        raise UsageError(f"--coordinator must be HOST:PORT, got {cluster.coordinator!r}")
    if not 0 <= cluster.rank < cluster.workers:
        raise UsageError(f"--rank {cluster.rank} is not in 0..{cluster.workers - 1}")
    return engine.rank(cluster)


def plan_host(engine: Engine, first: ClusterRank) -> LaunchPlan:
    """The ranks one host runs, ``first.rank`` and the ``first.local_workers - 1`` after it, each
    planned by the engine as a rank of its own (with its local rank); the services come from the
    plan of the job's rank 0, on the host that runs it."""
    last = first.rank + first.local_workers - 1
    if last >= first.workers:
        raise UsageError(
            f"--rank {first.rank} with --local-workers {first.local_workers} runs ranks up to {last}, "
            f"beyond the job's {first.workers} workers"
        )
    plans = [
        plan_rank(engine, replace(first, rank=first.rank + i, local_rank=first.local_rank + i))
        for i in range(first.local_workers)
    ]
    return LaunchPlan(
        plans[0].engine,
        first.workers,
        [env for plan in plans for env in plan.worker_envs],
        [service for plan in plans for service in plan.services],
    )
