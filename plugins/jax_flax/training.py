"""The JAX worker side: the Flax model, optax SGD, synthetic data on the devices and one jitted,
data-parallel training step. Imported only in the worker (its environment has JAX)."""

from __future__ import annotations

import os

from accelbench import Prepared, RunConfig
from accelbench.backend import training_flops

MOMENTUM = 0.9
WEIGHT_DECAY = 1e-4  # the official TPU ResNet-50 recipe's
BASE_LEARNING_RATE = 0.1  # per 256 images, scaled linearly with the global batch
COMPUTE_DTYPES = {"fp32": "float32", "bf16": "bfloat16"}


def import_jax(config: RunConfig):
    """JAX, with ``device_count`` host devices on a CPU (XLA reads the flag once, at start)."""
    if config.device == "cpu" and config.device_count > 1:
        flag = f"--xla_force_host_platform_device_count={config.device_count}"
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flag}".strip()
    import jax

    return jax


def devices(jax, config: RunConfig) -> list:
    return jax.devices(config.device)[:config.device_count]


def device_problem(config: RunConfig) -> str | None:
    jax = import_jax(config)
    try:
        found = jax.devices(config.device)
    except RuntimeError:
        found = []
    if len(found) < config.device_count:
        return f"{config.device_count} {config.device} device(s) requested, JAX sees {len(found)}"
    if config.global_batch % config.device_count:
        return f"global batch {config.global_batch} does not divide over {config.device_count} devices"
    return None


class JaxRun:
    """Model, optimizer state, synthetic data on the devices and the jitted step, built once."""

    def __init__(self, config: RunConfig):
        jax = import_jax(config)
        import jax.numpy as jnp
        import optax
        from jax.sharding import Mesh, NamedSharding, PartitionSpec

        from .model import ResNet, forward_macs

        self.config, self.jax = config, jax
        self.devices = devices(jax, config)
        mesh = Mesh(self.devices, ("data",))
        self.replicated = NamedSharding(mesh, PartitionSpec())
        self.batch_sharded = NamedSharding(mesh, PartitionSpec("data"))
        self.model = ResNet(config.num_classes, small=config.model == "resnet_small",
                            dtype=jnp.dtype(COMPUTE_DTYPES[config.precision]))
        key = jax.random.PRNGKey(config.seed)
        shape = (config.image_size, config.image_size, 3)
        variables = self.model.init(key, jnp.zeros((1, *shape)), train=False)
        macs, self.compute_dtype = forward_macs(self.model, variables, config.image_size)
        self.flops_per_image = training_flops(macs)
        self.learning_rate = BASE_LEARNING_RATE * config.global_batch / 256
        self.tx = optax.chain(
            # weight decay on conv and dense kernels only, never batch-norm parameters or biases
            optax.add_decayed_weights(WEIGHT_DECAY, mask=lambda params: jax.tree_util.tree_map(
                lambda p: p.ndim > 1, params)),
            optax.sgd(self.learning_rate, momentum=MOMENTUM))
        state = (variables["params"], variables["batch_stats"], self.tx.init(variables["params"]))
        self.state = jax.device_put(state, self.replicated)
        self.images, self.labels = self._synthetic(jax, shape)
        self._step = jax.jit(self._train_step, donate_argnums=0)

    def _synthetic(self, jax, shape):
        """Images and labels made once, split over the devices, reused every step."""
        images_key, labels_key = jax.random.split(jax.random.PRNGKey(self.config.seed + 1))
        batch = self.config.global_batch
        images = jax.random.normal(images_key, (batch, *shape))
        labels = jax.random.randint(labels_key, (batch,), 0, self.config.num_classes)
        return jax.device_put(images, self.batch_sharded), jax.device_put(labels, self.batch_sharded)

    def _train_step(self, state, images, labels):
        import jax
        import optax

        params, batch_stats, opt_state = state

        def loss_of(params):
            logits, updated = self.model.apply({"params": params, "batch_stats": batch_stats}, images,
                                               train=True, mutable=["batch_stats"])
            loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()  # fp32 logits
            return loss, updated["batch_stats"]

        (loss, batch_stats), grads = jax.value_and_grad(loss_of, has_aux=True)(params)
        updates, opt_state = self.tx.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), batch_stats, opt_state), loss

    def step(self) -> float:
        self.state, loss = self._step(self.state, self.images, self.labels)
        return float(loss.block_until_ready())  # the step has finished on every device

    def weights_checksum(self) -> float:
        import numpy

        params = self.jax.tree_util.tree_leaves(self.state[0])
        return float(sum(numpy.asarray(p, dtype=numpy.float64).sum() for p in params))

    def prepared(self) -> Prepared:
        jax = self.jax
        params = jax.tree_util.tree_leaves(self.state[0])
        return Prepared(
            device_name=_device_name(self.devices[0]),
            flops_per_image=self.flops_per_image, data_placement="device",
            framework_version=jax.__version__,
            settings={"flax": _version("flax"), "optax": _version("optax"), "jaxlib": _version("jaxlib"),
                      "optimizer": "optax SGD + decayed weights (conv/dense kernels)",
                      "learning_rate": self.learning_rate, "momentum": MOMENTUM, "weight_decay": WEIGHT_DECAY,
                      "variable_dtype": str(params[0].dtype), "compute_dtype": self.compute_dtype,
                      "parameters": int(sum(p.size for p in params)),
                      "devices": [str(d) for d in self.devices], "platform": self.devices[0].platform,
                      "data_parallel": f"jax.sharding over {len(self.devices)} device(s)",
                      "jit": "jax.jit, state donated", "xla_flags": os.environ.get("XLA_FLAGS", ""),
                      "flops_counted_by": "conv and dense layers of the Flax model (kernel x output shapes)"})


def _version(distribution: str) -> str:
    from importlib.metadata import version

    return version(distribution)


def _device_name(device) -> str:
    if device.platform == "cpu":
        from accelbench.environment import cpu_model

        return cpu_model()
    return device.device_kind
