"""``accelbench peak``: each installed framework's attainable matrix-product rate on this machine,
per precision, measured in a fresh worker like any run and cached for records (``peaks``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from accelbench.analysis import peaks
from accelbench.environments import machine as environment
from accelbench.environments import python_envs as envs
from accelbench.execution.processes import Worker, WorkerFailure
from accelbench.execution.protocol import Check, PrepareMatmul, TimeMatmul
from accelbench.planning.config import RunConfig
from accelbench.planning.plan import Plan, plan
from accelbench.records import results as records
from accelbench.registry import BackendRef

#: matrix side by device kind: no CPU cache holds three 2048² fp32 operands (48 MB), and a
#: product of 2048² is 17 GFLOP, a fraction of a second on a 2-core CPU even where bf16 is
#: emulated slowly; an accelerator needs 8192² to fill its units
DEFAULT_SIZE = {"cpu": 2048}
ACCELERATOR_SIZE = 8192
DEFAULT_REPEATS = 3
#: products per timed run
CALLS_PER_REPEAT = 4
#: the longest one product of the default side may take: a precision the hardware lacks, emulated
#: in software, can be hundreds of times slower (one framework's bf16 product on an AVX2-only Zen 3: 0.3
#: GFLOP/s, a minute for one 2048² product, 13 minutes for the peak), so it is measured on a
#: smaller side, halved until a product fits, as told from one timed product of PROBE_SIDE²
SLOW_PRODUCT_S = 2.0
PROBE_SIDE = 512


@dataclass
class PeakOutcome:
    backend_id: str
    framework: str
    precision: str
    status: str  # "ok" or "unavailable"/"failed"
    reason: str = ""
    measurement: peaks.Measured | None = None
    #: what the backend's prepare_matmul reported using (threads, oneDNN, dtypes)
    settings: dict[str, Any] | None = None
    #: what the backend said the figure needs read with (a precision the framework emulates)
    warnings: list[str] = field(default_factory=list)


def per_framework(refs: list[BackendRef]) -> list[BackendRef]:
    """The first available backend of each framework that can measure a peak."""
    chosen: dict[str, BackendRef] = {}
    for ref in refs:
        info = ref.backend.describe()
        if ref.backend.measures_peak() and info.framework not in chosen:
            chosen[info.framework] = ref
    return list(chosen.values())


def for_plans(plans: list[Plan]) -> list[tuple[BackendRef, str, str, int | None]]:
    """What ``accelbench run --peak`` measures before its runs: each framework, precision and
    device of the plans that can run, once, with the first of its backends that measures a peak
    (and the plan's threads)."""
    wanted: dict[tuple[str, str, str], tuple[BackendRef, str, str, int | None]] = {}
    for item in plans:
        if item.precheck is None and item.ref.backend.measures_peak():
            precision = item.config.resolved_precision
            key = (item.ref.backend.describe().framework, precision, item.config.device)
            wanted.setdefault(key, (item.ref, precision, item.config.device, item.config.threads))
    return list(wanted.values())


def measure(
    ref: BackendRef,
    precision: str,
    device: str = "auto",
    size: int | None = None,
    repeats: int = DEFAULT_REPEATS,
    threads: int | None = None,
) -> PeakOutcome:
    info = ref.backend.describe()
    outcome = PeakOutcome(ref.id, info.framework, precision, "unavailable")
    [item] = plan([ref], RunConfig(precision=precision, device=device, device_count=1, threads=threads))
    if item.precheck:
        outcome.reason = item.precheck.reason
        return outcome
    fit_size = size is None
    size = size or DEFAULT_SIZE.get(item.config.device, ACCELERATOR_SIZE)
    try:
        python, _ = envs.interpreter(item.setup, True)  # the framework's own environment, if it has one
        worker = Worker(ref, item.config, label="peak", python=python)
    except envs.EnvironmentNotMade as exc:
        outcome.reason = f"no worker environment: {exc}"
        return outcome
    except WorkerFailure as failure:
        outcome.status, outcome.reason = failure.status, failure.reason
        return outcome
    try:
        refusal = worker.call(Check())
        if refusal:
            outcome.reason = refusal
            return outcome
        if fit_size:
            size, slow = fitted_size(worker, size)
            outcome.warnings += [slow] if slow else []
        prepared = worker.call(PrepareMatmul(size))
        timings = worker.call(TimeMatmul(CALLS_PER_REPEAT, repeats))
    except WorkerFailure as failure:
        outcome.status, outcome.reason = failure.status, worker.keep_log(failure).reason
        return outcome
    finally:
        worker.close()
    flops_per_call = 2.0 * size**3
    # the best timed run: a peak is what the hardware attains, not its average under noise
    best = max(t.timed_calls * flops_per_call / t.wall_time_s for t in timings)
    env = environment.collect()
    version = prepared.framework_version or ref.framework_version()
    outcome.status, outcome.settings = "ok", prepared.settings
    outcome.warnings = list(prepared.warnings) + outcome.warnings
    outcome.measurement = peaks.Measured(
        machine=peaks.machine_id(env, item.config.device, prepared.device_name),
        device_kind=item.config.device,
        device_name=prepared.device_name,
        framework=info.framework,
        framework_version=version,
        precision=precision,
        size=size,
        repeats=repeats,
        flops_per_s=best,
        measured_utc=records.utc_now(),
    )
    return outcome


def fitted_size(worker: Worker, size: int) -> tuple[int, str | None]:
    """The default side, or half of it as often as one product would take longer than
    SLOW_PRODUCT_S, told from one timed product of PROBE_SIDE² in this worker; with the warning
    that says why the side is smaller (None where it is not)."""
    if size <= PROBE_SIDE:
        return size, None
    worker.call(PrepareMatmul(PROBE_SIDE))
    [probe] = worker.call(TimeMatmul(1, 1))
    seconds = probe.wall_time_s / probe.timed_calls
    chosen = size
    while chosen > PROBE_SIDE and seconds * (chosen / PROBE_SIDE) ** 3 > SLOW_PRODUCT_S:
        chosen //= 2
    if chosen == size:
        return size, None
    return chosen, (
        f"a {PROBE_SIDE}² product took {seconds:.2f} s here, so a {size}² one would take about "
        f"{seconds * (size / PROBE_SIDE) ** 3:.0f} s: the peak is of {chosen}² products"
    )
