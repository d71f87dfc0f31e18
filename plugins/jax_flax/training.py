"""The JAX worker side: the Flax model, optax SGD, synthetic data on the devices and one jitted,
data-parallel training step. Imported only in the worker (its environment has JAX)."""

from __future__ import annotations

import os
import time

from accelbench.api import DeviceMemory, Prepared, RunConfig, training_flops

from . import hlo

MOMENTUM = 0.9
WEIGHT_DECAY = 1e-4  # the official TPU ResNet-50 recipe's
BASE_LEARNING_RATE = 0.1  # per 256 images, scaled linearly with the global batch
COMPUTE_DTYPES = {"fp32": "float32", "bf16": "bfloat16"}


#: set by the engine (``JaxDistributedEngine``) for a multi-process job
COORDINATOR, PROCESSES, PROCESS_ID = "ACCELBENCH_JAX_COORDINATOR", "ACCELBENCH_JAX_PROCESSES", "ACCELBENCH_JAX_PROCESS_ID"
_joined: list[bool] = []


def import_jax(config: RunConfig):
    """JAX, with ``device_count`` host devices on a CPU (XLA reads the flag once, at start), and
    joined to its multi-process job when the engine set one up (before any device is touched)."""
    flags = [config.options.get("xla_flags", "")]
    if config.device == "cpu" and config.resolved_device_count > 1:
        flags.append(f"--xla_force_host_platform_device_count={config.resolved_device_count}")
    for flag in filter(None, flags):
        if flag not in os.environ.get("XLA_FLAGS", ""):  # the check and the run share the process
            os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flag}".strip()
    import jax

    if os.environ.get(COORDINATOR) and not _joined:
        if config.device == "cpu":  # collectives between CPU processes
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(
            os.environ[COORDINATOR], num_processes=int(os.environ[PROCESSES]), process_id=int(os.environ[PROCESS_ID])
        )
        _joined.append(True)
    return jax


def devices(jax, config: RunConfig) -> list:
    """The job's devices: the first ``device_count`` of every process, in process order."""
    found = sorted(jax.devices(config.device), key=lambda d: (d.process_index, d.id))
    taken: dict[int, int] = {}
    chosen = []
    for device in found:
        if taken.get(device.process_index, 0) < config.resolved_device_count:
            taken[device.process_index] = taken.get(device.process_index, 0) + 1
            chosen.append(device)
    return chosen


def device_problem(config: RunConfig) -> str | None:
    jax = import_jax(config)
    try:
        found = jax.local_devices(backend=config.device)
    except RuntimeError:
        found = []
    if len(found) < config.resolved_device_count:
        return f"{config.resolved_device_count} {config.device} device(s) requested, JAX sees {len(found)}"
    return None


