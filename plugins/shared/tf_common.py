"""TensorFlow code shared by the tf_benchmarks and tpu_official plugins.

Imported only inside worker processes: importing this module imports nothing heavy, but every
function here imports TensorFlow.

Why Keras 2 (tf-keras) with its *legacy* SGD: measured on the 2-core Zen 4 reference machine, a
``tf.function`` step over Keras 3's ResNet50 is ~20% slower than the same step over tf-keras, and
the legacy optimizer applies momentum with one fused kernel per variable instead of several
element-wise ops (6.1 vs 5.3 img/s fp32 there). See README, "TensorFlow formulation".
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from accelbench.api import (
    ClusterRank,
    DeviceMemory,
    Engine,
    LaunchPlan,
    LocalCluster,
    Option,
    Prepared,
    RunBackend,
    RunConfig,
    UsageError,
    training_flops,
)
from accelbench.plugins.shared.cpu_features import (
    OnednnProbe,
    bf16_emulation_from_onednn,
    bf16_emulation_warning,
    framework_identity,
    onednn_unread,
)
from accelbench.plugins.shared.model_specs import SMALL_CHANNELS, SMALL_LAYERS

KERAS_PACKAGE = "tf_keras"


@dataclass(frozen=True)
class Recipe:
    """What differs between the TensorFlow workloads (tf_cnn_benchmarks vs official TPU)."""

    weight_decay: float
    base_learning_rate: float = 0.1  # per 256 images, scaled linearly with the global batch
    momentum: float = 0.9
    nesterov: bool = True
    label_smoothing: float = 0.0
    steps_per_call: int = 1
    jit_compile: bool = False


class TfConfigEngine(Engine):
    """TensorFlow's MultiWorkerMirroredStrategy (collective all-reduce), configured by ``TF_CONFIG``
    with every worker's address and this task's index. No service processes."""

    name = "tf_config"
    description = "TF_CONFIG for MultiWorkerMirroredStrategy's collective all-reduce"

    def local(self, cluster: LocalCluster) -> LaunchPlan:
        addresses = [f"{cluster.host}:{cluster.free_port()}" for _ in range(cluster.workers)]
        return LaunchPlan(self.name, cluster.workers, [tf_config_env(addresses, rank) for rank in range(cluster.workers)])

    def rank(self, cluster: ClusterRank) -> LaunchPlan:
        if len(cluster.peers) != cluster.workers:
            raise UsageError(f"--peers must list all {cluster.workers} workers' HOST:PORT in rank order for TensorFlow")
        return LaunchPlan(self.name, cluster.workers, [tf_config_env(list(cluster.peers), cluster.rank)])


def tf_config_env(addresses: list[str], rank: int) -> dict[str, str]:
    return {"TF_CONFIG": json.dumps({"cluster": {"worker": addresses}, "task": {"type": "worker", "index": rank}})}


class TfBackend(RunBackend):
    """What both TensorFlow plugins share; a subclass gives its recipe and protocol name."""

    protocol = ""
    engine = TfConfigEngine()

    def recipe(self, config: RunConfig) -> Recipe:
        raise NotImplementedError

    def check(self, config: RunConfig) -> str | None:
        return device_problem(import_tensorflow(config), config)

    def is_out_of_memory(self, error: BaseException) -> bool:
        return type(error).__name__ == "ResourceExhaustedError" or super().is_out_of_memory(error)

    def prepare(self, config: RunConfig) -> Prepared:
        self.run = TrainingRun(config, self.recipe(config))
        return self.run.prepared({"protocol": self.protocol})

    # accelbench peak: TensorFlow's matrix product at the run's precision, oneDNN as configured
    def prepare_matmul(self, config: RunConfig, size: int) -> Prepared:
        tf = import_tensorflow(config)
        if config.device == "tpu":
            raise NotImplementedError("a TPU's peak is its published figure (accelerator_peaks.json)")
        dtype = {"fp32": tf.float32, "bf16": tf.bfloat16, "fp16": tf.float16}[config.resolved_precision]
        name = "/GPU:0" if config.device == "gpu" else "/CPU:0"
        with tf.device(name):
            self.operands = [tf.cast(tf.random.normal((size, size), seed=seed), dtype) for seed in (1, 2)]
        # one element brought to the host: the product has finished (and none of it is skipped)
        self.product = tf.function(lambda a, b: tf.matmul(a, b)[0, 0])
        return Prepared(
            device_name=_device_name(tf, config, [name]),
            framework_version=tf.__version__,
            settings={"onednn": onednn_setting(), "intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads()},
            # a product oneDNN is not asked about: told from the CPU, the ceiling and the switch
            warnings=cpu_precision_warnings(config, onednn_unread()),
        )

    def matmul(self) -> None:
        self.product(*self.operands).numpy()


def import_tensorflow(config: RunConfig | None):
    """Import TensorFlow with thread pools and logical devices set before it initialises
    (without a config: TensorFlow's defaults, for work that is not a run, e.g. writing data)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if config is not None:
        ask_for_onednn(config)
    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")
    if config is None:
        return tf
    tf.config.threading.set_intra_op_parallelism_threads(config.effective_threads)
    tf.config.threading.set_inter_op_parallelism_threads(config.inter_op_threads or 0)
    if config.device == "cpu" and config.resolved_device_count > 1:
        # N logical CPU devices, so the multi-device (MirroredStrategy) path runs on a CPU machine
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * config.resolved_device_count)
    return tf


