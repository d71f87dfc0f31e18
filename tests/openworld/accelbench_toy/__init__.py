"""A numpy multilayer perceptron trained with SGD: a plugin for a framework and model core does
not know, written only against the public plugin API.

Multi-worker runs use this plugin's own engine, ``toy_allreduce``: a reducer service process
averages every worker's gradients over TCP on loopback (``reducer.py``).
"""

from __future__ import annotations

import accelbench
from accelbench.api import ClusterRank, Engine, LaunchPlan, LocalCluster

VERSION = "0.3.0"
#: hidden units per variant of the "mlp" model; "linear" has no hidden layer and no variants
HIDDEN = {"narrow": 16, "wide": 64}


class ToyAllReduce(Engine):
    name = "toy_allreduce"
    description = "gradients averaged by a reducer process over TCP"

    def local(self, cluster: LocalCluster) -> LaunchPlan:
        return self._plan(cluster.workers, f"{cluster.host}:{cluster.free_port()}", range(cluster.workers), True)

    def rank(self, cluster: ClusterRank) -> LaunchPlan:
        return self._plan(cluster.workers, cluster.coordinator, [cluster.rank], cluster.rank == 0)

    def _plan(self, workers: int, address: str, ranks, with_reducer: bool) -> LaunchPlan:
        base = {"TOY_REDUCER": address, "TOY_WORLD": str(workers)}
        services = [("reducer", base)] if with_reducer else []
        return LaunchPlan(self.name, workers, [{**base, "TOY_RANK": str(r)} for r in ranks], services)


class MlpBackend(accelbench.Backend):
    info = accelbench.BackendInfo(
        name="mlp-sgd",
        framework="numpy",
        requires=("numpy", "accelbench_toy"),
        models=("mlp", "linear"),
        variants={"mlp": tuple(HIDDEN)},
        precisions=("fp64", "fp32"),
        devices=("cpu",),
        default_batch={"cpu": 32},
        version=VERSION,
        description="numpy MLP, softmax cross-entropy, SGD",
        options={"learning_rate": accelbench.Option("SGD step size (default 0.05)", kind="float", minimum=0)},
    )
    engine = ToyAllReduce()

    def prepare(self, config):
        from . import model

        self.run = model.MlpRun(config, HIDDEN.get(config.variant, 0))
        return self.run.prepared()

    def step(self):
        return self.run.step()

    def teardown(self):
        final = {"weights_checksum": self.run.weights_checksum()}
        self.run.close()
        return final

    def prepare_matmul(self, config, size):  # accelbench peak: numpy's matrix product (BLAS)
        import numpy

        dtype = {"fp64": numpy.float64, "fp32": numpy.float32}[config.precision]
        rng = numpy.random.default_rng(config.seed)
        self.operands = [rng.standard_normal((size, size)).astype(dtype) for _ in range(2)]
        return accelbench.Prepared(device_name="numpy on the host CPU", framework_version=numpy.__version__)

    def matmul(self):
        self.operands[0] @ self.operands[1]  # returns when done: numpy is synchronous

    def serve(self, config):
        from . import reducer

        reducer.serve_from_environment()


@accelbench.hookimpl
def register_backends(register):
    register(MlpBackend())
