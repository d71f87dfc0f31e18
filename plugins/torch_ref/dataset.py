"""torch_ref's train mode: the image folder PyTorch users train from (one folder per class, read
by ``torchvision.datasets.ImageFolder``) and a ``DataLoader`` with worker processes, training at
the learning rate core gives, evaluation over the held-out split. Imported only in the worker.

Why an image folder rather than another framework's format: it is what the torchvision reference
reads, it needs no reader outside torchvision, and its files are the source's bytes unchanged.
Files are named ``<label>/<index><suffix>``, so the reader gives back the split's stored order.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from accelbench.api import EVAL_CROP_FRACTION, DatasetManifest, Prepared, RunConfig, describe_preprocessing
from accelbench.plugins.shared import imagefolder, recipe

from .training import TorchRun

FORMAT = imagefolder.FORMAT
#: input-pipeline worker processes of each DataLoader
LOADER_WORKERS = 2


def write_imagefolder(examples: list[tuple[str, int]], stem: str) -> list[str]:
    return imagefolder.write(examples, stem)


def image_folder(root: str, transform=None, channels: int = 3):
    """torchvision's ImageFolder whose class index is the folder's label number (not its rank
    among the folders present, which would shift when a split lacks a class)."""
    from PIL import Image
    from torchvision import datasets

    class LabelledFolder(datasets.ImageFolder):
        def find_classes(self, directory):
            classes = sorted(entry.name for entry in Path(directory).iterdir() if entry.is_dir())
            return classes, {name: int(name) for name in classes}

    def load(path: str):
        with Image.open(path) as image:
            return image.convert("L" if channels == 1 else "RGB")

    folder = LabelledFolder(root, transform=transform, loader=load)
    folder.samples.sort(key=lambda sample: Path(sample[0]).name)  # the split's stored order
    folder.targets = [label for _, label in folder.samples]
    return folder


def read_imagefolder(files: list[str]) -> list[tuple[str, int]]:
    """(sha256 of the stored image bytes, label) of every sample, in the order torchvision's
    ImageFolder (the training reader) gives them."""
    return [(hashlib.sha256(Path(path).read_bytes()).hexdigest(), label) for path, label in image_folder(files[0]).samples]


class TorchDatasetRun(TorchRun):
    """TorchRun over a converted dataset: DataLoader batches, the learning rate set by core every
    step, and an evaluation pass over the held-out split."""

    def __init__(self, config: RunConfig, dataset: DatasetManifest):
        self.dataset, self.spec = dataset, config.train_spec
        super().__init__(config)
        torch = self.torch
        self.train_loader = self._loader("train", training=True)
        self.val_loader = self._loader("val", training=False)
        self.batches = self._endless()
        shape = (1, self.channels, 1, 1)
        self.mean = torch.tensor(dataset.image.mean, device=self.device).reshape(shape)
        self.std = torch.tensor(dataset.image.std, device=self.device).reshape(shape)

    @property
    def channels(self) -> int:
        return self.dataset.image.channels

    def _recipe(self) -> dict[str, Any]:
        return recipe.sgd_settings(self.spec)

    def _synthetic(self):
        return None, None  # batches come from the dataset

    def _transform(self, training: bool):
        from torchvision import transforms

        size = self.config.image_size
        stored = (self.dataset.image.height, self.dataset.image.width)
        if self.spec.augmentation == "imagenet":
            steps = (
                [transforms.RandomResizedCrop(size, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)), transforms.RandomHorizontalFlip()]
                if training
                else [transforms.Resize(int(size / EVAL_CROP_FRACTION)), transforms.CenterCrop(size)]
            )
        else:
            steps = [] if stored == (size, size) else [transforms.Resize((size, size))]
        return transforms.Compose([*steps, transforms.PILToTensor()])  # uint8, normalised on the device

    def _loader(self, split: str, training: bool):
        torch, cfg = self.torch, self.config
        [folder] = self.dataset.files(FORMAT, split)
        data = image_folder(folder, self._transform(training), self.channels)
        return torch.utils.data.DataLoader(
            data,
            batch_size=cfg.resolved_global_batch,
            shuffle=training,
            drop_last=training,
            num_workers=LOADER_WORKERS,
            persistent_workers=True,
            generator=torch.Generator().manual_seed(cfg.seed),
        )

    def _endless(self):
        while True:  # a new shuffled order every epoch
            yield from self.train_loader

    def _on_device(self, images, labels):
        images = images.to(self.device, non_blocking=True).float()
        images = ((images - self.mean) / self.std).contiguous(memory_format=self.torch.channels_last)
        return images, labels.to(self.device, non_blocking=True)

    def train_step(self, learning_rate: float) -> float:
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate
        return self._step(*self._on_device(*next(self.batches)))

    def evaluate(self) -> dict[str, float]:
        torch = self.torch
        top1 = top5 = seen = 0
        loss = 0.0
        k = min(5, self.config.num_classes)
        self.model.eval()
        with torch.no_grad():
            for images, labels in self.val_loader:
                images, labels = self._on_device(images, labels)
                with self._autocast():
                    logits = self.model(images)
                logits = logits.float()
                ranked = logits.topk(k, dim=1).indices
                top1 += int((ranked[:, 0] == labels).sum())
                top5 += int((ranked == labels[:, None]).any(dim=1).sum())
                loss += float(torch.nn.functional.cross_entropy(logits, labels, reduction="sum"))
                seen += len(labels)
        self.model.train()
        return {"top1": top1 / seen, "top5": top5 / seen, "loss": loss / seen}

    def preprocessing(self) -> dict[str, Any]:
        return describe_preprocessing(
            self.config,
            self.dataset,
            {
                "train": "random resized crop (area 8-100%, aspect 3/4-4/3) + horizontal flip",
                "eval": f"resize shorter side to size/{EVAL_CROP_FRACTION}, central crop",
            },
            f"torchvision ImageFolder + DataLoader ({LOADER_WORKERS} worker processes)",
        )

    def prepared(self) -> Prepared:
        prepared = super().prepared()
        prepared.data_placement = "host input pipeline (DataLoader)"
        prepared.settings.update(
            preprocessing=self.preprocessing(),
            learning_rate="set every step by core's schedule",
            label_smoothing=self.spec.label_smoothing,
        )
        return prepared
