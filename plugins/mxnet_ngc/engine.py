"""MXNet's ``dist_sync`` kvstore over ps-lite: a scheduler, servers and workers, configured by
``DMLC_*`` variables. The scheduler and servers run as service processes (the backend's ``serve``).

MXNet's own tools/launch.py is not used: it fails on Python >= 3.9 and guesses the host address
from the outgoing interface. Nothing here imports MXNet.
"""

from __future__ import annotations

from accelbench.api import ClusterRank, Engine, LaunchPlan, LocalCluster, UsageError


class DmlcPsEngine(Engine):
    name = "dmlc_ps"
    description = "DMLC_* roles for MXNet's dist_sync kvstore (ps-lite scheduler and servers as services)"

    def local(self, cluster: LocalCluster) -> LaunchPlan:
        return dmlc_plan(
            cluster.workers,
            servers=1,
            root_host=cluster.host,
            root_port=cluster.free_port(),
            node_host=cluster.host,
            interface="lo",
        )

    def rank(self, cluster: ClusterRank) -> LaunchPlan:
        if not cluster.node_host:
            raise UsageError("--host (this host's address as the others reach it) is required for MXNet")
        full = dmlc_plan(
            cluster.workers, cluster.servers, cluster.coordinator_host, cluster.coordinator_port, cluster.node_host, interface=""
        )
        # rank 0 runs the scheduler and the servers, on the coordinator's host
        services = (
            [(role, {**env, "DMLC_NODE_HOST": cluster.coordinator_host}) for role, env in full.services]
            if cluster.rank == 0
            else []
        )
        return LaunchPlan(self.name, cluster.workers, [full.worker_envs[cluster.rank]], services)


def dmlc_plan(workers: int, servers: int, root_host: str, root_port: int, node_host: str, interface: str) -> LaunchPlan:
    base = {
        "DMLC_PS_ROOT_URI": root_host,
        "DMLC_PS_ROOT_PORT": str(root_port),
        "DMLC_NUM_SERVER": str(servers),
        "DMLC_NUM_WORKER": str(workers),
        "DMLC_NODE_HOST": node_host,
        "PS_VERBOSE": "0",
    }
    if interface:
        base["DMLC_INTERFACE"] = interface
    services = [("scheduler", {**base, "DMLC_ROLE": "scheduler"})]
    services += [("server", {**base, "DMLC_ROLE": "server"}) for _ in range(servers)]
    return LaunchPlan(DmlcPsEngine.name, workers, [{**base, "DMLC_ROLE": "worker"} for _ in range(workers)], services)
