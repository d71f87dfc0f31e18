"""jax_flax's train mode: the image folder (``plugins/shared/imagefolder.py``), decoded with Pillow into
numpy batches on the host (the way JAX examples feed small datasets), training at the learning
rate core gives, evaluation over the held-out split. Imported only in the worker.

Why the image folder: it needs no reader outside Pillow and numpy (a TFRecord reader would bring
TensorFlow into JAX's environment), and its files are the source's bytes unchanged.
"""

from __future__ import annotations

from typing import Any

from accelbench.api import EVAL_CROP_FRACTION, DatasetManifest, Prepared, RunConfig, describe_preprocessing
from accelbench.plugins.shared import imagefolder, recipe

from .training import JaxRun

FORMAT = imagefolder.FORMAT


class JaxDatasetRun(JaxRun):
    """JaxRun over a converted dataset: shuffled numpy batches every epoch, core's learning rate
    every step, top-1/top-5 over the held-out split."""

    def __init__(self, config: RunConfig, dataset: DatasetManifest):
        import numpy

        self.dataset, self.spec = dataset, config.train_spec
        super().__init__(config)
        self.rng = numpy.random.default_rng(config.seed)
        self.train_samples = self._samples("train")
        self.val_samples = self._samples("val")
        self.mean = numpy.asarray(dataset.image.mean, numpy.float32)
        self.std = numpy.asarray(dataset.image.std, numpy.float32)
        self.batches = self._endless()
        self._evaluate = self.jax.jit(self._eval_step)

    @property
    def channels(self) -> int:
        return self.dataset.image.channels

    def _recipe(self) -> dict[str, Any]:
        return recipe.sgd_settings(self.spec)

    def _synthetic(self, jax, shape):
        return None, None  # batches come from the dataset

    def _samples(self, split: str) -> list[tuple[str, int]]:
        [folder] = self.dataset.files(FORMAT, split)
        return imagefolder.samples(folder)

    def _endless(self):
        batch = self.config.resolved_global_batch
        while True:  # a new shuffled order every epoch; the last partial batch is dropped
            order = self.rng.permutation(len(self.train_samples))
            for start in range(0, len(order) - batch + 1, batch):
                yield self._batch([self.train_samples[i] for i in order[start : start + batch]], training=True)

    def _batch(self, samples: list[tuple[str, int]], training: bool):
        import numpy

        images = numpy.stack([self._image(path, training) for path, _ in samples])
        images = (images.astype(numpy.float32) - self.mean) / self.std
        labels = numpy.asarray([label for _, label in samples], numpy.int32)
        return images, labels

    def _image(self, path: str, training: bool):
        import numpy
        from PIL import Image

        size = self.config.image_size
        with Image.open(path) as opened:
            image = opened.convert("L" if self.channels == 1 else "RGB")
            if self.spec.augmentation == "imagenet":
                image = self._random_resized_crop(image, size) if training else self._center_crop(image, size)
            elif image.size != (size, size):
                image = image.resize((size, size), Image.Resampling.BILINEAR)
            pixels = numpy.asarray(image)
        return pixels.reshape(size, size, self.channels)

    def _random_resized_crop(self, image, size: int):
        """Area 8-100% of the image, aspect 3/4-4/3 (log-uniform), then a horizontal flip half of
        the time: the augmentation of the other plugins (torchvision's RandomResizedCrop)."""
        import math

        from PIL import Image

        width, height = image.size
        for _ in range(10):
            area = width * height * self.rng.uniform(0.08, 1.0)
            aspect = math.exp(self.rng.uniform(math.log(3 / 4), math.log(4 / 3)))
            w, h = round(math.sqrt(area * aspect)), round(math.sqrt(area / aspect))
            if 0 < w <= width and 0 < h <= height:
                left, top = self.rng.integers(0, width - w + 1), self.rng.integers(0, height - h + 1)
                break
        else:  # the central square, as torchvision falls back
            w = h = min(width, height)
            left, top = (width - w) // 2, (height - h) // 2
        image = image.resize((size, size), Image.Resampling.BILINEAR, box=(left, top, left + w, top + h))
        return image.transpose(Image.Transpose.FLIP_LEFT_RIGHT) if self.rng.random() < 0.5 else image

    def _center_crop(self, image, size: int):
        from PIL import Image

        short = round(size / EVAL_CROP_FRACTION)
        width, height = image.size
        scale = short / min(width, height)
        image = image.resize((max(short, round(width * scale)), max(short, round(height * scale))), Image.Resampling.BILINEAR)
        width, height = image.size
        left, top = (width - size) // 2, (height - size) // 2
        return image.crop((left, top, left + size, top + size))

    def train_step(self, learning_rate: float) -> float:
        images, labels = next(self.batches)
        return self._run_step(
            self.jax.device_put(images, self.batch_sharded), self.jax.device_put(labels, self.batch_sharded), learning_rate
        )

    def _eval_step(self, state, images, labels, valid):
        import jax
        import jax.numpy as jnp
        import optax

        params, batch_stats, _ = state
        logits = self.model.apply({"params": params, "batch_stats": batch_stats}, images, train=False)
        k = min(5, self.config.num_classes)
        ranked = jax.lax.top_k(logits, k)[1]
        losses = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
        top1 = (ranked[:, 0] == labels) & valid
        top5 = jnp.any(ranked == labels[:, None], axis=1) & valid
        return top1.sum(), top5.sum(), jnp.where(valid, losses, 0.0).sum()

    def evaluate(self) -> dict[str, float]:
        """Every held-out image once; the last batch is padded to the batch size (one compiled
        shape) and the padding masked out."""
        import numpy

        batch, top1, top5, loss = self.config.resolved_global_batch, 0, 0, 0.0
        for start in range(0, len(self.val_samples), batch):
            chunk = self.val_samples[start : start + batch]
            images, labels = self._batch(chunk + [chunk[-1]] * (batch - len(chunk)), training=False)
            valid = numpy.arange(batch) < len(chunk)
            put = lambda a: self.jax.device_put(a, self.batch_sharded)  # noqa: E731
            counts = self._evaluate(self.state, put(images), put(labels), put(valid))
            top1, top5, loss = top1 + int(counts[0]), top5 + int(counts[1]), loss + float(counts[2])
        seen = len(self.val_samples)
        return {"top1": top1 / seen, "top5": top5 / seen, "loss": loss / seen}

    def prepared(self) -> Prepared:
        prepared = super().prepared()
        prepared.data_placement = "host input pipeline (Pillow + numpy, main process)"
        prepared.settings.update(
            preprocessing=describe_preprocessing(
                self.config,
                self.dataset,
                {
                    "train": "random resized crop (area 8-100%, aspect 3/4-4/3) + horizontal flip",
                    "eval": f"resize shorter side to size/{EVAL_CROP_FRACTION}, central crop",
                },
                "image folder decoded by Pillow into numpy batches",
            ),
            learning_rate="set every step by core's schedule",
        )
        return prepared
