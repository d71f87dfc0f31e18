"""Provenance: what machine and software produced a record, and which accelerators are here.

Nothing here imports a framework: package versions come from installed metadata, GPUs from
``nvidia-smi``, TPUs from their device files.
"""

from __future__ import annotations

import glob
import os
import platform
import shutil
import socket
import subprocess
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any, Iterable, Mapping

from accelbench.records.blocks import Environment
from accelbench.records.jsonform import from_json

#: the host's own packages; the frameworks' come from the modules the running backends require
CORE_PACKAGES = ("accelbench", "numpy", "pluggy", "jsonschema", "pytest-benchmark")


def collect(modules: Iterable[str] = ()) -> Environment:
    """The ``environment`` block of a record; ``modules``: what the backends that run require
    (``BackendInfo.requires``), whose distributions are listed with their versions."""
    return from_json(
        Environment,
        {
            "hostname": socket.gethostname(),
            "cpu_model": cpu_model(),
            "cpu_flags": sorted(f for f in cpu_flags() if f.startswith(MATH_FLAG_PREFIXES)),
            "cpu_cores": os.cpu_count() or 1,
            **_when_known("cpu_sockets", cpu_sockets()),
            "memory_bytes": _memory_bytes(),
            **_when_known("memory_returned_to_host", memory_returned_to_host()),
            "os": platform.platform(),
            "python": platform.python_version(),
            "packages": package_versions(modules),
            "accelerators": gpus() + tpus(),
            "lock": lock(),
        },
    )


def cpu_sockets() -> int | None:
    """Physical CPU packages: the distinct ``physical id`` lines of /proc/cpuinfo (None where the
    kernel lists none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    ids = {line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("physical id")}
    return len(ids) or None


@cache
def lock() -> dict[str, Any]:
    """Every distribution installed in this Python, as ``name==version`` lines, with this
    interpreter's version and a hash of both: what ``accelbench rerun`` compares and restores."""
    import hashlib
    import re

    pins = sorted({f"{re.sub(r'[-_.]+', '-', d.name).lower()}=={d.version}" for d in metadata.distributions() if d.name})
    python = platform.python_version()
    digest = hashlib.sha256("\n".join([f"python {python}", *pins]).encode()).hexdigest()
    return {"python": python, "distributions": pins, "sha256": digest}


def _when_known(key: str, value: object) -> dict[str, object]:
    return {} if value is None else {key: value}


#: the CPU flags a record keeps: the vector and matrix units that decide a framework's kernels
MATH_FLAG_PREFIXES = ("avx", "amx", "fma", "f16c", "sse4", "asimd", "sve")


@cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (``/proc/cpuinfo``'s flags or Features line); empty where unknown.

    The machines change from day to day, and what a framework can do natively (or only emulate)
    follows from these, so plugins decide capability from them and records keep them.
    """
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith(("flags", "Features")):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def package_versions(modules: Iterable[str] = ()) -> dict[str, str]:
    found = {}
    for name in [*CORE_PACKAGES, *(d for m in modules for d in distributions(m))]:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


@cache
def _distributions_by_module() -> Mapping[str, list[str]]:
    return metadata.packages_distributions()


def distributions(module: str) -> list[str]:
    """The installed distributions that provide an importable module (from metadata, no import)."""
    return list(_distributions_by_module().get(module.partition(".")[0], []))


def distribution_version(module: str) -> str:
    """The version of the distribution that provides ``module``, or "" when none is installed."""
    for name in distributions(module):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return ""


def device_counts() -> dict[str, int]:
    """How many devices of each kind this machine has (cpu counts as one device)."""
    return {"cpu": 1, "gpu": len(gpus()), "tpu": len(tpus())}


@cache
def gpus() -> list[dict[str, str]]:
    """NVIDIA GPUs as nvidia-smi reports them, with the driver version; [] when there is none."""
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    rows = [[c.strip() for c in line.split(",")] for line in out.splitlines() if line.strip()]
    return [{"kind": "gpu", "name": r[0], "driver": r[1], "memory": r[2]} for r in rows if len(r) == 3]


@cache
def tpus() -> list[dict[str, str]]:
    """TPU chips visible through their device files (TPU VMs); [] elsewhere."""
    chips = sorted(glob.glob("/dev/accel*")) or (
        sorted(glob.glob("/dev/vfio/[0-9]*")) if os.environ.get("TPU_ACCELERATOR_TYPE") else []
    )
    kind = os.environ.get("TPU_ACCELERATOR_TYPE", "tpu")
    return [{"kind": "tpu", "name": kind, "driver": "", "memory": "", "path": p} for p in chips]


def cache_dir(*parts: str) -> Path:
    """accelbench's folder in the user's cache (``$XDG_CACHE_HOME/accelbench``, else
    ``~/.cache/accelbench``), or a path under it: where what is made or measured once per machine
    is kept (worker environments, peaks, datasets, a plugin's read-backs). Not created here."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base, "accelbench", *parts)


def cpu_model() -> str:
    """The CPU's model name as /proc/cpuinfo gives it (the platform's processor string elsewhere)."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


#: virtio's device id of a memory balloon, and the balloon's feature bit VIRTIO_BALLOON_F_REPORTING
VIRTIO_BALLOON_DEVICE_ID = 0x0005
BALLOON_FREE_PAGE_REPORTING_BIT = 5


@cache
def memory_returned_to_host(virtio_devices: str = "/sys/bus/virtio/devices") -> bool | None:
    """Whether this virtual machine hands its free memory back to its host (a virtio balloon that
    negotiated free page reporting); None where Linux's sysfs is not there to tell.

    Why a record keeps it: the host drops a reported page, so the guest's next first touch of it
    costs a host fault too. On a Firecracker VM that was 9.6 us a page against 1.2 us for a page
    still backed, so a worker whose allocator grows late takes one slow step full of page faults
    (``trials[].process``), at a step that varies from worker to worker.
    """
    if not os.path.isdir(os.path.dirname(virtio_devices)):
        return None
    for device in glob.glob(os.path.join(virtio_devices, "*")):
        try:
            with open(os.path.join(device, "device")) as fh:
                device_id = int(fh.read().strip(), 16)
            with open(os.path.join(device, "features")) as fh:
                features = fh.read().strip()  # one '0'/'1' per feature bit, bit 0 first
        except (OSError, ValueError):
            continue
        if (
            device_id == VIRTIO_BALLOON_DEVICE_ID
            and len(features) > BALLOON_FREE_PAGE_REPORTING_BIT
            and features[BALLOON_FREE_PAGE_REPORTING_BIT] == "1"
        ):
            return True
    return False


def _memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 0
