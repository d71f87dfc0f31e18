"""Multi-worker launch: each worker's environment for its framework's own distributed engine.

- ``tf_config``: TensorFlow's MultiWorkerMirroredStrategy (collective all-reduce), configured
  by ``TF_CONFIG`` with the cluster's worker addresses and this task's index.
- ``dmlc_ps``: MXNet's ``dist_sync`` kvstore over ps-lite: a scheduler, servers and workers,
  configured by ``DMLC_*`` variables. The scheduler and servers are started here too (as worker
  processes running the backend's ``serve``); MXNet's own tools/launch.py is not used (it fails
  on Python >= 3.9 and guesses the host address from the outgoing interface).

Local runs bind only to 127.0.0.1 on ports picked free at run time.
"""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass, field

LOOPBACK = "127.0.0.1"
ENGINES = ("tf_config", "dmlc_ps")


@dataclass
class LaunchPlan:
    engine: str
    workers: int
    #: one environment per worker rank
    worker_envs: list[dict[str, str]]
    #: processes the engine needs beside the workers (MXNet scheduler and servers), by role
    services: list[tuple[str, dict[str, str]]] = field(default_factory=list)


def free_port(host: str = LOOPBACK) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def plan_local(engine: str, workers: int, servers: int = 1, host: str = LOOPBACK) -> LaunchPlan:
    """Every process on this machine, on loopback, on free ports."""
    if engine == "tf_config":
        addresses = [f"{host}:{free_port(host)}" for _ in range(workers)]
        return LaunchPlan(engine, workers, [tf_config_env(addresses, rank) for rank in range(workers)])
    if engine == "dmlc_ps":
        return dmlc_plan(workers, servers, host, free_port(host), node_host=host, interface="lo")
    raise ValueError(f"unknown distributed engine {engine!r}")


def tf_config_env(addresses: list[str], rank: int) -> dict[str, str]:
    return {"TF_CONFIG": json.dumps({"cluster": {"worker": addresses}, "task": {"type": "worker", "index": rank}})}


def dmlc_plan(workers: int, servers: int, root_host: str, root_port: int, node_host: str,
              interface: str) -> LaunchPlan:
    base = {"DMLC_PS_ROOT_URI": root_host, "DMLC_PS_ROOT_PORT": str(root_port),
            "DMLC_NUM_SERVER": str(servers), "DMLC_NUM_WORKER": str(workers),
            "DMLC_NODE_HOST": node_host, "PS_VERBOSE": "0"}
    if interface:
        base["DMLC_INTERFACE"] = interface
    services = [("scheduler", {**base, "DMLC_ROLE": "scheduler"})]
    services += [("server", {**base, "DMLC_ROLE": "server"}) for _ in range(servers)]
    return LaunchPlan("dmlc_ps", workers, [{**base, "DMLC_ROLE": "worker"} for _ in range(workers)], services)


def plan_rank(engine: str, rank: int, workers: int, coordinator: str, peers: str | None,
              node_host: str | None, servers: int = 1) -> LaunchPlan:
    """One rank of a job a cluster scheduler started on several hosts (``accelbench worker``).

    TensorFlow needs every worker's address (``peers``, in rank order). MXNet needs the
    scheduler's address (``coordinator``) and this host's (``node_host``); rank 0 also starts the
    scheduler and the servers. Nothing is guessed from network interfaces.
    """
    from .errors import UsageError

    root_host, _, port = coordinator.rpartition(":")
    if not root_host or not port.isdigit():
        raise UsageError(f"--coordinator must be HOST:PORT, got {coordinator!r}")
    if not 0 <= rank < workers:
        raise UsageError(f"--rank {rank} is not in 0..{workers - 1}")
    if engine == "tf_config":
        addresses = peers.split(",") if peers else []
        if len(addresses) != workers:
            raise UsageError(f"--peers must list all {workers} workers' HOST:PORT in rank order for TensorFlow")
        return LaunchPlan(engine, workers, [tf_config_env(addresses, rank)])
    if engine == "dmlc_ps":
        if not node_host:
            raise UsageError("--host (this host's address as the others reach it) is required for MXNet")
        full = dmlc_plan(workers, servers, root_host, int(port), node_host, interface="")
        services = [(role, {**env, "DMLC_NODE_HOST": root_host}) for role, env in full.services] if rank == 0 else []
        return LaunchPlan(engine, workers, [full.worker_envs[rank]], services)
    raise UsageError(f"unknown distributed engine {engine!r}")
