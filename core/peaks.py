"""The peak a record's achieved FLOP/s is measured against: an accelerator's published dense peak
(``data/accelerator_peaks.json``, every figure with its source), per device and precision.

A record gets ``flops.peak_per_sec``, ``flops.peak_source`` and ``flops.utilisation`` (achieved /
peak) when its device matches an entry; otherwise none, never a guess.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any


@dataclass(frozen=True)
class Peak:
    flops_per_s: float
    source: str


@cache
def _table() -> list[dict[str, Any]]:
    return json.loads(resources.files("accelbench").joinpath("data/accelerator_peaks.json").read_text())["entries"]


def published(kind: str, device_name: str, precision: str, devices: int = 1) -> Peak | None:
    """The published dense peak of ``devices`` devices of this name at this precision, or None."""
    name = device_name.lower()
    for entry in _table():
        if entry["kind"] == kind and entry["match"].lower() in name:
            tflops = entry["tflops"].get(precision)
            if tflops is None:
                return None
            basis = entry.get("basis", {}).get(precision, precision)
            per = f" x {devices} devices" if devices > 1 else ""
            return Peak(tflops * 1e12 * devices, f"published {basis} dense peak of {entry['match']}{per}: {entry['source']}")
    return None
