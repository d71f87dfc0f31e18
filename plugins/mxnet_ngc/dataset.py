"""mxnet_ngc's train mode: RecordIO files (as im2rec makes them), ImageRecordIter pipelines,
training at the learning rate core gives, evaluation. Imported only inside the worker."""

from __future__ import annotations

import hashlib
from typing import Any

from accelbench.api import EVAL_CROP_FRACTION, DatasetManifest, Prepared, RunConfig, describe_preprocessing

from .training import GluonRun, import_mxnet


def write_recordio(examples: list[tuple[str, int]], stem: str) -> list[str]:
    """One split as ``<stem>.rec`` + ``<stem>.idx``, the source files' bytes unchanged."""
    mx = import_mxnet()
    writer = mx.recordio.MXIndexedRecordIO(f"{stem}.idx", f"{stem}.rec", "w")
    for index, (path, label) in enumerate(examples):
        with open(path, "rb") as fh:
            writer.write_idx(index, mx.recordio.pack(mx.recordio.IRHeader(0, float(label), index, 0), fh.read()))
    writer.close()
    return [f"{stem}.rec", f"{stem}.idx"]


def read_recordio(files: list[str]) -> list[tuple[str, int]]:
    """(sha256 of the stored image bytes, label) of every record, in file order."""
    mx = import_mxnet()
    reader = mx.recordio.MXRecordIO(next(f for f in files if f.endswith(".rec")), "r")
    out = []
    while (item := reader.read()) is not None:
        header, data = mx.recordio.unpack(item)
        out.append((hashlib.sha256(data).hexdigest(), int(header.label)))
    reader.close()
    return out


class GluonDatasetRun(GluonRun):
    """GluonRun over a converted dataset: ImageRecordIter batches split over the contexts, the
    learning rate set by core every step, and an evaluation pass over the held-out split."""

    def __init__(self, config: RunConfig, dataset: DatasetManifest):
        self.dataset, self.spec = dataset, config.train_spec
        super().__init__(config)
        nd, shape = self.mx.nd, (1, self._input_channels(), 1, 1)
        self.mean = [nd.array(dataset.image.mean, ctx=c).reshape(shape) for c in self.contexts]
        self.std = [nd.array(dataset.image.std, ctx=c).reshape(shape) for c in self.contexts]
        if self.spec.label_smoothing:
            self.loss_fn = self.mx.gluon.loss.SoftmaxCrossEntropyLoss(sparse_label=False)

    def _input_channels(self) -> int:
        return self.dataset.image.channels

    def _optimizer(self) -> tuple[str, dict[str, Any]]:
        # weight decay on convolution and dense weights only, as in the TF plugins
        self.net.collect_params(".*gamma|.*beta|.*bias").setattr("wd_mult", 0.0)
        return ("nag" if self.spec.nesterov else "sgd"), {
            "learning_rate": 0.0,
            "momentum": self.spec.momentum,
            "wd": self.spec.weight_decay,
        }

    def _inputs(self, dtype: str):
        return self._iterator("train", training=True)

    def _iterator(self, split: str, training: bool):
        cfg, channels = self.config, self._input_channels()
        rec, idx = self.dataset.files("recordio", split)
        return self.mx.io.ImageRecordIter(
            path_imgrec=rec,
            path_imgidx=idx,
            data_shape=(channels, cfg.image_size, cfg.image_size),
            batch_size=cfg.resolved_global_batch,
            shuffle=training,
            seed=cfg.seed,
            preprocess_threads=cfg.effective_threads,
            round_batch=True,
            **self._augmentation(training),
        )

    def _augmentation(self, training: bool) -> dict[str, Any]:
        size, stored = self.config.image_size, (self.dataset.image.height, self.dataset.image.width)
        if self.spec.augmentation == "imagenet":
            if training:
                return {
                    "random_resized_crop": True,
                    "min_random_area": 0.08,
                    "max_random_area": 1.0,
                    "min_aspect_ratio": 3 / 4,
                    "max_aspect_ratio": 4 / 3,
                    "rand_mirror": True,
                }
            return {"resize": int(size / EVAL_CROP_FRACTION)}  # then the central size x size crop
        return {} if stored == (size, size) else {"resize": size}

    def _next_batch(self):
        """The next batch, across iterator epochs. An epoch's last batch is filled up with the next
        epoch's first images (``round_batch``), so every batch holds global-batch real images."""
        try:
            return self.data.next()
        except StopIteration:
            self.data.reset()
            return self.data.next()

    def _on_contexts(self, batch):
        split = self.mx.gluon.utils.split_and_load
        images = split(batch.data[0], self.contexts)
        labels = split(batch.label[0], self.contexts)
        return [((x - m) / s, y) for x, y, m, s in zip(images, labels, self.mean, self.std)]

    def _step(self, pairs) -> float:
        smoothing, classes = self.spec.label_smoothing, self.config.num_classes
        if smoothing:
            nd = self.mx.nd
            pairs = [
                (x, nd.one_hot(y, classes, on_value=1 - smoothing + smoothing / classes, off_value=smoothing / classes))
                for x, y in pairs
            ]
        return super()._step(pairs)

    def train_step(self, learning_rate: float) -> float:
        self.trainer.set_learning_rate(learning_rate)
        return self._step(self._on_contexts(self._next_batch()))

    def evaluate(self) -> dict[str, float]:
        import numpy as np

        top1 = top5 = seen = 0
        loss = 0.0
        k = min(5, self.config.num_classes)
        # a fresh iterator each time: after a reset, ImageRecordIter starts past the samples its last
        # (wrapped-around) batch borrowed, and would skip them
        for batch in self._iterator("val", training=False):
            valid = batch.data[0].shape[0] - batch.pad  # the last batch is padded by wrapping around
            x = (batch.data[0].as_in_context(self.contexts[0]) - self.mean[0]) / self.std[0]
            logits = self.net(x).astype("float32").asnumpy()[:valid]
            labels = batch.label[0].asnumpy()[:valid].astype(np.int64)
            ranked = np.argsort(-logits, axis=1)
            top1 += int(np.sum(ranked[:, 0] == labels))
            top5 += int(np.sum(np.any(ranked[:, :k] == labels[:, None], axis=1)))
            shifted = logits - logits.max(axis=1, keepdims=True)
            log_softmax = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
            loss += float(-log_softmax[np.arange(valid), labels].sum())
            seen += valid
        return {"top1": top1 / seen, "top5": top5 / seen, "loss": loss / seen}

    def preprocessing(self) -> dict[str, Any]:
        return describe_preprocessing(
            self.config,
            self.dataset,
            {
                "train": "random resized crop (area 8-100%, aspect 3/4-4/3) + mirror",
                "eval": f"resize shorter side to size/{EVAL_CROP_FRACTION}, central crop",
            },
            "mx.io.ImageRecordIter (RecordIO)",
        )

    def prepared(self) -> Prepared:
        prepared = super().prepared()
        prepared.data_placement = "host input pipeline (ImageRecordIter)"
        prepared.settings.update(
            preprocessing=self.preprocessing(),
            learning_rate="set every step by core's schedule",
            label_smoothing=self.spec.label_smoothing,
        )
        return prepared
