"""tpu_official: the official TPU ResNet-50 method in bfloat16, global batch 1024.

ResNet-50 v1.5, channels-last, bf16 compute with fp32 variables (Keras ``mixed_bfloat16``),
fp32 logits for the loss, no loss scaling, Nesterov momentum 0.9 and weight decay 1e-4, several
steps per host round-trip (``iterations_per_loop``). Runs under ``TPUStrategy`` when a TPU is
present; elsewhere the same bf16 program runs on the local device, and the record says which.
Model and step code are shared with tf_benchmarks (``accelbench.plugins.shared.tf_common``).
"""

from __future__ import annotations

from accelbench.api import BackendInfo, Option, RunConfig, hookimpl
from accelbench.plugins.shared.extras import extra
from accelbench.plugins.shared.tf_common import ONEDNN_OPTION, Recipe, TfBackend
from accelbench.plugins.shared.tf_training import TrainMode

PLUGIN_API = "2.3"  # the plugin API this built-in is written for, checked as a third-party one's

VERSION = "1.0.0"
WEIGHT_DECAY = 1e-4
#: steps per host round-trip: the recipe's 10 amortise an accelerator's round-trip; a CPU has no
#: device to round-trip to, and there 10 steps of emulated bf16 (Eigen, AVX2-only CPUs) take minutes
DEFAULT_STEPS_PER_LOOP = {"tpu": 10, "gpu": 10, "cpu": 1}


class OfficialTpuResNet50(TrainMode, TfBackend):
    info = BackendInfo(
        name="resnet50",
        framework="tensorflow",
        requires=("tensorflow", "tf_keras"),
        models=("resnet50", "resnet_small"),
        variants={"resnet50": ("v1.5",)},
        precisions=("bf16", "fp32"),
        devices=("cpu", "gpu", "tpu"),
        batch_semantics="global",
        default_batch={"cpu": 8, "gpu": 1024, "tpu": 1024},
        version=VERSION,
        description="official TPU ResNet-50 v1.5 method: bf16, steps per loop, TPUStrategy",
        options={
            "steps_per_loop": Option(
                "training steps per host round-trip (default 10 on a TPU or GPU, 1 on a CPU)", kind="int", minimum=1
            ),
            "tpu": Option("TPU name or address for TPUClusterResolver (default local)", kind="str"),
            "onednn": ONEDNN_OPTION,
        },
        data_format="tfrecord",
        environment=extra("tf"),
        # glibc's malloc in transparent huge pages: 1.037x at batch 32 and 1.033x at 8 (bf16, 10
        # steps a loop, 3 alternating rounds each, every round above 1; 2-core Xeon with AMX,
        # README "Headroom levers")
        huge_pages=True,
    )
    protocol = "official TPU ResNet-50 (iterations_per_loop)"

    def recipe(self, config: RunConfig) -> Recipe:
        return Recipe(weight_decay=WEIGHT_DECAY, steps_per_call=steps_per_loop(config))


def steps_per_loop(config: RunConfig):
    return config.options.get("steps_per_loop", DEFAULT_STEPS_PER_LOOP.get(config.device, 10))


@hookimpl
def register_backends(register):
    register(OfficialTpuResNet50())
