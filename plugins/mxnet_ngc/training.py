"""The MXNet side of mxnet_ngc; imported only inside the worker process."""

from __future__ import annotations

import json
import os
from typing import Any

from accelbench.api import DeviceMemory, Prepared, RunConfig, cpu_flags, training_flops
from accelbench.plugins.shared.cpu_features import bf16_emulation_from_onednn, framework_identity, onednn_unread

from . import onednn
from .onednn import import_mxnet

WEIGHT_DECAY = 1e-4
BASE_LEARNING_RATE = 0.1  # per 256 images
CONV_BIASES = r".*conv\d+_bias"  # parameter names of the model zoo's convolution biases


def serve() -> None:
    """Run this process's ps-lite role (scheduler or server, from DMLC_ROLE) until the job ends.

    Importing mxnet in such a process starts the role and exits the interpreter when it is done.
    """
    try:
        import_mxnet()
    except SystemExit:
        return


#: oneDNN's "avx512_core": the least MXNet 1.9.1's oneDNN builds bf16 convolutions for
#: (natively with avx512_bf16 or AMX, emulated on plain AVX-512)
ONEDNN_BF16_FLOOR = frozenset({"avx512f", "avx512bw", "avx512vl", "avx512dq"})


def cpu_bf16_problem(flags: frozenset[str]) -> str | None:
    """Why this CPU cannot run MXNet's bf16 convolutions, or None (also when the flags are unknown:
    the worker then finds out by running)."""
    if not flags or ONEDNN_BF16_FLOOR <= flags:
        return None
    has = "AVX2 only" if "avx2" in flags else "no AVX-512"
    return f"MXNet 1.9.1's bf16 convolutions (oneDNN) need AVX-512 on the CPU; this CPU has {has}"


def device_problem(config: RunConfig) -> str | None:
    mx = import_mxnet()
    if config.device == "gpu":
        found = mx.context.num_gpus()
        if found < config.resolved_device_count:
            return f"{config.resolved_device_count} GPU(s) requested, MXNet sees {found}"
        if config.resolved_precision == "bf16":
            return "MXNet 1.9 runs bf16 mixed precision on the CPU (oneDNN) only"
    if config.device == "cpu" and config.resolved_precision == "fp16":
        return "fp16 needs a GPU; this run is on the CPU (use bf16 or fp32)"
    if config.device == "cpu" and config.resolved_precision == "bf16":
        problem = cpu_bf16_problem(cpu_flags())
        if problem:
            return problem
    return None


def build_network(vision, config: RunConfig):
    if config.model == "resnet_small":
        # Gluon's own class, with the layers every plugin's resnet_small has
        from accelbench.plugins.shared.model_specs import SMALL_CHANNELS, SMALL_LAYERS

        return vision.ResNetV1(
            vision.BasicBlockV1, list(SMALL_LAYERS), list(SMALL_CHANNELS), classes=config.num_classes, thumbnail=True
        )
    return resnet50(vision, config.variant, config.num_classes)


def resnet50(vision, variant: str | None, num_classes: int):
    """Gluon model-zoo ResNet-50 v1; for v1.5 each downsampling block's stride moves to its 3x3.

    The zoo's bottleneck gives its two 1x1 convolutions a bias, NGC's ResNet-50 (and the TF
    plugins' network) has none: each convolution feeds a batch norm that subtracts any bias
    again. The biases stay at their zero initial value, out of the gradient and the update, so
    every framework trains the same 25,557,032 parameters.
    """
    net = vision.resnet50_v1(classes=num_classes)
    if variant == "v1.5":
        for stage in net.features[5:8]:  # stages 2-4 downsample in their first block
            first_1x1, first_3x3 = stage[0].body[0], stage[0].body[3]
            first_1x1._kwargs["stride"], first_3x3._kwargs["stride"] = (1, 1), (2, 2)
    for bias in net.collect_params(CONV_BIASES).values():
        bias.grad_req = "null"
    return net


