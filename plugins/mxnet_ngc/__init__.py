"""mxnet_ngc: MXNet Gluon ResNet-50 in the NVIDIA NGC style (global batch 768 by default).

The 2018 study's fastest GPU number was MXNet from NGC at a global batch of 768. This backend
trains Gluon's model-zoo ResNet-50, hybridized with static memory, on synthetic data made once on
each device, with ``gluon.Trainer`` SGD over a ``device`` kvstore. MXNet is imported only in the
worker (``training.py``).
"""

from __future__ import annotations

import os

from accelbench.api import BackendInfo, Option, Prepared, RunBackend, RunConfig, hookimpl
from accelbench.plugins.shared.extras import extra
from accelbench.plugins.shared.model_specs import RESNET50_VARIANTS

from .engine import DmlcPsEngine

PLUGIN_API = "2.3"  # the plugin API this built-in is written for, checked as a third-party one's

VERSION = "1.0.0"


class NgcResNet50(RunBackend):
    info = BackendInfo(
        name="resnet50",
        framework="mxnet",
        requires=("mxnet",),
        models=("resnet50", "resnet_small"),
        variants={"resnet50": RESNET50_VARIANTS},
        precisions=("fp32", "fp16", "bf16"),
        devices=("cpu", "gpu"),
        batch_semantics="global",
        default_batch={"cpu": 8, "gpu": 768},
        version=VERSION,
        description="NGC-style Gluon ResNet-50 (model zoo, hybridized, static alloc)",
        options={"kvstore": Option("kvstore across contexts: device (default) or local", choices=("device", "local"))},
        data_format="recordio",
        # jemalloc measured 1.042x the C library's malloc (95% CI 1.023-1.062) on the Zen 4 CPU
        # (README, levers); tcmalloc 0.974x
        environment=extra("mxnet"),
        allocator="jemalloc",
    )
    engine = DmlcPsEngine()

    def check(self, config: RunConfig) -> str | None:
        from . import training

        return training.device_problem(config)

    def prepare(self, config: RunConfig) -> Prepared:
        from . import training

        self.run = training.GluonRun(config)
        return self.run.prepared()

    # accelbench peak: MXNet's (oneDNN) matrix product as the network's layers run it: the
    # FullyConnected operator (x . w^T, 2 x size^3 FLOPs), bf16 through AMP as in bf16 training
    def prepare_matmul(self, config: RunConfig, size: int) -> Prepared:
        from . import training

        mx = training.import_mxnet()
        if config.resolved_precision == "bf16":
            from mxnet.contrib import amp

            amp.init(target_dtype="bfloat16")  # FullyConnected then casts its inputs to bf16
        context = mx.gpu(0) if config.device == "gpu" else mx.cpu()
        mx.random.seed(config.seed)
        dtype = "float16" if config.resolved_precision == "fp16" else "float32"
        self.mx, self.size = mx, size
        self.operands = [mx.nd.random.normal(shape=(size, size), ctx=context).astype(dtype) for _ in range(2)]
        output = self._product()
        # named as its records name the device (nvidia-smi's name on a GPU, not MXNet's "gpu(0)"),
        # so that the peak cached under this name is found by the records of the same device
        return Prepared(
            device_name=training.device_name(config),
            framework_version=mx.__version__,
            settings={
                "operator": "FullyConnected",
                "output_dtype": _dtype_name(output.dtype),
                "omp_num_threads": os.environ.get("OMP_NUM_THREADS", ""),
                "onednn_max_cpu_isa": training.onednn.ceiling(),
            },
        )

    def matmul(self) -> None:
        self._product().wait_to_read()

    def _product(self):
        return self.mx.nd.FullyConnected(*self.operands, num_hidden=self.size, no_bias=True)

    # train mode (accelbench.execution.training): RecordIO data, core's recipe
    dataset_run = f"{__name__}.dataset:GluonDatasetRun"

    def write_dataset(self, examples: list[tuple[str, int]], stem: str) -> list[str]:
        from . import dataset

        return dataset.write_recordio(examples, stem)

    def read_dataset(self, files: list[str]) -> list[tuple[str, int]]:
        from . import dataset

        return dataset.read_recordio(files)

    def serve(self, config: RunConfig) -> None:
        from . import training

        training.serve()


def _dtype_name(dtype) -> str:
    import numpy

    dtype = numpy.dtype(dtype)
    return dtype.names[0] if dtype.names else dtype.name  # MXNet's bfloat16 is a named uint16 field


@hookimpl
def register_backends(register):
    register(NgcResNet50())