def device_problem(tf, config: RunConfig) -> str | None:
    """Why this config cannot run on this machine's devices, or None."""
    if config.resolved_precision == "fp16" and config.device == "cpu":
        return "fp16 mixed precision needs a GPU; this run is on the CPU (use bf16 or fp32)"
    if config.device == "gpu":
        found = len(tf.config.list_physical_devices("GPU"))
        if found < config.resolved_device_count:
            return f"{config.resolved_device_count} GPU(s) requested, TensorFlow sees {found}"
    if config.device == "tpu":
        try:
            connect_tpu(tf, config)
        except Exception as exc:  # noqa: BLE001 - any resolver failure means "no TPU here"
            return f"no TPU reachable: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return None


def connect_tpu(tf, config: RunConfig):
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=config.options.get("tpu", "local"))
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    return resolver


def make_strategy(tf, config: RunConfig):
    if config.device == "tpu":
        return tf.distribute.TPUStrategy(connect_tpu(tf, config))
    if config.workers > 1:  # the launch layer set TF_CONFIG: collective all-reduce across workers
        configure_coordination(tf, config)
        return tf.distribute.MultiWorkerMirroredStrategy()
    if config.resolved_device_count == 1:
        return tf.distribute.get_strategy()  # the default strategy: no replication overhead
    kind = "GPU" if config.device == "gpu" else "CPU"
    devices = [d.name for d in tf.config.list_logical_devices(kind)][: config.resolved_device_count]
    return tf.distribute.MirroredStrategy(devices=devices)


def configure_coordination(tf, config: RunConfig) -> None:
    """The coordination service MultiWorkerMirroredStrategy would configure, with a heartbeat
    timeout of the run's own timeout instead of TensorFlow's 10 s: workers saturating a loaded
    machine's cores miss 10 s of heartbeats ("heartbeat timeout" UNAVAILABLE), and a dead worker
    is caught by the host at once anyway (its pipe closes)."""
    from tensorflow.python.distribute import multi_worker_util
    from tensorflow.python.eager import context

    cluster = tf.distribute.cluster_resolver.TFConfigClusterResolver().cluster_spec()
    # the message class context.py configures the service with (its module moves between releases)
    jobs = [
        context.coordination_config_pb2.CoordinatedJob(name=job, num_tasks=cluster.num_tasks(job))
        for job in ("chief", "worker")
        if job in cluster.jobs
    ]
    context.context().configure_coordination_service(
        service_type="standalone",
        service_leader=multi_worker_util.coordination_leader(cluster),
        coordinated_jobs=jobs,
        heartbeat_timeout_in_ms=int(config.timeout_s * 1000),
    )


def coordination_settings(tf, config: RunConfig) -> dict[str, Any]:
    """The coordination service's heartbeat timeout, read back from TensorFlow (multi-worker runs)."""
    from tensorflow.python.eager import context

    service = context.context().coordination_service if config.workers > 1 else None
    if service is None:
        return {}
    return {"coordination_heartbeat_timeout_s": service.heartbeat_timeout_in_ms / 1000}


