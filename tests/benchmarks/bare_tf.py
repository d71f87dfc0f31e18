"""A bare, hand-written TensorFlow training loop: the reference the harness is measured against.

Deliberately independent of accelbench's code: same model (tf-keras ResNet-50 without convolution
biases, its stem pooled with "SAME" padding; `--conv-biases` keeps the model zoo's biases),
optimizer, loss, batch and precision, timed the same way (warm-up excluded, sync every step,
images / wall time). Prints one JSON line.
"""

import argparse
import json
import os
import time

parser = argparse.ArgumentParser()
parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
parser.add_argument("--variant", default="v1", choices=["v1", "v1.5"])
parser.add_argument("--batch", type=int, default=8)
parser.add_argument("--image-size", type=int, default=224)
parser.add_argument("--steps-per-loop", type=int, default=1)
parser.add_argument("--weight-decay", type=float, default=4e-5)
parser.add_argument("--conv-biases", action="store_true", help="keep keras.applications' conv biases")
parser.add_argument("--warmup", type=int, default=10)
parser.add_argument("--timed", type=int, default=100)
args = parser.parse_args()

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

tf.config.threading.set_intra_op_parallelism_threads(os.cpu_count())
if args.precision == "bf16":
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
model = keras.applications.ResNet50(weights=None, classifier_activation=None, input_shape=(args.image_size, args.image_size, 3))
cfg = model.get_config()
for layer in cfg["layers"]:
    c = layer["config"]
    if layer["class_name"] == "Conv2D" and not args.conv_biases:
        c["use_bias"] = False  # tf_cnn_benchmarks' ResNet-50: no bias before a batch norm
    if args.variant == "v1.5":
        for stage in ("conv3", "conv4", "conv5"):
            if c["name"] == f"{stage}_block1_1_conv":
                c["strides"] = (1, 1)
            if c["name"] == f"{stage}_block1_2_conv":
                c["strides"] = (2, 2)
# the stem's max pooling as tf_cnn_benchmarks writes it ("SAME"), not Keras' ZeroPadding2D + "valid"
pad = next(layer for layer in cfg["layers"] if layer["config"]["name"] == "pool1_pad")
pool = next(layer for layer in cfg["layers"] if layer["config"]["name"] == "pool1_pool")
pool["inbound_nodes"], pool["config"]["padding"] = pad["inbound_nodes"], "same"
cfg["layers"].remove(pad)
model = keras.Model.from_config(cfg)
opt = keras.optimizers.legacy.SGD(0.1 * args.batch / 256, momentum=0.9, nesterov=True)
kernels = [v for v in model.trainable_variables if "kernel" in v.name]
x = tf.random.truncated_normal((args.batch, args.image_size, args.image_size, 3), 127, 60)
y = tf.random.uniform((args.batch,), 0, 1000, tf.int32)


def one_step():
    with tf.GradientTape() as tape:
        logits = tf.cast(model(x, training=True), tf.float32)
        ce = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))
        loss = ce + args.weight_decay * tf.add_n([tf.nn.l2_loss(v) for v in kernels])
    opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    return ce


@tf.function
def train():
    ce = one_step()
    for _ in tf.range(args.steps_per_loop - 1):
        ce = one_step()
    return ce


calls = lambda steps: -(-steps // args.steps_per_loop)  # noqa: E731
for _ in range(calls(args.warmup)):
    train().numpy()
start = time.perf_counter()
for _ in range(calls(args.timed)):
    train().numpy()
wall = time.perf_counter() - start
images = calls(args.timed) * args.steps_per_loop * args.batch
print(json.dumps({"images_per_sec": images / wall, "images": images, "wall_time_s": wall}))