def forward_macs(mx, net, image_size: int, channels: int = 3) -> int:
    """Multiply-adds of one image's forward pass, counted on the network's symbol graph."""
    import numpy as np

    sym = net(mx.sym.var("data"))
    internals = sym.get_internals()
    arg_shapes, out_shapes, _ = internals.infer_shape(data=(1, channels, image_size, image_size))
    outputs = dict(zip(internals.list_outputs(), out_shapes))
    args = dict(zip(internals.list_arguments(), arg_shapes))
    nodes = json.loads(sym.tojson())["nodes"]
    total = 0
    for node in nodes:
        if node["op"] in ("Convolution", "FullyConnected"):
            weight = args[nodes[node["inputs"][1][0]]["name"]]
            out = outputs[node["name"] + "_output"]
            spatial = out[2] * out[3] if node["op"] == "Convolution" else 1
            total += spatial * int(np.prod(weight))
    return total


class GluonRun:
    """Model, trainer and synthetic data per context, built once in the worker."""

    def device_memory(self) -> DeviceMemory:
        if self.config.device == "cpu":
            return DeviceMemory.on_host()
        # mx.context.gpu_memory_info gives the free and total memory now, no peak
        return DeviceMemory(None, reason="MXNet 1.9 reports a GPU's free and total memory, not a peak")

    def __init__(self, config: RunConfig):
        self.config = config
        self.mx = mx = import_mxnet()
        # oneDNN's read-back runs in a process of its own while this one builds the network
        self.onednn_probe = (
            onednn.start_probe(config.resolved_precision, framework_identity(mx)) if config.device == "cpu" else None
        )
        from mxnet import gluon
        from mxnet.gluon.model_zoo import vision

        mx.random.seed(config.seed)
        if config.resolved_precision == "bf16":
            from mxnet.contrib import amp

            amp.init(target_dtype="bfloat16")  # must precede building the network
        maker = mx.gpu if config.device == "gpu" else mx.cpu
        self.contexts = [maker(i) for i in range(config.resolved_device_count)]
        net = build_network(vision, config)
        self.macs = forward_macs(mx, net, config.image_size, self._input_channels())
        net.initialize(mx.init.Xavier(rnd_type="gaussian", factor_type="in", magnitude=2), ctx=self.contexts)
        dtype = "float16" if config.resolved_precision == "fp16" else "float32"
        if dtype == "float16":
            net.cast("float16")
        net.hybridize(static_alloc=True, static_shape=True)
        self.net = net
        # several workers: MXNet's dist_sync kvstore over ps-lite (the launch layer set DMLC_*)
        self.kvstore = "dist_sync" if config.workers > 1 else config.options.get("kvstore", "device")
        self.optimizer_name, params = self._optimizer()
        self.trainer = gluon.Trainer(
            net.collect_params(), self.optimizer_name, {**params, "multi_precision": dtype == "float16"}, kvstore=self.kvstore
        )
        self.loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
        self.data = self._inputs(dtype)
        self.settings = {**params, "dtype": dtype}

    def _input_channels(self) -> int:
        return 3

    def _optimizer(self) -> tuple[str, dict[str, Any]]:
        lr = BASE_LEARNING_RATE * self.config.resolved_global_batch / 256
        return "sgd", {"learning_rate": lr, "momentum": 0.9, "wd": WEIGHT_DECAY}

    def _inputs(self, dtype: str):
        return [self._synthetic(ctx, dtype) for ctx in self.contexts]

    def _synthetic(self, ctx, dtype: str):
        """NGC's synthetic iterator: uniform [-1, 1] images, random labels; made once per device."""
        cfg, nd = self.config, self.mx.nd
        shape = (cfg.resolved_per_device_batch, 3, cfg.image_size, cfg.image_size)
        images = nd.random.uniform(-1, 1, shape=shape, ctx=ctx, dtype=dtype)
        labels = nd.random.randint(0, cfg.num_classes, shape=(cfg.resolved_per_device_batch,), ctx=ctx).astype("float32")
        return images, labels

    def step(self) -> float:
        return self._step(self.data)

    def _step(self, pairs) -> float:
        """Forward, backward and update over (images, labels) per context, synced on the host."""
        autograd = self.mx.autograd
        with autograd.record():
            losses = [self.loss_fn(self.net(x).astype("float32"), y) for x, y in pairs]
        autograd.backward(losses)
        self.trainer.step(self.config.resolved_global_batch)
        # MXNet returns before the work is done; wait for every pending op (the update included)
        self.mx.nd.waitall()
        return sum(loss.mean().asscalar() for loss in losses) / len(losses)

    def prepared(self) -> Prepared:
        mx = self.mx
        onednn_settings = self._onednn_settings()
        emulated = self._bf16_emulation(onednn_settings)
        return Prepared(
            warnings=[emulated] if emulated else [],
            device_name=device_name(self.config),
            flops_per_image=training_flops(self.macs),
            data_placement="device",
            framework_version=mx.__version__,
            settings={
                **self.settings,
                "contexts": [str(c) for c in self.contexts],
                "kvstore": self.kvstore,
                "hybridize": "static_alloc=True, static_shape=True",
                "amp": "bfloat16" if self.config.resolved_precision == "bf16" else None,
                "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
                "mkldnn": mx.runtime.Features().is_enabled("MKLDNN"),
                **onednn_settings,
                "layout": "NCHW",
                "conv_biases": self._trained_conv_biases(),
                # "nag": SGD with Nesterov momentum
                "optimizer": f"gluon.Trainer {self.optimizer_name}",
                # weights updated per optimizer call (MXNET_OPTIMIZER_AGGREGATION_SIZE; 1: one at a time)
                "optimizer_aggregate_num": getattr(self.trainer._optimizer, "aggregate_num", None),
            },
        )

    def _onednn_settings(self) -> dict[str, str | None]:
        # no probe on a GPU: oneDNN was not asked (the same keys, unread, as TF's)
        read_back = self.onednn_probe.read_back() if self.onednn_probe else onednn_unread()
        return {"onednn_max_cpu_isa": onednn.ceiling(), **read_back}

    def _bf16_emulation(self, onednn_settings: dict[str, str | None]) -> str | None:
        """Why this run's bf16 is emulated, told from the kernel oneDNN said it ran (else from the
        CPU and the ceiling oneDNN 2.4 reads)."""
        if self.config.device != "cpu" or self.config.resolved_precision != "bf16":
            return None
        return bf16_emulation_from_onednn("MXNet", onednn_settings, cpu_flags(), (onednn.ISA_VARIABLE,))

    def _trained_conv_biases(self) -> bool:
        return any(p.grad_req != "null" for p in self.net.collect_params(CONV_BIASES).values())

    def weights_checksum(self) -> float:
        """Sum of every trained weight (first context), float64: equal on every in-sync worker."""
        import numpy as np

        return float(
            sum(
                np.sum(p.data(self.contexts[0]).asnumpy(), dtype=np.float64)
                for p in self.net.collect_params().values()
                if p.grad_req != "null"
            )
        )

    def replica_weights_max_difference(self) -> float:
        """Largest absolute difference of any trained weight between the first and other contexts.

        Batch-norm running statistics are left out: each context keeps its own (as in NGC's runs).
        """
        worst = 0.0
        for param in self.net.collect_params().values():
            if param.grad_req == "null":
                continue
            copies = param.list_data()
            for other in copies[1:]:
                worst = max(worst, float((copies[0] - other).abs().max().asscalar()))
        return worst


def device_name(config: RunConfig) -> str:
    """The device as every MXNet record and measured peak names it."""
    if config.device == "gpu":
        from accelbench.api import gpus

        found = gpus()
        return found[0]["name"] if found else "GPU"
    from accelbench.api import cpu_model

    return cpu_model()
