"""A bare, hand-written JAX/Flax training loop: the reference `jax_flax` is measured against.

Flax ships no model zoo, so the network is the plugin's own Flax ResNet-50 v1.5 module; everything
around it is written here, independently of accelbench's harness and of the plugin's training
code: optax's stock `sgd` (momentum 0.9) after decoupled weight decay 1e-4 on conv and dense
kernels, softmax cross-entropy on fp32 logits, one `jax.jit` step on one device with the state
donated, the same batch and precision, timed the same way (warm-up excluded, the loss fetched
every step, images / wall time). Runs in the environment `jax_flax`'s workers run in (it has JAX;
the host may not). Prints one JSON line.
"""

import argparse

import jax
import jax.numpy as jnp
import numpy
import optax
from bare_timing import time_steps

from accelbench.plugins.jax_flax.model import ResNet

parser = argparse.ArgumentParser()
parser.add_argument("--precision", default="bf16", choices=["fp32", "bf16"])
parser.add_argument("--batch", type=int, default=8)
parser.add_argument("--image-size", type=int, default=224)
parser.add_argument("--warmup", type=int, default=10)
parser.add_argument("--timed", type=int, default=100)
parser.add_argument("--device", default="cpu", choices=["cpu", "gpu"])
args = parser.parse_args()
# the plugin's device kind, not whatever JAX would default to on a machine with a GPU
jax.config.update("jax_default_device", jax.devices(args.device)[0])

model = ResNet(1000, dtype=jnp.bfloat16 if args.precision == "bf16" else jnp.float32)
rng = numpy.random.default_rng(0)
images = jnp.asarray(rng.standard_normal((args.batch, args.image_size, args.image_size, 3), dtype=numpy.float32))
labels = jnp.asarray(rng.integers(0, 1000, args.batch, dtype=numpy.int32))
variables = model.init(jax.random.PRNGKey(0), images[:1], train=False)
tx = optax.chain(
    optax.add_decayed_weights(1e-4, mask=lambda p: jax.tree_util.tree_map(lambda w: w.ndim > 1, p)),
    optax.sgd(0.1 * args.batch / 256, momentum=0.9),
)
state = (variables["params"], variables["batch_stats"], tx.init(variables["params"]))


def loss_and_grads(params, batch_stats, images, labels):
    def loss_of(params):
        logits, updated = model.apply({"params": params, "batch_stats": batch_stats}, images, train=True, mutable=["batch_stats"])
        return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels).mean(), updated

    return jax.value_and_grad(loss_of, has_aux=True)(params)


def train_step(state, images, labels):
    params, batch_stats, opt_state = state
    (loss, updated), grads = loss_and_grads(params, batch_stats, images, labels)
    updates, opt_state = tx.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), updated["batch_stats"], opt_state), loss


train_step = jax.jit(train_step, donate_argnums=0)


def one_step():
    global state
    # the batch goes in as arguments, as a training loop feeds one: closed over, it would be a
    # constant of the compiled program, which XLA can fold (its bf16 cast, for one) at compile time
    state, loss = train_step(state, images, labels)
    return float(loss)  # blocks until the step has finished


time_steps(one_step, args.batch, args.warmup, args.timed)
