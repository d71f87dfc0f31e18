"""tf_benchmarks: ResNet-50 training in TensorFlow 2 under the tf_cnn_benchmarks protocol.

tf_cnn_benchmarks measured 10 warm-up and 100 timed steps of synthetic-data training, with
``--batch_size`` per device, data created on the device, and a host sync every step. This is the
same measurement on TensorFlow 2.21 (Keras 2 via tf-keras; see ``tf_common``).
"""

from __future__ import annotations

from accelbench.api import BackendInfo, Option, RunConfig, hookimpl
from accelbench.plugins.shared.extras import extra
from accelbench.plugins.shared.model_specs import RESNET50_VARIANTS
from accelbench.plugins.shared.tf_common import ONEDNN_OPTION, Recipe, TfBackend
from accelbench.plugins.shared.tf_training import TrainMode

PLUGIN_API = "2.3"  # the plugin API this built-in is written for, checked as a third-party one's

VERSION = "1.0.0"
# tf_cnn_benchmarks' defaults: momentum 0.9 (Nesterov), weight decay 4e-5
WEIGHT_DECAY = 4e-5


class TfCnnResNet50(TrainMode, TfBackend):
    info = BackendInfo(
        name="resnet50",
        framework="tensorflow",
        requires=("tensorflow", "tf_keras"),
        models=("resnet50", "resnet_small"),
        variants={"resnet50": RESNET50_VARIANTS},
        precisions=("fp32", "fp16", "bf16"),
        devices=("cpu", "gpu"),
        batch_semantics="per_device",
        # the study's 4xV100 TensorFlow run used batch 1024 = 256 per GPU
        default_batch={"cpu": 8, "gpu": 256},
        version=VERSION,
        description="tf_cnn_benchmarks protocol on TF 2 (tf-keras ResNet-50, legacy SGD)",
        options={
            "jit_compile": Option("compile the step with XLA (default false: slower on CPU)", kind="bool"),
            "onednn": ONEDNN_OPTION,
        },
        data_format="tfrecord",
        environment=extra("tf"),
        # glibc's malloc in transparent huge pages: 1.018x at batch 32 (v1.5 fp32, 3 alternating
        # rounds 1.014-1.025, 2-core Xeon with AMX, README "Headroom levers")
        huge_pages=True,
    )
    protocol = "tf_cnn_benchmarks"

    def recipe(self, config: RunConfig) -> Recipe:
        return Recipe(weight_decay=WEIGHT_DECAY, jit_compile=bool(config.options.get("jit_compile", False)))


@hookimpl
def register_backends(register):
    register(TfCnnResNet50())