#: the variable TensorFlow decides its oneDNN ops from (when unset: from the CPU)
ONEDNN_VARIABLE = "TF_ENABLE_ONEDNN_OPTS"
ONEDNN_OPTION = Option(
    "TensorFlow's oneDNN ops on a CPU (default true: TF 2.21 leaves them off on a CPU without AVX-512 "
    "VNNI/bf16 or AMX, where they were measured faster; false: TensorFlow's own choice; a "
    "TF_ENABLE_ONEDNN_OPTS in the environment stands either way)",
    kind="bool",
)
#: set when this process asked TensorFlow for its oneDNN ops itself (the plugin's option, not the user)
_asked_by_plugin = False


def ask_for_onednn(config: RunConfig) -> None:
    """Before TensorFlow is imported: on a CPU, turn its oneDNN ops on unless the option says
    false or the user set TF_ENABLE_ONEDNN_OPTS (theirs stands). TF 2.21 turns them on by itself
    only on a CPU with AVX-512 VNNI/bf16 or AMX; on an AVX2-only AMD Zen 3, ResNet-50 fp32 trained
    faster with them (README, "Headroom levers"). The work is the same: oneDNN's convolutions in
    place of Eigen's."""
    global _asked_by_plugin
    if config.device != "cpu" or not config.options.get("onednn", True) or ONEDNN_VARIABLE in os.environ:
        return
    os.environ[ONEDNN_VARIABLE] = "1"
    _asked_by_plugin = True


def onednn_setting() -> str:
    """Whether TensorFlow runs its oneDNN ops, read back from TensorFlow (which decides from
    TF_ENABLE_ONEDNN_OPTS and, when unset, from the CPU: 2.21 turns it on by default only with
    AVX-512 VNNI/bf16 or AMX), and who asked for it."""
    asked = os.environ.get(ONEDNN_VARIABLE)
    if asked is None:
        source = "TensorFlow's default on this CPU"
    elif _asked_by_plugin:
        source = f"{ONEDNN_VARIABLE}={asked}, set by the plugin's option onednn"
    else:
        source = f"{ONEDNN_VARIABLE}={asked}"
    return f"{'on' if _onednn_enabled() else 'off'} ({source})"


def _onednn_enabled() -> bool:
    from tensorflow.python.util import _pywrap_util_port

    return _pywrap_util_port.IsMklEnabled()


def build_model(keras, config: RunConfig, channels: int = 3):
    shape = (config.image_size, config.image_size, channels)
    if config.model == "resnet_small":
        return resnet_small(keras, shape, config.num_classes)
    return resnet50(keras, config.variant, shape, config.num_classes)


# resnet_small: the layers of ``model_specs`` (the mxnet_ngc plugin builds them with Gluon's own
# class), so both frameworks train one architecture


def resnet_small(keras, input_shape: tuple[int, int, int], num_classes: int):
    """A 3x3 stem convolution (no pooling), basic residual blocks, global pooling, dense logits.
    Batch norm as Gluon's (momentum 0.9, epsilon 1e-5)."""
    layers = keras.layers

    def conv(x, channels, stride, kernel=3):
        return layers.Conv2D(channels, kernel, stride, padding="same", use_bias=False)(x)

    def norm(x):
        return layers.BatchNormalization(momentum=0.9, epsilon=1e-5)(x)

    inputs = keras.Input(input_shape)
    x = conv(inputs, SMALL_CHANNELS[0], 1)
    in_channels = SMALL_CHANNELS[0]
    for stage, (blocks, channels) in enumerate(zip(SMALL_LAYERS, SMALL_CHANNELS[1:])):
        for block in range(blocks):
            stride = 2 if stage > 0 and block == 0 else 1
            shortcut = x
            if stride != 1 or channels != in_channels:
                shortcut = norm(conv(x, channels, stride, kernel=1))
            y = layers.ReLU()(norm(conv(x, channels, stride)))
            x = layers.ReLU()(layers.Add()([norm(conv(y, channels, 1)), shortcut]))
            in_channels = channels
    x = layers.GlobalAveragePooling2D()(x)
    outputs = layers.Dense(num_classes, dtype="float32")(x)
    return keras.Model(inputs, outputs, name="resnet_small")


