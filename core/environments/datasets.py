"""Real datasets for train mode: one source, converted once into every framework's format.

A *source* is an image folder with ``train/`` and ``val/`` sub-folders, each holding one folder
per class (ImageNet's layout). The embedded default, ``digits``, is scikit-learn's bundled
handwritten digits (1,797 8x8 images, 10 classes, no download), written first as such a folder of
PNGs, so it goes through exactly the path a real ImageNet copy takes.

Each format is written by the framework that reads it (a backend's ``data_format``, with its
``write_dataset``), in that framework's worker process, from the source files' bytes unchanged. Every record
is then read back by the same framework and compared with its source file (sha256 and label).
The manifest ``dataset.json`` is written last, atomically: a folder without it is not a dataset.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, NoReturn

from accelbench.environments.locks import folder_lock
from accelbench.environments.machine import cache_dir
from accelbench.errors import UsageError
from accelbench.planning import inputs
from accelbench.records import validation
from accelbench.records.jsonform import FormError, from_json, to_json

MANIFEST = "dataset.json"
DATASET_SCHEMA_VERSION = "1.0.0"
SPLITS = ("train", "val")
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".JPEG", ".JPG", ".PNG"}
#: images decoded to measure the per-channel mean and standard deviation of the training split
STATS_SAMPLE = 2000
DIGITS_VAL_FRACTION = 0.2


@dataclass(frozen=True)
class Example:
    path: str
    label: int


@dataclass(frozen=True)
class SplitSize:
    count: int


@dataclass(frozen=True)
class ImageFacts:
    """The training split's images: their size (None where sizes vary), channels, and per-channel
    mean and standard deviation, measured on ``statistics_images`` of them."""

    height: int | None
    width: int | None
    channels: int
    mean: list[float]
    std: list[float]
    statistics_images: int


@dataclass(frozen=True)
class DatasetManifest:
    """A converted dataset: ``dataset.json`` (``schemas/dataset.schema.json``), typed. What a
    backend's ``prepare_training`` is given, with ``root``, the folder it was read from."""

    schema_version: str
    name: str
    #: the image folder the formats were written from
    source: str
    #: the training defaults this dataset gets: "small" or "imagenet"
    preset: str
    classes: list[str]
    num_classes: int
    splits: dict[str, SplitSize]
    image: ImageFacts
    #: format name (a backend's data_format) -> split -> files, relative to the manifest
    formats: dict[str, dict[str, list[str]]]
    verified: str
    #: the folder the manifest was read from, absolute (not in the file)
    root: str | None = field(default=None, metadata={"omit_if_none": True})

    def files(self, fmt: str, split: str) -> list[str]:
        """One split's files in one format, as absolute paths."""
        return [os.path.join(self.root or ".", name) for name in self.formats[fmt][split]]

    def count(self, split: str) -> int:
        return self.splits[split].count

    def __getitem__(self, key: str) -> NoReturn:
        # plugins written for API 2.2 read the manifest as a dict: one line naming the replacement
        raise TypeError(
            f"the dataset is a DatasetManifest since plugin API 2.3: read .{key} "
            f"(.files(format, split) for a split's files, .count(split) for its size), not [{key!r}]"
        )


def index_folder(root: Path) -> tuple[list[str], dict[str, list[Example]]]:
    """Class names (sorted train sub-folders) and each split's examples, sorted by class and name."""
    for split in SPLITS:
        if not (root / split).is_dir():
            raise UsageError(f"{root}: no {split}/ folder (expected {root}/train/<class>/... and {root}/val/<class>/...)")
    classes = sorted(p.name for p in (root / "train").iterdir() if p.is_dir())
    if len(classes) < 2:
        raise UsageError(f"{root}/train: need at least 2 class folders, found {len(classes)}")
    unknown = sorted({p.name for p in (root / "val").iterdir() if p.is_dir()} - set(classes))
    if unknown:
        raise UsageError(f"{root}/val: class folder {unknown[0]!r} is not in train/")
    splits = {
        split: [
            Example(str(f), label)
            for label, name in enumerate(classes)
            for f in sorted((root / split / name).glob("*"))
            if f.suffix in IMAGE_SUFFIXES
        ]
        for split in SPLITS
    }
    for split, examples in splits.items():
        if not examples:
            raise UsageError(f"{root}/{split}: no images (.png or .jpg)")
    return classes, splits