class JaxRun:
    """Model, optimizer state, synthetic data on the devices and the jitted step, built once."""

    def device_memory(self) -> DeviceMemory:
        """XLA's allocator's peak on the run's largest device (``memory_stats``; a CPU client
        keeps none)."""
        if self.config.device == "cpu":
            return DeviceMemory.on_host()
        stats = [device.memory_stats() or {} for device in self.devices]
        peaks = [s["peak_bytes_in_use"] for s in stats if "peak_bytes_in_use" in s]
        if len(peaks) != len(stats):
            return DeviceMemory(None, reason=f"JAX keeps no peak_bytes_in_use for {self.devices[0].platform} devices")
        return DeviceMemory(int(max(peaks)), "jax Device.memory_stats()['peak_bytes_in_use'], the largest device's")

    def __init__(self, config: RunConfig):
        jax = import_jax(config)
        import jax.numpy as jnp
        import numpy
        import optax
        from jax.sharding import Mesh, NamedSharding, PartitionSpec

        from .model import ResNet, forward_macs

        self.config, self.jax = config, jax
        self.devices = devices(jax, config)
        mesh = Mesh(numpy.array(self.devices), ("data",))
        self.replicated = NamedSharding(mesh, PartitionSpec())
        self.batch_sharded = NamedSharding(mesh, PartitionSpec("data"))
        self.model = ResNet(
            config.num_classes, small=config.model == "resnet_small", dtype=jnp.dtype(COMPUTE_DTYPES[config.resolved_precision])
        )
        key = jax.random.PRNGKey(config.seed)
        shape = (config.image_size, config.image_size, self.channels)
        variables = self.model.init(key, jnp.zeros((1, *shape)), train=False)
        macs, self.compute_dtype = forward_macs(self.model, variables, config.image_size, self.channels)
        self.flops_per_image = training_flops(macs)
        recipe = self._recipe()
        self.learning_rate, self.momentum = recipe["learning_rate"], recipe["momentum"]
        self.weight_decay, self.nesterov = recipe["weight_decay"], recipe["nesterov"]
        self.label_smoothing = config.train.label_smoothing if config.train else 0.0
        # SGD as optax.sgd composes it (momentum trace, then -learning rate), with the rate an
        # argument of the step so train mode's schedule changes it without recompiling; weight
        # decay on conv and dense kernels only, never batch-norm parameters or biases
        self.tx = optax.chain(
            optax.add_decayed_weights(
                self.weight_decay, mask=lambda params: jax.tree_util.tree_map(lambda p: p.ndim > 1, params)
            ),
            optax.trace(decay=self.momentum, nesterov=self.nesterov),
        )
        state = (variables["params"], variables["batch_stats"], self.tx.init(variables["params"]))
        self.state = jax.device_put(state, self.replicated)
        self.images, self.labels = self._synthetic(jax, shape)
        self._step = jax.jit(self._train_step, donate_argnums=0)
        #: the learning rate as the step gets it: a Python float, or (option learning_rate_on_device)
        #: an array on the devices made once per rate
        self.rates_on_device: dict[float, object] | None = {} if config.options.get("learning_rate_on_device") else None

    @property
    def channels(self) -> int:
        return 3

    def _recipe(self) -> dict:
        return {
            "learning_rate": BASE_LEARNING_RATE * self.config.resolved_global_batch / 256,
            "momentum": MOMENTUM,
            "weight_decay": WEIGHT_DECAY,
            "nesterov": False,
        }

    def _synthetic(self, jax, shape):
        """Images and labels made once by each process for its own devices, reused every step."""
        import numpy

        rng = numpy.random.default_rng(self.config.seed + 1 + jax.process_index())
        batch = self.config.resolved_per_device_batch * self.config.resolved_device_count  # this process's share
        images = rng.standard_normal((batch, *shape), dtype=numpy.float32)
        labels = rng.integers(0, self.config.num_classes, batch, dtype=numpy.int32)
        return (
            jax.make_array_from_process_local_data(self.batch_sharded, images),
            jax.make_array_from_process_local_data(self.batch_sharded, labels),
        )

    def _train_step(self, state, images, labels, learning_rate):
        import jax
        import optax

        params, batch_stats, opt_state = state

        def loss_of(params):
            logits, updated = self.model.apply(
                {"params": params, "batch_stats": batch_stats}, images, train=True, mutable=["batch_stats"]
            )
            targets = optax.smooth_labels(jax.nn.one_hot(labels, self.config.num_classes), self.label_smoothing)
            loss = optax.softmax_cross_entropy(logits, targets).mean()  # fp32 logits and loss
            return loss, updated["batch_stats"]

        (loss, batch_stats), grads = jax.value_and_grad(loss_of, has_aux=True)(params)
        updates, opt_state = self.tx.update(grads, opt_state, params)
        updates = jax.tree_util.tree_map(lambda u: -learning_rate * u, updates)
        return (optax.apply_updates(params, updates), batch_stats, opt_state), loss

    def step(self) -> float:
        return self._run_step(self.images, self.labels, self.learning_rate)

    def _run_step(self, images, labels, learning_rate: float) -> float:
        self.state, loss = self._step(self.state, images, labels, self._rate(learning_rate))
        return float(loss.block_until_ready())  # the step has finished on every device

    def _rate(self, learning_rate: float):
        """The rate as the step is passed it: the float, or its array on the devices (made once)."""
        if self.rates_on_device is None:
            return learning_rate
        if learning_rate not in self.rates_on_device:
            import jax.numpy as jnp

            self.rates_on_device[learning_rate] = self.jax.device_put(jnp.float32(learning_rate), self.replicated)
        return self.rates_on_device[learning_rate]

    def weights_checksum(self) -> float:
        """Sum of every parameter (this process's replica), float64: equal on every worker."""
        import numpy

        params = self.jax.tree_util.tree_leaves(self.state[0])
        return float(sum(numpy.asarray(p.addressable_data(0), dtype=numpy.float64).sum() for p in params))

    def close(self) -> None:
        if _joined:
            self.jax.distributed.shutdown()

    def prepared(self) -> Prepared:
        jax = self.jax
        params = jax.tree_util.tree_leaves(self.state[0])
        convolutions = hlo.convolution_operands(self._compiled_step_hlo())
        return Prepared(
            warnings=emulation_warnings(
                self.config.resolved_precision, self.devices[0].platform, convolutions, "the step's convolutions"
            ),
            device_name=device_name(self.devices[0]),
            compile_s=self.compile_s,
            flops_per_image=self.flops_per_image,
            data_placement="device",
            framework_version=jax.__version__,
            settings={
                "flax": _version("flax"),
                "optax": _version("optax"),
                "jaxlib": _version("jaxlib"),
                "optimizer": "optax SGD (trace, -learning rate) + decayed weights (conv/dense kernels)",
                "learning_rate": self.learning_rate,
                "momentum": self.momentum,
                "nesterov": self.nesterov,
                "weight_decay": self.weight_decay,
                "label_smoothing": self.label_smoothing,
                "variable_dtype": str(params[0].dtype),
                "compute_dtype": self.compute_dtype,
                "xla_convolution_operands": convolutions,
                "parameters": int(sum(p.size for p in params)),
                "devices": [str(d) for d in self.devices],
                "platform": self.devices[0].platform,
                "processes": jax.process_count(),
                "data_parallel": f"jax.sharding over {len(self.devices)} device(s)",
                "jit": "jax.jit, state donated",
                "learning_rate_argument": self._rate_read_back(),
                "xla_flags": os.environ.get("XLA_FLAGS", ""),
                "flops_counted_by": "conv and dense layers of the Flax model (kernel x output shapes)",
            },
        )

    def _rate_read_back(self) -> str:
        rate = self._rate(self.learning_rate)
        if isinstance(rate, float):
            return "Python float (converted at every call)"
        return f"{rate.dtype} array on {len(rate.sharding.device_set)} device(s), made once per rate"

    def _compiled_step_hlo(self) -> str:
        """The step as XLA compiled it for this run's shapes and devices (optimised HLO text). Compiled
        here, before the warm-up: the step's first call finds the compilation in JAX's cache."""
        import jax.numpy as jnp

        jax, cfg = self.jax, self.config
        batch = cfg.resolved_per_device_batch * len(self.devices)  # the global array, as the step is called
        images = jax.ShapeDtypeStruct(
            (batch, cfg.image_size, cfg.image_size, self.channels), jnp.float32, sharding=self.batch_sharded
        )
        labels = jax.ShapeDtypeStruct((batch,), jnp.int32, sharding=self.batch_sharded)
        started = time.perf_counter()
        compiled = self._step.lower(self.state, images, labels, self._rate(self.learning_rate)).compile()
        self.compile_s = time.perf_counter() - started
        return compiled.as_text()


