"""The worker side: numpy imported here only."""

from __future__ import annotations

import hashlib
import os

import numpy as np

import accelbench

from . import reducer

DTYPES = {"fp64": np.float64, "fp32": np.float32}


class MlpRun:
    def __init__(self, config, hidden: int):
        self.dtype = DTYPES[config.precision]
        features, classes, batch = 3 * config.image_size, config.num_classes, config.per_device_batch
        init = np.random.default_rng(config.seed)  # the same weights on every worker
        sizes = [features, hidden, classes] if hidden else [features, classes]
        self.weights = [(init.standard_normal((a, b)) / np.sqrt(a)).astype(self.dtype) for a, b in zip(sizes, sizes[1:])]
        self.rank = int(os.environ.get("TOY_RANK", "0"))
        data = np.random.default_rng(config.seed + 1 + self.rank)  # each worker its own shard
        self.x = data.standard_normal((batch, features)).astype(self.dtype)
        self.y = data.integers(0, classes, batch)
        self.lr = float(config.options.get("learning_rate", 0.05))
        self.link = reducer.connect_from_environment()
        self.macs = sum(a * b for a, b in zip(sizes, sizes[1:]))

    def prepared(self):
        return accelbench.Prepared(
            device_name="numpy on the host CPU",
            flops_per_image=float(6 * self.macs),
            data_placement="host",
            settings={
                "dtype": np.dtype(self.dtype).name,
                "layers": len(self.weights),
                "allreduce": "reducer" if self.link else "none",
            },
        )

    def step(self) -> float:
        activations = [self.x]
        for w in self.weights[:-1]:
            activations.append(np.maximum(activations[-1] @ w, 0))
        logits = activations[-1] @ self.weights[-1]
        logits -= logits.max(axis=1, keepdims=True)
        probs = np.exp(logits)
        probs /= probs.sum(axis=1, keepdims=True)
        rows = np.arange(len(self.y))
        loss = float(-np.log(probs[rows, self.y] + 1e-12).mean())
        grad = probs
        grad[rows, self.y] -= 1
        grad /= len(self.y)
        grads = []
        for index in range(len(self.weights) - 1, -1, -1):
            grads.insert(0, activations[index].T @ grad)
            if index:
                grad = (grad @ self.weights[index].T) * (activations[index] > 0)
        if self.link:
            grads = self.link.average(grads)
        for w, g in zip(self.weights, grads):
            w -= self.lr * g.astype(self.dtype)
        return loss

    def weights_checksum(self) -> str:
        digest = hashlib.sha256()
        for w in self.weights:
            digest.update(np.ascontiguousarray(w).tobytes())
        return digest.hexdigest()

    def close(self) -> None:
        if self.link:
            self.link.close()