def resnet50(keras, variant: str | None, input_shape: tuple[int, int, int], num_classes: int):
    """ResNet-50 from the Keras model zoo, rebuilt from its config the way tf_cnn_benchmarks and the
    official TPU model define it: no convolution biases, since every convolution feeds a batch norm
    that subtracts any bias again (their gradients and updates cost 2% of a 2-core CPU step); the
    stem's max pooling with TensorFlow's "SAME" padding instead of an explicit zero-padding layer;
    for v1.5 each downsampling block's stride moves from its 1x1 to its 3x3 convolution."""
    model = keras.applications.ResNet50(weights=None, input_shape=input_shape, classes=num_classes, classifier_activation=None)
    config = model.get_config()
    for layer in config["layers"]:
        if layer["class_name"] == "Conv2D":
            layer["config"]["use_bias"] = False
    _same_padded_stem_pool(config)
    if variant == "v1.5":
        _strides_in_3x3({layer["config"]["name"]: layer["config"] for layer in config["layers"]})
    return keras.Model.from_config(config)


STEM_POOL_PAD, STEM_POOL = "pool1_pad", "pool1_pool"


def _same_padded_stem_pool(config: dict) -> None:
    """The stem's 3x3/2 max pooling as tf_cnn_benchmarks, the official TPU model and the Model Garden
    write it (``padding="SAME"``) instead of Keras' ZeroPadding2D + "valid": the same pooling
    work without a padded copy of the batch's largest activation and its gradient's slice (16 ms of
    a 2.9 s step at batch 32 on the 2-core Xeon). Its windows start one pixel later, as theirs do."""
    layers = config["layers"]
    [pad] = [layer for layer in layers if layer["config"]["name"] == STEM_POOL_PAD]
    [pool] = [layer for layer in layers if layer["config"]["name"] == STEM_POOL]
    pool["inbound_nodes"] = pad["inbound_nodes"]
    pool["config"]["padding"] = "same"
    layers.remove(pad)


def _strides_in_3x3(layers: dict[str, dict]) -> None:
    """ResNet v1.5: move each downsampling block's stride from its first 1x1 to its 3x3 convolution."""
    for name, layer in layers.items():
        if name.endswith("_block1_1_conv") and tuple(layer["strides"]) == (2, 2):
            layer["strides"] = (1, 1)
            layers[name.replace("_1_conv", "_2_conv")]["strides"] = (2, 2)


def forward_macs(model) -> int:
    """Multiply-adds of one image's forward pass, counted from the model's conv and dense layers."""
    total = 0
    for layer in model.layers:
        kind = type(layer).__name__
        if kind == "Conv2D":
            _, height, width, out_channels = layer.output.shape
            kh, kw = layer.kernel_size
            total += height * width * out_channels * kh * kw * layer.input.shape[-1] // layer.groups
        elif kind == "Dense":
            total += layer.input.shape[-1] * layer.units
    return total


