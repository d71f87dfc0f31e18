"""A rank's place in a multi-host job, read from the launcher that started it.

``accelbench worker`` with no rank flags asks each reader in turn -- torchrun (and Kubeflow's
PyTorchJob, which sets the same variables), Open MPI, Slurm, a Kubernetes Indexed Job -- and
takes the first whose variables are set: the innermost launcher (``srun torchrun ...`` is
torchrun's ranks inside Slurm's task). Each reader takes exactly the variables its launcher's
documentation names. The coordinator, the peer list (every rank's HOST:PORT, for engines that
need it) and this host's address follow from them where the launcher says enough (Slurm names
every node; torchrun only the master, so a peer list there must be given). Flags still win; a flag that contradicts the
environment is refused in one line, as is an environment that names no launcher.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from accelbench.errors import UsageError
from accelbench.records.blocks import Launcher

#: the coordinator's port when the launcher names none (Slurm, Open MPI, Kubernetes): this plus
#: the job id modulo 1000, so two jobs sharing a node do not collide
DEFAULT_PORT = 29400
#: how the peers' ports sit above the coordinator's: one per local rank
PEER_PORT_OFFSET = 1


@dataclass(frozen=True)
class Placement:
    """One process's ranks in the job, as its launcher says (or flags override)."""

    launcher: Launcher
    rank: int
    workers: int
    local_rank: int
    #: ranks on this node, across the launcher's processes (LOCAL_WORLD_SIZE)
    local_world_size: int
    coordinator: str | None = None
    #: every rank's node and local index in rank order, where the launcher names every node
    #: (the peers listen at the coordinator's port + 1 + local index)
    peer_nodes: tuple[tuple[str, int], ...] = ()
    node_host: str | None = None
    #: which variable gave each field, for refusals that name it
    sources: dict[str, str] = field(default_factory=dict)

    def peers(self, per_process: int = 1) -> tuple[str, ...]:
        """Every rank's HOST:PORT when each of the launcher's processes runs ``per_process``
        ranks (--local-workers)."""
        if not self.peer_nodes or not self.coordinator:
            return ()
        base = int(self.coordinator.rpartition(":")[2]) + PEER_PORT_OFFSET
        return tuple(f"{node}:{base + local * per_process + i}" for node, local in self.peer_nodes for i in range(per_process))

    def per_process(self, ranks: int) -> Placement:
        """Each of the launcher's processes running ``ranks`` ranks (--local-workers): one task
        per node driving every device of it, as ``srun --ntasks-per-node=1`` with 8 GPUs."""
        if ranks == 1:
            return self
        return replace(
            self,
            rank=self.rank * ranks,
            workers=self.workers * ranks,
            local_rank=self.local_rank * ranks,
            local_world_size=self.local_world_size * ranks,
        )


def _int(env: Mapping[str, str], name: str) -> int:
    value = env.get(name, "")
    try:
        return int(value)
    except ValueError:
        raise UsageError(f"{name}={value!r} in the environment is not an integer") from None


def torchrun(env: Mapping[str, str]) -> Placement | None:
    """torchrun (``TORCHELASTIC_RUN_ID``) and Kubeflow's PyTorchJob: RANK, WORLD_SIZE,
    LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT."""
    if "RANK" not in env or "WORLD_SIZE" not in env:
        return None
    name = "torchrun" if "TORCHELASTIC_RUN_ID" in env else "pytorchjob"
    master = f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}" if "MASTER_ADDR" in env and "MASTER_PORT" in env else None
    return Placement(
        Launcher(name, env.get("TORCHELASTIC_RUN_ID")),
        _int(env, "RANK"),
        _int(env, "WORLD_SIZE"),
        _int(env, "LOCAL_RANK") if "LOCAL_RANK" in env else 0,
        _int(env, "LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in env else 1,
        master,
        sources={"rank": "RANK", "workers": "WORLD_SIZE", "coordinator": "MASTER_ADDR/MASTER_PORT"},
    )


def open_mpi(env: Mapping[str, str]) -> Placement | None:
    """Open MPI's ``mpirun``: OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE. It names no
    coordinator: MASTER_ADDR/MASTER_PORT if set, else --coordinator."""
    if "OMPI_COMM_WORLD_RANK" not in env:
        return None
    master = f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}" if "MASTER_ADDR" in env and "MASTER_PORT" in env else None
    return Placement(
        Launcher("openmpi", env.get("OMPI_MCA_orte_ess_jobid") or env.get("PMIX_NAMESPACE")),
        _int(env, "OMPI_COMM_WORLD_RANK"),
        _int(env, "OMPI_COMM_WORLD_SIZE"),
        _int(env, "OMPI_COMM_WORLD_LOCAL_RANK"),
        _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE"),
        master,
        sources={"rank": "OMPI_COMM_WORLD_RANK", "workers": "OMPI_COMM_WORLD_SIZE"},
    )