def write_digits_folder(root: Path, seed: int = 0) -> None:
    """scikit-learn's digits as an image folder: 8-bit grayscale PNGs, a seeded stratified split."""
    import numpy as np
    from PIL import Image
    from sklearn.model_selection import train_test_split

    pixels, labels = digits_pixels()
    train, val = train_test_split(np.arange(len(pixels)), test_size=DIGITS_VAL_FRACTION, random_state=seed, stratify=labels)
    for split, chosen in (("train", train), ("val", val)):
        for i in sorted(chosen):
            folder = root / split / str(labels[i])
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(pixels[i], mode="L").save(folder / f"{i:04d}.png")


def digits_pixels() -> tuple["Any", "Any"]:
    """The digits as the folder stores them (uint8 8x8) and their labels."""
    import numpy as np
    from sklearn.datasets import load_digits

    digits = load_digits()
    # the source values are 0..16; x16 (clipped to 255) keeps every level distinct in 8 bits
    return np.clip(digits.images * 16, 0, 255).astype(np.uint8), digits.target


def image_statistics(examples: list[Example], seed: int = 0) -> ImageFacts:
    """Shape (when every sampled image has the same one), channels, per-channel mean and std."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    picked = (
        examples
        if len(examples) <= STATS_SAMPLE
        else [examples[i] for i in sorted(rng.choice(len(examples), STATS_SAMPLE, replace=False))]
    )
    images = [Image.open(example.path) for example in picked]
    # grayscale only when every sampled image is (ImageNet mixes a few grayscale JPEGs into RGB)
    mode = "L" if all(image.mode == "L" for image in images) else "RGB"
    arrays = [np.asarray(image.convert(mode)) for image in images]
    for image in images:
        image.close()
    channels = 1 if mode == "L" else 3
    shapes = {a.shape[:2] for a in arrays}
    flat = np.concatenate([a.reshape(-1, channels).astype(np.float64) for a in arrays])
    size = shapes.pop() if len(shapes) == 1 else None
    return ImageFacts(
        height=size[0] if size else None,
        width=size[1] if size else None,
        channels=channels,
        mean=[float(v) for v in flat.mean(axis=0)],
        std=[float(v) for v in flat.std(axis=0)],
        statistics_images=len(picked),
    )


def check_decodable(examples: list[Example]) -> None:
    """Decode every image once (Pillow, in the host): a file that is not an image, or a truncated
    one, is refused with its name here, not met by a framework's input pipeline mid-training
    (where a corrupt image has made readers retry and grow without bound)."""
    from PIL import Image

    for example in examples:
        try:
            with Image.open(example.path) as image:
                image.load()
        except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
            raise UsageError(
                f"{example.path}: not a decodable image ({type(exc).__name__}: {exc}); remove or replace it"
            ) from None


def file_digest(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def convert(source: str, out: Path, writers: Mapping[str, "Writer"], preset: str | None = None, seed: int = 0) -> DatasetManifest:
    """Convert ``source`` ("digits" or an image folder) into every format in ``writers`` under ``out``.

    ``writers`` maps a format name to a callable (examples, stem) -> (files, [(sha256, label)...])
    that writes one split and reads it back. Nothing is left behind when any step fails.
    """
    check_out(out)
    if not writers:
        raise UsageError("no framework that writes a dataset format is installed")
    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
        manifest = _convert_into(source, out, writers, preset, seed)
        write_manifest(out, manifest)
        return manifest
    except BaseException:
        if created:
            shutil.rmtree(out, ignore_errors=True)
        else:
            for child in out.iterdir():
                shutil.rmtree(child) if child.is_dir() else child.unlink()
        raise


def check_out(out: Path) -> None:
    """OUT can become a dataset's folder: an empty folder, or none yet under a folder this user
    may write (checked before any framework's worker starts); UsageError naming it otherwise."""
    shown = repr(str(out))
    try:
        out.exists()
    except OSError as exc:  # a name too long for the file system, say
        raise UsageError(f"OUT {shown}: {exc.strerror or exc}") from None
    if out.exists() and not out.is_dir():
        raise UsageError(f"OUT {shown} exists and is not a folder; choose a new folder")
    if out.is_dir() and any(out.iterdir()):
        raise UsageError(f"OUT {shown} exists and is not empty; choose a new folder")
    parent = next((p for p in out.absolute().parents if p.exists()), None)
    if not out.exists() and (parent is None or not parent.is_dir() or not inputs.can_make_folder_in(parent)):
        raise UsageError(f"OUT {shown}: cannot make the folder there ({parent} is not a folder this user may write)")


def check_source(source: str) -> None:
    """SOURCE is 'digits' or an existing folder (checked before any framework's worker starts)."""
    if source != "digits" and (not source.strip() or not os.path.isdir(source)):  # False for a name too long, too
        raise UsageError(f"SOURCE {source!r} is neither 'digits' nor a folder")


Writer = Callable[[list[Example], str], tuple[list[str], list[tuple[str, int]]]]


def _convert_into(source: str, out: Path, writers: Mapping[str, Writer], preset: str | None, seed: int) -> DatasetManifest:
    if source == "digits":
        root, name, preset = out / "images", "digits", preset or "small"
        write_digits_folder(root, seed)
    else:
        root, name, preset = Path(source), Path(source).resolve().name, preset or "imagenet"
        if not root.is_dir():
            raise UsageError(f"dataset source {source!r} is neither 'digits' nor a folder")
    classes, splits = index_folder(root)
    for examples in splits.values():
        check_decodable(examples)
    # class-sorted files would give a reader with a bounded shuffle buffer (a streaming input pipeline) batches of few
    # classes: the training split is stored in one seeded random order, the same in every format
    random.Random(seed).shuffle(splits["train"])
    image = image_statistics(splits["train"], seed)
    formats: dict[str, dict[str, list[str]]] = {}
    for fmt, write in writers.items():
        (out / fmt).mkdir()
        formats[fmt] = {}
        for split, examples in splits.items():
            files, read_back = write(examples, str(out / fmt / split))
            _verify(fmt, split, examples, read_back)
            formats[fmt][split] = [os.path.relpath(f, out) for f in files]
    return DatasetManifest(
        schema_version=DATASET_SCHEMA_VERSION,
        name=name,
        source=str(root.resolve()),
        preset=preset,
        classes=classes,
        num_classes=len(classes),
        splits={split: SplitSize(len(examples)) for split, examples in splits.items()},
        image=image,
        formats=formats,
        verified="every record read back by its framework equals its source file (sha256, label)",
        root=str(out.resolve()),
    )


def _verify(fmt: str, split: str, examples: list[Example], read_back: list[tuple[str, int]]) -> None:
    expected = [(file_digest(e.path), e.label) for e in examples]
    if len(read_back) != len(expected):
        raise RuntimeError(f"{fmt} {split}: wrote {len(expected)} examples, read back {len(read_back)}")
    for i, (want, got) in enumerate(zip(expected, map(tuple, read_back))):
        if want != got:
            raise RuntimeError(f"{fmt} {split}: example {i} ({examples[i].path}) differs after the round trip")


def write_manifest(out: Path, manifest: DatasetManifest) -> None:
    form = to_json(manifest)
    form.pop("root", None)  # where it is read from says that
    validation.validate_or_raise("dataset", form, what="dataset manifest")
    fd, tmp = tempfile.mkstemp(prefix=".dataset.", suffix=".tmp", dir=out)
    with os.fdopen(fd, "w") as fh:
        json.dump(form, fh, indent=1)
    os.chmod(tmp, 0o644)
    os.replace(tmp, out / MANIFEST)


def load(folder: str | Path, validate: bool = True, what: str = "dataset") -> DatasetManifest:
    """A converted dataset's manifest, with ``root`` (absolute folder) added; UsageError naming
    ``what`` (the flag that gave it) if not one. A worker reads it without validating (the host
    did, before it started; a worker's environment has no schema validator)."""
    path = Path(folder) / MANIFEST
    if not str(folder).strip() or not path.is_file():
        shown = inputs.shown_path(folder)
        raise UsageError(f"{what} {shown}: not a converted dataset (no {MANIFEST}); run `accelbench data SOURCE {shown}`")
    manifest = inputs.read_json(path, "dataset manifest")
    if validate:
        validation.validate_or_raise("dataset", manifest, what=f"dataset manifest {path}")
    try:
        return from_json(DatasetManifest, {**manifest, "root": str(Path(folder).resolve())}, "dataset manifest")
    except FormError as exc:  # a worker's unvalidated read of a file changed since the host read it
        raise UsageError(f"{what} {inputs.shown_path(folder)}: {exc}") from None


def default_digits(cache: Path, writers: Mapping[str, Writer]) -> Path:
    """The digits dataset converted once into the user's cache, reused afterwards. Made under a
    lock on the cache folder: a second process that needs it meanwhile (two ``accelbench train``
    at once on a fresh machine) waits, then finds it made, instead of reading half-written images
    or deleting them from under the first."""
    folder = cache / "digits"
    with folder_lock(cache, on_wait=lambda: print(f"waiting for another process making {folder}", file=sys.stderr)):
        if (folder / MANIFEST).is_file():
            manifest = load(folder)
            if set(writers) <= set(manifest.formats):
                return folder
            shutil.rmtree(folder)
        convert("digits", folder, writers)
    return folder


def cache_folder() -> Path:
    return cache_dir("datasets")