class TrainingRun:
    """Model, optimizer, synthetic data and a compiled step, built once in the worker."""

    def device_memory(self) -> DeviceMemory:
        """TensorFlow's allocator's peak on the run's largest GPU (``get_memory_info``)."""
        if self.config.device == "cpu":
            return DeviceMemory.on_host()
        if self.config.device != "gpu":
            return DeviceMemory(None, reason=f"TensorFlow gives no memory peak for {self.config.device} devices here")
        memory_info = self.tf.config.experimental.get_memory_info
        peaks = [memory_info(f"GPU:{i}")["peak"] for i in range(self.config.resolved_device_count)]
        return DeviceMemory(int(max(peaks)), "tf.config.experimental.get_memory_info(GPU)['peak'], the largest GPU's")

    def __init__(self, config: RunConfig, recipe: Recipe):
        self.config, self.recipe = config, recipe
        self.tf = tf = import_tensorflow(config)
        # what TensorFlow's oneDNN runs, read back in a process of its own while this one builds
        self.onednn_probe = start_onednn_probe(config, framework_identity(tf))
        import tf_keras as keras

        self.policy = {"fp32": "float32", "bf16": "mixed_bfloat16", "fp16": "mixed_float16"}[config.resolved_precision]
        keras.mixed_precision.set_global_policy(self.policy)
        tf.random.set_seed(config.seed)
        self.strategy = make_strategy(tf, config)
        with self.strategy.scope():
            self.model = build_model(keras, config, self._input_channels())
            self.optimizer = self._optimizer(keras)
            # create the optimizer's slots now, under the strategy, not lazily in the first step
            self.optimizer._create_all_weights(self.model.trainable_variables)
        # weight decay on conv and dense kernels only, not batch-norm parameters or biases
        self.decayed = [v for v in self.model.trainable_variables if "kernel" in v.name]
        self.inputs = self._inputs()
        self._train = self._compile()

    def _input_channels(self) -> int:
        return 3

    def _optimizer(self, keras):
        lr = self.recipe.base_learning_rate * self.config.resolved_global_batch / 256
        sgd = keras.optimizers.legacy.SGD(lr, momentum=self.recipe.momentum, nesterov=self.recipe.nesterov)
        return keras.mixed_precision.LossScaleOptimizer(sgd) if self.policy == "mixed_float16" else sgd

    def _inputs(self):
        """tf_cnn_benchmarks-style synthetic data, made once on each device and reused every step."""
        tf, cfg = self.tf, self.config
        shape = (cfg.resolved_per_device_batch, cfg.image_size, cfg.image_size, 3)

        def images(_ctx):
            return tf.random.truncated_normal(shape, mean=127.0, stddev=60.0, seed=cfg.seed)

        def labels(_ctx):
            return tf.random.uniform((cfg.resolved_per_device_batch,), 0, cfg.num_classes, tf.int32, seed=cfg.seed)

        distribute = self.strategy.experimental_distribute_values_from_function
        return distribute(images), distribute(labels)

    def _replica_step(self, images, labels):
        """One replica's step; returns its share of the cross-entropy (the reported loss)."""
        tf, cfg = self.tf, self.config
        with tf.GradientTape() as tape:
            logits = tf.cast(self.model(images, training=True), tf.float32)  # fp32 loss, as both references
            data_loss = tf.reduce_sum(self._cross_entropy(labels, logits)) / cfg.resolved_global_batch
            loss = (
                data_loss
                + self.recipe.weight_decay
                * tf.add_n([tf.nn.l2_loss(v) for v in self.decayed])
                / self.strategy.num_replicas_in_sync
            )
            scaled = self.optimizer.get_scaled_loss(loss) if self.policy == "mixed_float16" else loss
        grads = tape.gradient(scaled, self.model.trainable_variables)
        if self.policy == "mixed_float16":
            grads = self.optimizer.get_unscaled_gradients(grads)
        applied = self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables))
        # the returned value waits for the update, so fetching it syncs the whole step
        with tf.control_dependencies([applied]):
            return tf.identity(data_loss)

    def _cross_entropy(self, labels, logits):
        tf, smoothing = self.tf, self.recipe.label_smoothing
        if not smoothing:
            return tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
        targets = tf.one_hot(labels, self.config.num_classes) * (1 - smoothing) + smoothing / self.config.num_classes
        return tf.nn.softmax_cross_entropy_with_logits(targets, logits)

    def _compile(self):
        tf, steps = self.tf, self.recipe.steps_per_call

        def one_step():
            per_replica = self.strategy.run(self._replica_step, args=self.inputs)
            return self.strategy.reduce("SUM", per_replica, axis=None)

        @tf.function(jit_compile=self.recipe.jit_compile)
        def train():
            loss = one_step()
            # several steps per host round-trip (iterations_per_loop); with one, no loop in the graph
            # at all: a zero-trip while loop holding a second copy of the step made it 0.5-1.6% slower
            if steps > 1:
                for _ in tf.range(steps - 1):
                    loss = one_step()
            return loss

        return train

    def step(self) -> float:
        return float(self._train().numpy())

    def weights_checksum(self) -> float:
        """Sum of every trainable weight, float64: equal on every worker of an in-sync run."""
        import numpy as np

        return float(sum(np.sum(v.numpy(), dtype=np.float64) for v in self.model.trainable_variables))

    def _devices(self) -> list[str]:
        if self.strategy is self.tf.distribute.get_strategy():  # the default strategy has no list
            return [f"/{self.config.device.upper()}:0"]
        if self.config.workers > 1:
            return [d.name for d in self.tf.config.list_logical_devices(self.config.device.upper())]
        return list(self.strategy.extended.worker_devices)

    def prepared(self, settings: dict[str, Any]) -> Prepared:
        tf = self.tf
        devices = self._devices()
        onednn = self.onednn_probe.read_back() if self.onednn_probe else onednn_unread()
        return Prepared(
            warnings=cpu_precision_warnings(self.config, onednn),
            device_name=_device_name(tf, self.config, devices),
            flops_per_image=training_flops(forward_macs(self.model)),
            steps_per_call=self.recipe.steps_per_call,
            data_placement="device",
            framework_version=tf.__version__,
            settings={
                "keras": f"tf-keras {_version(KERAS_PACKAGE)} (Keras 2)",
                "optimizer": "legacy SGD" + (" + loss scaling" if self.policy == "mixed_float16" else ""),
                "learning_rate": float(self.optimizer.learning_rate.numpy())
                if hasattr(self.optimizer.learning_rate, "numpy")
                else self.optimizer.learning_rate,
                "momentum": self.recipe.momentum,
                "nesterov": self.recipe.nesterov,
                "weight_decay": self.recipe.weight_decay,
                "label_smoothing": self.recipe.label_smoothing,
                "mixed_precision_policy": self.policy,
                "variable_dtype": self.model.trainable_variables[0].dtype.name,
                "compute_dtype": next(layer.compute_dtype for layer in self.model.layers if type(layer).__name__ == "Conv2D"),
                "jit_compile": self.recipe.jit_compile,
                "steps_per_call": self.recipe.steps_per_call,
                "strategy": type(self.strategy).__name__,
                "replicas": self.strategy.num_replicas_in_sync,
                "devices": list(devices),
                "intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
                "inter_op_threads": tf.config.threading.get_inter_op_parallelism_threads(),
                "onednn": onednn_setting(),
                **onednn,
                **coordination_settings(tf, self.config),
                "data_format": "channels_last",
                "conv_biases": any(layer.use_bias for layer in self.model.layers if type(layer).__name__ == "Conv2D"),
                **settings,
            },
        )


