"""The peak a record's achieved FLOP/s is measured against, per device and precision: an
accelerator's published dense peak (``data/accelerator_peaks.json``, every figure with its
source), else the peak ``accelbench peak`` measured on this machine with the run's framework (the
best of several timed runs of a large matrix product), cached per machine in the user's cache.

A record gets ``flops.peak_per_sec``, ``flops.peak_source`` and ``flops.utilisation`` (achieved /
peak) when one of them applies; otherwise none, never a guess.

Beside the peaks, the tuned stacks' published ResNet-50 training throughput per GPU
(``data/training_anchors.json``, each with its source): what the GPU check holds a plugin's
images/sec against.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from accelbench.environments.machine import cache_dir
from accelbench.records.jsonform import read_shipped

if TYPE_CHECKING:
    from accelbench.records.blocks import Environment


@dataclass(frozen=True)
class Peak:
    flops_per_s: float
    source: str


@dataclass(frozen=True)
class PublishedPeak:
    """One device's published dense peaks (``data/accelerator_peaks.json``), TFLOP/s by precision."""

    match: str
    kind: str
    tflops: dict[str, float]
    source: str
    #: what a precision's figure is of, where it is not that precision itself ("TF32 tensor core")
    basis: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class _PeaksFile:
    schema_version: str
    note: str
    entries: list[PublishedPeak]


@dataclass(frozen=True)
class _AnchorsFile:
    schema_version: str
    note: str
    entries: list[Anchor]


@cache
def _peaks() -> list[PublishedPeak]:
    """The published peaks, read once."""
    return read_shipped(_PeaksFile, "accelerator_peaks.json").entries


@cache
def _anchors() -> list[Anchor]:
    """The training anchors, read once."""
    return read_shipped(_AnchorsFile, "training_anchors.json").entries


def published(kind: str, device_name: str, precision: str, devices: int = 1) -> Peak | None:
    """The published dense peak of ``devices`` devices of this name at this precision, or None."""
    name = device_name.lower()
    for entry in _peaks():
        if entry.kind == kind and entry.match.lower() in name:
            tflops = entry.tflops.get(precision)
            if tflops is None:
                return None
            basis = entry.basis.get(precision, precision)
            per = f" x {devices} devices" if devices > 1 else ""
            return Peak(tflops * 1e12 * devices, f"published {basis} dense peak of {entry.match}{per}: {entry.source}")
    return None


@dataclass(frozen=True)
class Anchor:
    """A tuned stack's published ResNet-50 training throughput on one GPU of a kind
    (``data/training_anchors.json``), or why the GPU has none (``images_per_sec`` None)."""

    match: str
    images_per_sec: float | None
    stack: str = ""
    source: str = ""
    why_none: str = ""


def training_anchor(device_name: str) -> Anchor | None:
    """The per-GPU anchor whose name occurs in ``device_name`` (the first, as in the published
    peaks' table), or None where the table names no such GPU."""
    name = device_name.lower()
    for entry in _anchors():
        if entry.match.lower() in name:
            return entry
    return None


@dataclass(frozen=True)
class Measured:
    """One ``accelbench peak`` measurement: a framework's best matrix-product rate here."""

    machine: str
    device_kind: str
    device_name: str
    framework: str
    framework_version: str
    precision: str
    size: int
    repeats: int
    flops_per_s: float
    measured_utc: str

    def key(self) -> str:
        return measurement_key(self.machine, self.device_kind, self.framework, self.framework_version, self.precision)

    def source(self) -> str:
        return (
            f"measured on this machine by accelbench peak ({self.measured_utc}): {self.framework} "
            f"{self.framework_version} {self.size}x{self.size} {self.precision} matrix product on "
            f"{self.device_name}, best of {self.repeats} timed runs"
        )


def machine_id(environment: Environment, device_kind: str, device_name: str) -> str:
    """What a measured peak belongs to: the CPU (model, cores, vector/matrix flags) or the device."""
    if device_kind != "cpu":
        return device_name
    flags = hashlib.sha256(" ".join(sorted(environment.cpu_flags or ())).encode()).hexdigest()[:12]
    return f"{environment.cpu_model} / {environment.cpu_cores} cores / flags {flags}"


def measurement_key(machine: str, device_kind: str, framework: str, version: str, precision: str) -> str:
    return " | ".join((machine, device_kind, framework, version, precision))


def cache_path() -> Path:
    return cache_dir("peaks.json")


def load_measured() -> dict[str, Measured]:
    try:
        entries = json.loads(cache_path().read_text())["measurements"]
        return {m.key(): m for m in (Measured(**entry) for entry in entries)}
    except (OSError, ValueError, KeyError, TypeError):
        return {}  # no cache yet, or one of another version: peaks are measured again


def save_measured(new: list[Measured]) -> Path:
    """Merge into the cache, atomically. A peak is the best this machine attains, so of two
    measurements of one key the higher stays: a run taken while something else used the cores
    (seen: one framework's fp32 at 94 GFLOP/s in one, 183 on the idle machine later) cannot lower it.
    Under a lock on the cache folder: two ``accelbench peak`` at once each keep what they measured."""
    from dataclasses import asdict

    from accelbench.environments.locks import folder_lock

    path = cache_path()
    with folder_lock(path.parent):
        merged = load_measured()
        for m in new:
            if m.key() not in merged or m.flops_per_s >= merged[m.key()].flops_per_s:
                merged[m.key()] = m
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"measurements": [asdict(m) for m in merged.values()]}, indent=1, allow_nan=False))
        tmp.replace(path)
    return path


def measured(
    environment: Environment, device_kind: str, device_name: str, framework: str, version: str, precision: str, devices: int = 1
) -> Peak | None:
    """This machine's measured peak for the framework, version and precision, or None. A CPU's
    peak is the whole machine's (all its cores); an accelerator's is per device."""
    found = load_measured().get(
        measurement_key(machine_id(environment, device_kind, device_name), device_kind, framework, version, precision)
    )
    if found is None:
        return None
    scale = 1 if device_kind == "cpu" else devices
    per = f" x {devices} devices" if scale > 1 else ""
    return Peak(found.flops_per_s * scale, found.source() + per)