def slurm(env: Mapping[str, str]) -> Placement | None:
    """A task of a Slurm job step (``srun``): SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID,
    SLURM_NODEID, SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST), SLURM_STEP_TASKS_PER_NODE (else
    SLURM_TASKS_PER_NODE). Node lists are expanded as Slurm does (``node[01-04,07]``); the
    coordinator is the first node, the peers every task's node in rank order (Slurm's
    default block distribution)."""
    if "SLURM_PROCID" not in env:
        return None  # a batch script outside srun is no task: it has SLURM_JOB_ID alone
    import hostlist

    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or ""
    nodes = hostlist.expand_hostlist(nodelist) if nodelist else []
    rank, workers = _int(env, "SLURM_PROCID"), _int(env, "SLURM_NTASKS") if "SLURM_NTASKS" in env else 1
    counts = _tasks_per_node(env, len(nodes))
    node_id = _int(env, "SLURM_NODEID") if "SLURM_NODEID" in env else 0
    job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    port = DEFAULT_PORT + (int(job) % 1000 if job and job.isdigit() else 0)
    peer_nodes: tuple[tuple[str, int], ...] = ()
    if nodes and sum(counts) == workers and env.get("SLURM_DISTRIBUTION", "block").startswith("block"):
        peer_nodes = tuple((node, local) for node, count in zip(nodes, counts) for local in range(count))
    this_node = env.get("SLURMD_NODENAME") or (nodes[node_id] if node_id < len(nodes) else None)
    return Placement(
        Launcher("slurm", job, nodes or None),
        rank,
        workers,
        _int(env, "SLURM_LOCALID") if "SLURM_LOCALID" in env else 0,
        counts[node_id] if node_id < len(counts) else 1,
        f"{nodes[0]}:{port}" if nodes else None,
        peer_nodes,
        this_node,
        sources={"rank": "SLURM_PROCID", "workers": "SLURM_NTASKS", "coordinator": "SLURM_STEP_NODELIST"},
    )


def _tasks_per_node(env: Mapping[str, str], nodes: int) -> list[int]:
    """``2(x3),1`` -> [2, 2, 2, 1], as Slurm writes SLURM_TASKS_PER_NODE."""
    import hostlist

    text = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    if not text:
        return [1] * nodes
    try:
        return [int(n) for n in hostlist.parse_slurm_tasks_per_node(text)]
    except (ValueError, TypeError):
        raise UsageError(f"SLURM_TASKS_PER_NODE={text!r} in the environment is not Slurm's tasks-per-node form") from None


def kubernetes(env: Mapping[str, str], service: str | None, workers: int | None) -> Placement | None:
    """A pod of a Kubernetes Indexed Job: JOB_COMPLETION_INDEX, with the headless Service that
    gives pod ``<job>-<i>`` the name ``<job>-<i>.<service>`` (--service) and the job's
    completions (--workers: Kubernetes puts no count in the pod's environment)."""
    if "JOB_COMPLETION_INDEX" not in env:
        return None
    if not service:
        raise UsageError("a Kubernetes Indexed Job's pods are named through its headless Service: give --service NAME")
    if workers is None:
        raise UsageError("a Kubernetes Indexed Job's pods do not see its completions: give --workers N")
    index = _int(env, "JOB_COMPLETION_INDEX")
    hostname = env.get("HOSTNAME") or socket.gethostname()
    job = hostname.rsplit("-", 1)[0] if hostname.endswith(f"-{index}") else hostname
    names = [f"{job}-{i}.{service}" for i in range(workers)]
    return Placement(
        Launcher("kubernetes-indexed-job", job, names),
        index,
        workers,
        0,
        1,
        f"{names[0]}:{DEFAULT_PORT}",
        tuple((name, 0) for name in names),
        names[index] if index < workers else None,
        sources={"rank": "JOB_COMPLETION_INDEX"},
    )


def from_environment(env: Mapping[str, str], service: str | None = None, workers: int | None = None) -> Placement | None:
    """The first launcher whose variables are set, innermost first; None when none is."""
    for reader in (torchrun, open_mpi, slurm):
        found = reader(env)
        if found:
            return found
    return kubernetes(env, service, workers)


NO_LAUNCHER = (
    "accelbench worker: give --rank, --workers and --coordinator, or start it under a launcher "
    "(srun, torchrun, mpirun, a Kubernetes Indexed Job): the environment names none"
)


def resolve(
    env: Mapping[str, str],
    rank: int | None,
    workers: int | None,
    coordinator: str | None,
    local_workers: int = 1,
    service: str | None = None,
) -> Placement:
    """The flags over the launcher's environment: a flag wins where the environment is silent
    and must agree where it is not. One line, before any framework starts, otherwise."""
    found = from_environment(env, service, workers)
    if found is None:
        if rank is None or workers is None or coordinator is None:
            raise UsageError(NO_LAUNCHER)
        return Placement(Launcher("flags"), rank, workers, 0, local_workers, coordinator)
    if not 0 <= found.rank < found.workers:
        raise UsageError(f"{found.sources.get('rank', 'rank')}={found.rank} is outside the job's {found.workers} workers")
    placed = found.per_process(local_workers)
    for flag, given, read, what in (("--rank", rank, placed.rank, "rank"), ("--workers", workers, placed.workers, "workers")):
        if given is not None and given != read:
            raise UsageError(f"{flag} {given} contradicts {found.sources.get(what, what)} ({found.launcher.name}: {what} {read})")
    chosen = coordinator or placed.coordinator
    if chosen is None:
        raise UsageError(f"{found.launcher.name} names no coordinator: give --coordinator HOST:PORT")
    return replace(placed, coordinator=chosen, node_host=_address(placed.node_host))


def _address(host: str | None) -> str | None:
    """A node's name as the cluster resolves it, to the address other nodes reach it at."""
    if not host:
        return None
    try:
        return socket.gethostbyname(host)
    except OSError:
        return host