def cpu_precision_warnings(config: RunConfig, onednn: dict[str, str | None]) -> list[str]:
    """Why this run's bf16 is emulated, if it is: TensorFlow's oneDNN ops off (its Eigen kernels
    compute bf16 in fp32), else told from the kernel oneDNN said it ran (``onednn``: the probe's
    read-back), and from the CPU and the ceiling in the environment where it ran none."""
    if config.device != "cpu" or config.resolved_precision != "bf16":
        return []
    from accelbench.api import cpu_flags

    if _onednn_enabled():
        warning = bf16_emulation_from_onednn("TensorFlow", onednn, cpu_flags())
    else:
        warning = bf16_emulation_warning(cpu_flags()) or (
            f"bf16 is emulated: TensorFlow's oneDNN ops are {onednn_setting()}, and its Eigen kernels "
            "compute bf16 in fp32; the figure measures the emulation"
        )
    return [warning] if warning else []


def start_onednn_probe(config: RunConfig, framework: str) -> OnednnProbe | None:
    """On the CPU with TensorFlow's oneDNN ops on: a probe process (``python -m`` this module) that
    runs one small convolution at the run's precision with oneDNN's verbose switch on. TensorFlow's
    oneDNN exports none of its functions and reads that switch once, then logs every primitive it
    makes, some sixty a ResNet-50 step: the worker cannot ask its own copy."""
    if config.device != "cpu" or not _onednn_enabled():
        return None
    return OnednnProbe(__name__, (config.resolved_precision, str(config.effective_threads)), "ONEDNN_VERBOSE", framework)


def _run_one_convolution(precision: str, threads: int) -> None:
    """The probe: a channels-last 3x3 convolution in the dtype Keras' policy computes it in."""
    tf = import_tensorflow(None)
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    dtype = {"fp32": tf.float32, "bf16": tf.bfloat16, "fp16": tf.float16}[precision]
    images, weights = tf.ones((2, 14, 14, 32), dtype), tf.ones((3, 3, 32, 32), dtype)
    tf.nn.conv2d(images, weights, 1, "SAME").numpy()


def _device_name(tf, config: RunConfig, devices) -> str:
    if config.device == "gpu":
        details = tf.config.experimental.get_device_details(tf.config.list_physical_devices("GPU")[0])
        return details.get("device_name", "GPU")
    if config.device == "tpu":
        return tf.config.list_logical_devices("TPU")[0].device_type if devices else "TPU"
    from accelbench.api import cpu_model

    return cpu_model()


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package.replace("_", "-"))


if __name__ == "__main__":
    import sys

    _run_one_convolution(sys.argv[1], int(sys.argv[2]))
