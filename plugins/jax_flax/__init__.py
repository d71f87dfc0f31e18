"""jax_flax: ResNet-50 v1.5 in Flax, trained by a jitted optax SGD step, data-parallel over the
local devices with ``jax.sharding``; bf16 compute with fp32 parameters (today's TPU recipe; what
XLA makes of it is read from the compiled step, ``hlo``) or fp32. JAX needs numpy 2 and mxnet
1.9.1 numpy < 2, so this backend's workers run in an environment of their own, made on first use
(``BackendInfo.environment``)."""

from __future__ import annotations

from accelbench.api import (
    BackendInfo,
    ClusterRank,
    Engine,
    LaunchPlan,
    LocalCluster,
    Option,
    Prepared,
    RunBackend,
    RunConfig,
    hookimpl,
)
from accelbench.plugins.shared.extras import extra

PLUGIN_API = "2.3"  # the plugin API this built-in is written for, checked as a third-party one's

VERSION = "0.1.0"


class JaxDistributedEngine(Engine):
    """``jax.distributed``: every process joins the coordinator (process 0 runs it) and XLA's
    collectives all-reduce the gradients inside the jitted step (gloo between CPU processes)."""

    name = "jax_distributed"
    description = "jax.distributed.initialize with a coordinator; collectives inside the jitted step"

    def local(self, cluster: LocalCluster) -> LaunchPlan:
        return self._plan(f"{cluster.host}:{cluster.free_port()}", cluster.workers, range(cluster.workers))

    def rank(self, cluster: ClusterRank) -> LaunchPlan:
        return self._plan(cluster.coordinator, cluster.workers, [cluster.rank])

    def _plan(self, coordinator: str, workers: int, ranks) -> LaunchPlan:
        from .training import COORDINATOR, PROCESS_ID, PROCESSES

        return LaunchPlan(
            self.name, workers, [{COORDINATOR: coordinator, PROCESSES: str(workers), PROCESS_ID: str(rank)} for rank in ranks]
        )


class FlaxResNet50(RunBackend):
    info = BackendInfo(
        name="resnet50",
        framework="jax",
        requires=("jax", "flax", "optax"),
        models=("resnet50", "resnet_small"),
        variants={"resnet50": ("v1.5",)},
        precisions=("bf16", "fp32"),
        devices=("cpu", "gpu", "tpu"),
        batch_semantics="global",
        default_batch={"cpu": 8, "gpu": 256, "tpu": 1024},
        version=VERSION,
        description="Flax ResNet-50 v1.5, jitted optax SGD step, jax.sharding data parallel, bf16 by default",
        options={
            "learning_rate_on_device": Option(
                "pass the step its learning rate as an array already on the devices, made once per "
                "rate, instead of a Python float converted at every call (default false)",
                kind="bool",
            ),
            "xla_flags": Option(
                "flags added to XLA_FLAGS before JAX starts, e.g. "
                "'--xla_gpu_enable_latency_hiding_scheduler=true' (read back from the worker's XLA_FLAGS)"
            ),
        },
        # tcmalloc measured 1.222x the C library's malloc (95% CI 1.145-1.304) on the Zen 4 CPU, bf16
        # (README, levers): with glibc's malloc a step took ~330,000 page faults and 0.67 s of kernel CPU
        data_format="imagefolder",
        environment=extra("jax"),
        allocator="tcmalloc",
    )
    engine = JaxDistributedEngine()

    def check(self, config: RunConfig) -> str | None:
        from . import training

        return training.device_problem(config)

    def prepare(self, config: RunConfig) -> Prepared:
        from . import training

        self.run = training.JaxRun(config)
        return self.run.prepared()

    # accelbench peak: a jitted jnp.dot at the run's precision, synced with block_until_ready
    def prepare_matmul(self, config: RunConfig, size: int) -> Prepared:
        from . import hlo, training

        jax = training.import_jax(config)
        import jax.numpy as jnp

        device = jax.local_devices(backend=config.device)[0]
        dtype = jnp.dtype(training.COMPUTE_DTYPES[config.resolved_precision])
        keys = jax.random.split(jax.random.PRNGKey(config.seed))
        self.operands = [jax.device_put(jax.random.normal(k, (size, size)).astype(dtype), device) for k in keys]
        self.product = jax.jit(jnp.dot)
        dots = hlo.dot_operands(self.product.lower(*self.operands).compile().as_text())  # the call reuses it
        return Prepared(
            device_name=training.device_name(device),
            framework_version=jax.__version__,
            settings={"operator": "jax.jit(jnp.dot)", "dtype": str(dtype), "xla_dot_operands": dots},
            warnings=training.emulation_warnings(config.resolved_precision, device.platform, dots, "the matrix product"),
        )

    def matmul(self) -> None:
        self.product(*self.operands).block_until_ready()

    # train mode (accelbench.execution.training): the image folder, decoded by Pillow into numpy batches
    dataset_run = f"{__name__}.dataset:JaxDatasetRun"

    def write_dataset(self, examples: list[tuple[str, int]], stem: str) -> list[str]:
        from accelbench.plugins.shared import imagefolder

        return imagefolder.write(examples, stem)

    def read_dataset(self, files: list[str]) -> list[tuple[str, int]]:
        from accelbench.plugins.shared import imagefolder

        return imagefolder.read(files)


@hookimpl
def register_backends(register):
    register(FlaxResNet50())
