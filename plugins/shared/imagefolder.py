"""The image-folder dataset format several plugins train from: one split as
``<stem>/<label>/<index><suffix>``, each file the source's bytes unchanged, read back in stored
order. Neutral ground (no framework imported): any plugin may use it; each reads the images with
its own pipeline (torchvision's ImageFolder, a numpy loader...)."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

FORMAT = "imagefolder"


def write(examples: list[tuple[str, int]], stem: str) -> list[str]:
    """One split as ``<stem>/<label>/<index><suffix>``, each file the source's bytes."""
    root = Path(stem)
    for index, (path, label) in enumerate(examples):
        target = root / f"{label:05d}" / f"{index:08d}{Path(path).suffix.lower()}"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    return [str(root)]


def samples(root: str) -> list[tuple[str, int]]:
    """(path, label) of every image, in the split's stored order; the label is the folder's
    number (not its rank among the folders present, which would shift when a class is missing)."""
    found = [
        (str(path), int(folder.name))
        for folder in Path(root).iterdir()
        if folder.is_dir()
        for path in folder.iterdir()
        if path.is_file()
    ]
    return sorted(found, key=lambda sample: Path(sample[0]).name)


def read(files: list[str]) -> list[tuple[str, int]]:
    """(sha256 of the stored image bytes, label) of every sample, in stored order."""
    return [(hashlib.sha256(Path(path).read_bytes()).hexdigest(), label) for path, label in samples(files[0])]
