"""A bare, hand-written Gluon training loop: the reference the harness is measured against.

Independent of accelbench's code: model-zoo resnet50_v1 with its convolution biases left untrained
at zero (`--conv-biases` trains them), hybridized with static memory, SGD momentum, same batch
and precision, OMP threads = all cores, sync every step. Prints one JSON line.
"""

import argparse
import os

parser = argparse.ArgumentParser()
parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
parser.add_argument("--batch", type=int, default=8)
parser.add_argument("--image-size", type=int, default=224)
parser.add_argument("--conv-biases", action="store_true", help="train the model zoo's conv biases")
parser.add_argument("--warmup", type=int, default=10)
parser.add_argument("--timed", type=int, default=100)
args = parser.parse_args()

os.environ["OMP_NUM_THREADS"] = str(os.cpu_count())
if "AMX" in os.environ.get("DNNL_MAX_CPU_ISA", ""):
    # oneDNN 2.4 (mxnet 1.9.1) uses AMX only when allowed, and never asks Linux for the tile
    # state: without this arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) it dies of SIGILL
    import ctypes

    ctypes.CDLL(None).syscall(ctypes.c_long(158), ctypes.c_long(0x1023), ctypes.c_long(18))
import numpy as np  # noqa: E402

for alias, kind in {"bool": bool, "int": int, "float": float, "object": object, "str": str, "complex": complex}.items():
    if not hasattr(np, alias):
        setattr(np, alias, kind)
import mxnet as mx  # noqa: E402
from bare_timing import time_steps  # noqa: E402
from mxnet import autograd, gluon  # noqa: E402

if args.precision == "bf16":
    from mxnet.contrib import amp

    amp.init(target_dtype="bfloat16")
net = gluon.model_zoo.vision.resnet50_v1()
for name, param in net.collect_params().items():
    if "conv" in name and name.endswith("_bias") and not args.conv_biases:
        param.grad_req = "null"  # NGC's ResNet-50 has no bias before a batch norm
net.initialize(mx.init.Xavier(rnd_type="gaussian", factor_type="in", magnitude=2))
net.hybridize(static_alloc=True, static_shape=True)
trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1 * args.batch / 256, "momentum": 0.9, "wd": 1e-4})
loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
x = mx.nd.random.uniform(-1, 1, (args.batch, 3, args.image_size, args.image_size))
y = mx.nd.random.randint(0, 1000, (args.batch,)).astype("float32")


def step():
    with autograd.record():
        loss = loss_fn(net(x), y)
    loss.backward()
    trainer.step(args.batch)
    mx.nd.waitall()
    return loss.mean().asscalar()


time_steps(step, args.batch, args.warmup, args.timed)