def emulation_warnings(precision: str, platform: str, operands: dict[str, int], what: str) -> list[str]:
    """A bf16 run's warning where its bf16 is emulated: XLA compiled ``what`` (``operands``, as
    ``hlo`` reads them from the compiled HLO) with no bf16 operand; else, on a CPU, one without
    bf16 units (its flags). What XLA compiled outranks the flags."""
    if precision != "bf16":
        return []
    if operands and not hlo.computes_in(operands, "bf16"):
        return [
            f"bf16 is emulated: XLA's {platform.upper()} backend compiled {what} with {' and '.join(operands)} "
            f"operands ({sum(operands.values())}, none in bf16; read from the compiled HLO), whatever this "
            f"{platform.upper()} has: the figure measures bf16 data with that arithmetic"
        ]
    if platform != "cpu":
        return []
    from accelbench.api import cpu_flags
    from accelbench.plugins.shared.cpu_features import bf16_emulation_warning

    warning = bf16_emulation_warning(cpu_flags())  # XLA's CPU backend runs no oneDNN: no ceiling
    return [warning] if warning else []


def _version(distribution: str) -> str:
    from importlib.metadata import version

    return version(distribution)


def device_name(device) -> str:
    if device.platform == "cpu":
        from accelbench.api import cpu_model

        return cpu_model()
    return device.device_kind
