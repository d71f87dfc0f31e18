"""Replaying a results file (``accelbench rerun``): the same configurations, the same plugin and
framework versions, run again here, and what differs between then and now.

A record keeps its resolved config (so the rerun's config hash is the record's), its plugin's
version, the versions of its framework's distributions (``environment.packages``) and a lock of
every distribution where its workers ran (``environment.lock``, or ``environment.worker.lock`` in
an environment of its own). A rerun pins the framework distributions whose installed version
differs from the record's, so their workers run in an environment made with those versions
(``accelbench.environments.python_envs``, cached like any other); the rest of the lock is compared and its
differences listed, as are the machine's: CPU model, flags and cores, accelerators and drivers.
The comparison of then and now is unpaired -- two invocations, possibly two machines -- and says
so.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from importlib import metadata

from accelbench.environments.machine import CORE_PACKAGES
from accelbench.errors import UsageError
from accelbench.planning.config import RunConfig
from accelbench.records.blocks import Accelerator, Environment, Lock
from accelbench.records.results import Record

#: the fields of a record's environment that say which machine it ran on
MACHINE_FIELDS = ("cpu_model", "cpu_cores", "cpu_flags", "accelerators", "os", "python")


@dataclass(frozen=True)
class Replay:
    """One record to run again: its backend, its config, and the pins its workers need."""

    record: Record
    backend_id: str
    config: RunConfig
    #: ``name==version`` of the record's framework distributions installed here at another version
    pins: tuple[str, ...]


def select(records: list[Record], wanted: tuple[str, ...]) -> list[Record]:
    """The records named by a prefix of their config hash (every record when none is named)."""
    if not wanted:
        return records
    chosen = []
    for prefix in wanted:
        found = [r for r in records if r.config_hash.startswith(prefix.lower())]
        if len(found) != 1:
            hashes = ", ".join(r.config_hash[:12] for r in records)
            problem = "matches no record" if not found else f"matches {len(found)} records"
            raise UsageError(f"--record {prefix!r} {problem} (config hashes: {hashes})")
        chosen += found
    return chosen


def replay_of(record: Record) -> Replay:
    """What runs a record again. Its config as it ran, resolved (``planning.resolve`` leaves a
    resolved config as it is); fields a config of an older accelbench lacks take today's defaults."""
    known = {f.name for f in dataclasses.fields(RunConfig)}
    config = RunConfig.from_fields({key: value for key, value in record.config.items() if key in known})
    return Replay(record, f"{record.plugin.name}:{record.backend.name}", config, tuple(framework_pins(record)))


#: distributions a worker environment gets from accelbench itself, never from a record's lock
NOT_RESTORED = frozenset({"accelbench", "pip", "setuptools", "wheel"})


def framework_pins(record: Record) -> list[str]:
    """What the rerun's workers must hold. A record whose workers ran a Python of their own (an
    environment, or one the user gave): every distribution of the lock read in that worker (but
    accelbench and the plugin's own distribution, which come from here), so its environment is
    made again as it was, whatever the host has. Otherwise (the host's Python): the record's
    framework distributions (not accelbench's own) whose version here differs."""
    worker = record.environment.worker
    if worker is not None and worker.kind != "host" and worker.lock is not None:
        own = NOT_RESTORED | {_normalized(worker.plugin.split()[0])} if worker.plugin else NOT_RESTORED
        return [pin for pin in worker.lock.distributions if _normalized(pin.split("==", 1)[0]) not in own]
    recorded = {**record.environment.packages, **((worker.packages if worker else None) or {})}
    pins = []
    for name, version in sorted(recorded.items()):
        if name in CORE_PACKAGES:
            continue
        try:
            here = metadata.version(name)
        except metadata.PackageNotFoundError:
            here = None
        if here != version:
            pins.append(f"{name}=={version}")
    return pins


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def lock_of(record: Record) -> Lock | None:
    """The lock of the Python the record's workers ran (result schema 1.11 and later)."""
    environment = record.environment
    return (environment.worker.lock if environment.worker else None) or environment.lock


def lock_differences(then: Lock | None, now: Lock | None) -> list[str]:
    """Lines naming each distribution added, removed or at another version, and the interpreter."""
    if then is None or now is None:
        return ["no lock to compare with (a record written before result schema 1.11)"]
    if then.sha256 == now.sha256:
        return []
    before, after = _versions(then), _versions(now)
    lines = [f"python {then.python} -> {now.python}"] if then.python != now.python else []
    for name in sorted(before.keys() | after.keys()):
        if before.get(name) != after.get(name):
            lines.append(f"{name} {before.get(name, '(absent)')} -> {after.get(name, '(absent)')}")
    return lines


def _versions(lock: Lock) -> dict[str, str]:
    return dict(pin.split("==", 1) for pin in lock.distributions)


def _accelerators(found: list[Accelerator]) -> str:
    return ", ".join(f"{a.name} (driver {a.driver})" for a in found) or "none"


def machine_differences(then: Environment, now: Environment) -> list[str]:
    """Lines naming each machine fact that differs (CPU flags by what was gained and lost)."""
    lines = []
    for name in MACHINE_FIELDS:
        before, after = getattr(then, name), getattr(now, name)
        if before == after:
            continue
        if name == "cpu_flags":
            lost, gained = sorted(set(before or ()) - set(after or ())), sorted(set(after or ()) - set(before or ()))
            lines.append(f"cpu_flags: lost {' '.join(lost) or 'none'}; gained {' '.join(gained) or 'none'}")
        elif name == "accelerators":
            lines.append(f"accelerators: {_accelerators(before)} -> {_accelerators(after)}")
        else:
            lines.append(f"{name}: {before} -> {after}")
    return lines
