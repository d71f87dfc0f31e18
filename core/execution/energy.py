"""Energy of a timed phase, read from the machine's own counters: NVML's total-energy counter of
each GPU (``nvidia-ml-py``) and Linux powercap's RAPL zones (CPU packages and their DRAM).

A counter is read right before a timed phase's first step and right after its last, outside the
timed region, in the worker process. What it counts is the whole device or socket -- every process
on it, not just the worker -- which is what a machine's owner pays for; the record's ``source``
says which counters were summed. Where no counter can be read the figure is ``None`` with the
reason (a VM exposes no RAPL; since Linux 5.10 ``energy_uj`` is readable by root only), never an
estimate from a power rating.

``ACCELBENCH_POWERCAP_ROOT`` points the RAPL reader at another folder than ``/sys/class/powercap``
(the tests write a fake zone tree there).
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

POWERCAP_ROOT_VARIABLE = "ACCELBENCH_POWERCAP_ROOT"
DEFAULT_POWERCAP_ROOT = "/sys/class/powercap"
#: RAPL zones (``intel-rapl:0``, ``intel-rapl:0:1``; AMD's kernels name theirs the same way)
_ZONE = re.compile(r"^[a-z-]*rapl:\d+(:\d+)*$")


@dataclass(frozen=True)
class EnergyUse:
    """Joules the counters advanced over one timed phase, or None with the reason."""

    joules: float | None
    source: str = ""
    reason: str = ""

    @staticmethod
    def summed(uses: list[EnergyUse | None]) -> EnergyUse | None:
        """Several phases' joules (a lockstep side's blocks, train mode's epochs); the first
        missing one (None, or its reason) where a phase has none."""
        counted = [u for u in uses if u is not None and u.joules is not None]
        if len(counted) != len(uses) or not uses:
            return next((u for u in uses if u is None or u.joules is None), None)
        return EnergyUse(sum(u.joules for u in counted if u.joules is not None), counted[0].source)


@dataclass
class _Counter:
    name: str
    read: Callable[[], float]  # joules since some fixed origin
    #: the value at which the counter wraps to zero (RAPL), None where it does not
    wraps_at_j: float | None = None


@dataclass
class Meter:
    """The counters found on this machine, found once (``Meter.find``); ``read`` before and after
    a phase, ``between`` gives its joules."""

    counters: list[_Counter] = field(default_factory=list)
    #: why some or all counters are missing (kept even when others were found)
    reasons: list[str] = field(default_factory=list)

    @classmethod
    def find(cls, gpus: bool = True) -> Meter:
        meter = cls()
        for finder in (_rapl_counters, _nvml_counters) if gpus else (_rapl_counters,):
            counters, reason = finder()
            meter.counters += counters
            if reason:
                meter.reasons.append(reason)
        return meter

    def read(self) -> list[float] | None:
        """Every counter's joules now; None when one of them could not be read."""
        try:
            return [counter.read() for counter in self.counters] if self.counters else None
        except (OSError, ValueError, RuntimeError):
            return None

    def between(self, before: list[float] | None, after: list[float] | None) -> EnergyUse:
        if not self.counters:
            return EnergyUse(None, reason="; ".join(self.reasons) or "no energy counter on this machine")
        if before is None or after is None:
            return EnergyUse(None, reason="an energy counter could not be read at the phase's start or end")
        joules = sum(_advance(counter, a, b) for counter, a, b in zip(self.counters, before, after))
        return EnergyUse(joules, source=self.describe())

    def describe(self) -> str:
        names = ", ".join(counter.name for counter in self.counters)
        missing = f" (not counted: {'; '.join(self.reasons)})" if self.reasons else ""
        return f"{names}: whole devices, every process on them{missing}"


def _advance(counter: _Counter, before: float, after: float) -> float:
    """The counter's advance; a RAPL counter that passed its range restarted from zero once (its
    range lasts minutes even at full power, longer than one phase between two reads)."""
    if after >= before or counter.wraps_at_j is None:
        return after - before
    return after + counter.wraps_at_j - before


def powercap_root() -> Path:
    return Path(os.environ.get(POWERCAP_ROOT_VARIABLE) or DEFAULT_POWERCAP_ROOT)


def _rapl_counters() -> tuple[list[_Counter], str]:
    """The packages' and DRAM's RAPL zones (a package's ``core``/``uncore`` subzones are part of
    it, and ``psys`` holds everything: counting those would count energy twice)."""
    root = powercap_root()
    if not root.is_dir():
        return [], f"no RAPL/powercap interface ({root} is absent)"
    counters, unreadable = [], []
    for zone in sorted(p for p in root.iterdir() if _ZONE.match(p.name)):
        try:
            name = (zone / "name").read_text().strip()
        except OSError:
            continue
        if not (name.startswith("package") or name == "dram"):
            continue
        energy = zone / "energy_uj"
        try:
            _read_uj(energy)
        except (OSError, ValueError):
            unreadable.append(zone.name)
            continue
        counters.append(_Counter(f"RAPL {zone.name} {name}", functools.partial(_read_uj, energy), _range_j(zone)))
    if unreadable:
        return counters, (
            f"RAPL zones {', '.join(unreadable)} not readable (energy_uj is readable by root only since Linux 5.10)"
        )
    if not counters:
        return [], f"no RAPL package zone under {root}"
    return counters, ""


def _read_uj(path: Path) -> float:
    return int(path.read_text().strip()) / 1e6


def _range_j(zone: Path) -> float | None:
    try:
        return _read_uj(zone / "max_energy_range_uj")
    except (OSError, ValueError):
        return None


def _nvml_counters() -> tuple[list[_Counter], str]:
    """Each GPU's total energy since its driver loaded (Volta and newer), through NVML."""
    try:
        import pynvml
    except ImportError:
        return [], ""  # no NVIDIA tooling installed: no GPU to count, nothing to say
    try:
        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
    except pynvml.NVMLError:
        return [], ""  # no NVIDIA driver: no NVIDIA GPU here
    counters, reasons = [], []
    for index in _visible(count):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        read = _nvml_joules(pynvml, handle)
        try:
            read()
        except pynvml.NVMLError as exc:
            reasons.append(f"GPU {index}: NVML gives no energy counter ({exc})")
            continue
        counters.append(_Counter(f"NVML GPU {index}", read))
    return counters, "; ".join(reasons)


def _nvml_joules(pynvml: Any, handle: Any) -> Callable[[], float]:
    """A reader of one GPU's total energy counter, in joules (NVML counts millijoules)."""

    def read() -> float:
        return float(pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)) / 1e3

    return read


def _visible(count: int) -> list[int]:
    """The GPUs this process may use: ``CUDA_VISIBLE_DEVICES`` when it lists indices (NVML numbers
    every GPU of the machine), else all of them."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is None or not all(item.strip().isdigit() for item in listed.split(",") if item.strip()):
        return list(range(count))
    return [int(item) for item in listed.split(",") if item.strip() and int(item) < count]
