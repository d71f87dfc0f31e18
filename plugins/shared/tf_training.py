"""TensorFlow train mode, shared by tf_benchmarks and tpu_official: ImageNet-style TFRecord
files, tf.data input pipelines, training at the learning rate core gives, evaluation.

Imported only inside worker processes. The TFRecord layout is the one ImageNet conversions for
TensorFlow use (``image/encoded`` holding the source file's bytes unchanged, ``image/format``,
``image/class/label``, ``image/filename``); labels are 0-based class indices.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

from accelbench.api import EVAL_CROP_FRACTION, DatasetManifest, Prepared, RunConfig, describe_preprocessing
from accelbench.plugins.shared.tf_common import Recipe, TrainingRun, import_tensorflow

#: examples per TFRecord shard (~140 MB of ImageNet JPEGs, as Google's conversion makes)
SHARD_EXAMPLES = 1250
SHUFFLE_BUFFER = 10_000
#: shards read at once, interleaved
MAX_OPEN_SHARDS = 16


def write_tfrecords(examples: list[tuple[str, int]], stem: str) -> list[str]:
    """One split as sharded TFRecord files ``<stem>-00000-of-00002.tfrecord``, ...; their paths."""
    tf = import_tensorflow(None)
    shards = max(1, -(-len(examples) // SHARD_EXAMPLES))
    paths = [f"{stem}-{i:05d}-of-{shards:05d}.tfrecord" for i in range(shards)]
    for i, path in enumerate(paths):
        with tf.io.TFRecordWriter(path) as writer:
            for image_path, label in examples[i * SHARD_EXAMPLES : (i + 1) * SHARD_EXAMPLES]:
                writer.write(_example(tf, image_path, label).SerializeToString())
    return paths


def _example(tf, image_path: str, label: int):
    data = open(image_path, "rb").read()
    kind = b"PNG" if data[:4] == b"\x89PNG" else b"JPEG"

    def raw(value: bytes):
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))

    return tf.train.Example(
        features=tf.train.Features(
            feature={
                "image/encoded": raw(data),
                "image/format": raw(kind),
                "image/filename": raw(os.path.basename(image_path).encode()),
                "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
            }
        )
    )


FEATURES = ("image/encoded", "image/class/label")


def read_tfrecords(files: list[str]) -> list[tuple[str, int]]:
    """(sha256 of the stored image bytes, label) of every record, in file order."""
    tf = import_tensorflow(None)
    spec = {"image/encoded": tf.io.FixedLenFeature([], tf.string), "image/class/label": tf.io.FixedLenFeature([], tf.int64)}
    out = []
    for record in tf.data.TFRecordDataset(files):
        parsed = tf.io.parse_single_example(record, spec)
        out.append((hashlib.sha256(parsed["image/encoded"].numpy()).hexdigest(), int(parsed["image/class/label"].numpy())))
    return out


class DatasetRun(TrainingRun):
    """TrainingRun over a converted dataset: tf.data pipelines instead of synthetic tensors, the
    learning rate set by core every step, and an evaluation pass over the held-out split."""

    def __init__(self, config: RunConfig, dataset: DatasetManifest):
        self.dataset = dataset
        self.spec = config.train_spec
        self.channels = dataset.image.channels
        recipe = Recipe(
            weight_decay=self.spec.weight_decay,
            momentum=self.spec.momentum,
            nesterov=self.spec.nesterov,
            label_smoothing=self.spec.label_smoothing,
            base_learning_rate=self.spec.base_learning_rate,
        )
        super().__init__(config, recipe)
        self._evaluate_batch = self._compile_evaluation()

    # --- what differs from the synthetic run ---------------------------------------------------

    def _input_channels(self) -> int:
        return self.channels

    def _optimizer(self, keras):
        # a variable core's schedule writes before every step; the optimizer reads it each update
        self.learning_rate = self.tf.Variable(0.0, trainable=False, dtype="float32", name="learning_rate")
        return keras.optimizers.legacy.SGD(
            lambda: self.learning_rate, momentum=self.recipe.momentum, nesterov=self.recipe.nesterov
        )

    def _inputs(self):
        train = self._pipeline("train", training=True)
        return iter(self.strategy.experimental_distribute_dataset(train))

    def _compile(self):
        tf = self.tf

        @tf.function
        def train(iterator):
            images, labels = next(iterator)
            per_replica = self.strategy.run(self._replica_step, args=(images, labels))
            return self.strategy.reduce("SUM", per_replica, axis=None)

        return train

    def train_step(self, learning_rate: float) -> float:
        self.learning_rate.assign(learning_rate)
        return float(self._train(self.inputs).numpy())

    # --- input pipelines -----------------------------------------------------------------------

    def _files(self, split: str) -> list[str]:
        return self.dataset.files("tfrecord", split)

    def _pipeline(self, split: str, training: bool):
        tf, cfg = self.tf, self.config
        files = self._files(split)
        shards = tf.data.Dataset.from_tensor_slices(files)
        if training:  # shard order, then records within a buffer, reshuffled every epoch
            shards = shards.shuffle(len(files), seed=cfg.seed, reshuffle_each_iteration=True)
        data = shards.interleave(
            tf.data.TFRecordDataset,
            cycle_length=min(len(files), MAX_OPEN_SHARDS),
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True,
        )
        if training:
            count = self.dataset.count("train")
            data = data.shuffle(min(count, SHUFFLE_BUFFER), seed=cfg.seed, reshuffle_each_iteration=True).repeat()
        data = data.map(lambda record: self._parse(record, training), num_parallel_calls=tf.data.AUTOTUNE)
        return data.batch(cfg.resolved_global_batch, drop_remainder=training).prefetch(tf.data.AUTOTUNE)

    def _parse(self, record, training: bool):
        tf = self.tf
        parsed = tf.io.parse_single_example(
            record,
            {"image/encoded": tf.io.FixedLenFeature([], tf.string), "image/class/label": tf.io.FixedLenFeature([], tf.int64)},
        )
        image = tf.io.decode_image(parsed["image/encoded"], channels=self.channels, expand_animations=False)
        image = self._augment(image, training) if self.spec.augmentation == "imagenet" else self._fit(image)
        mean = tf.constant(self.dataset.image.mean, tf.float32)
        std = tf.constant(self.dataset.image.std, tf.float32)
        return (tf.cast(image, tf.float32) - mean) / std, tf.cast(parsed["image/class/label"], tf.int32)

    def _fit(self, image):
        """No augmentation: the image as stored, resized only when it is not the training size."""
        size, stored = self.config.image_size, (self.dataset.image.height, self.dataset.image.width)
        if stored == (size, size):
            return self.tf.ensure_shape(image, (size, size, self.channels))
        return self.tf.image.resize(image, (size, size))

    def _augment(self, image, training: bool):
        """ImageNet: a random crop (8%-100% of the area, aspect 3/4-4/3) and a flip for training,
        the central 87.5% for evaluation; then resized to the training size."""
        tf, size, seed = self.tf, self.config.image_size, self.config.seed
        if training:
            begin, crop, _ = tf.image.sample_distorted_bounding_box(
                tf.shape(image),
                tf.zeros((1, 0, 4)),
                min_object_covered=0.1,
                aspect_ratio_range=(3 / 4, 4 / 3),
                area_range=(0.08, 1.0),
                max_attempts=10,
                use_image_if_no_bounding_boxes=True,
                seed=seed,
            )
            image = tf.image.random_flip_left_right(tf.slice(image, begin, crop), seed=seed)
        else:
            image = tf.image.central_crop(image, EVAL_CROP_FRACTION)
        return tf.image.resize(image, (size, size))

    def preprocessing(self) -> dict[str, Any]:
        return describe_preprocessing(
            self.config,
            self.dataset,
            {
                "train": "random crop (area 8-100%, aspect 3/4-4/3) + horizontal flip, resize",
                "eval": f"central crop {EVAL_CROP_FRACTION:.1%}, resize",
            },
            "tf.data TFRecordDataset (ImageNet-style TFRecord)",
        )

    # --- evaluation ----------------------------------------------------------------------------

    def _compile_evaluation(self):
        tf, classes = self.tf, self.config.num_classes

        @tf.function(reduce_retracing=True)
        def evaluate_batch(images, labels):
            logits = tf.cast(self.model(images, training=False), tf.float32)
            loss = tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits))
            top1 = tf.reduce_sum(tf.cast(tf.math.in_top_k(labels, logits, 1), tf.int32))
            top5 = tf.reduce_sum(tf.cast(tf.math.in_top_k(labels, logits, min(5, classes)), tf.int32))
            return loss, top1, top5

        return evaluate_batch

    def evaluate(self) -> dict[str, float]:
        loss, top1, top5, seen = 0.0, 0, 0, 0
        for images, labels in self._pipeline("val", training=False):
            batch_loss, batch_top1, batch_top5 = self._evaluate_batch(images, labels)
            loss, top1, top5 = loss + float(batch_loss), top1 + int(batch_top1), top5 + int(batch_top5)
            seen += int(labels.shape[0])
        return {"top1": top1 / seen, "top5": top5 / seen, "loss": loss / seen, "images": seen}

    def prepared(self, settings: dict[str, Any]) -> Prepared:
        prepared = super().prepared(
            {**settings, "preprocessing": self.preprocessing(), "learning_rate": "set every step by core's schedule"}
        )
        prepared.data_placement = "host input pipeline (tf.data)"
        return prepared


class TrainMode:
    """Train mode (``accelbench.execution.training``) for a ``TfBackend``: TFRecord data, core's recipe. A
    backend class takes it first, ``class MyBackend(TrainMode, TfBackend)``, so that this module,
    which builds on ``tf_common``, is never imported by it."""

    run: Any

    def write_dataset(self, examples: list[tuple[str, int]], stem: str) -> list[str]:
        return write_tfrecords(examples, stem)

    def read_dataset(self, files: list[str]) -> list[tuple[str, int]]:
        return read_tfrecords(files)

    def prepare_training(self, config: RunConfig, dataset: DatasetManifest) -> Prepared:
        self.run = DatasetRun(config, dataset)
        return self.run.prepared({"protocol": "train mode (accelbench.execution.training recipe)"})
