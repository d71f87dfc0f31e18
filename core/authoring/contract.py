"""Contract checks a plugin author runs against any backend (also as the ``accelbench_contract``
pytest fixture). Each check raises ``ContractViolation`` (an AssertionError) saying what is wrong.

    def test_my_backend(accelbench_contract):
        accelbench_contract.check_all("myplugin:resnet50", image_size=32, global_batch=4)
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from typing import Any

from accelbench.errors import UsageError
from accelbench.execution import runner, session
from accelbench.planning import plan as planning
from accelbench.planning.config import RunConfig
from accelbench.records import results as records
from accelbench.registry import BackendRef, PluginHost

#: an async step returns at once and the work lands on a later step: mean >> median, tiny minimum
ASYNC_MEAN_OVER_MEDIAN = 3.0
ASYNC_MIN_OVER_MEDIAN = 0.05
#: a step after an idle pause that takes less than this share of a back-to-back step found its
#: predecessor's work done during the pause: the work spilled past step()'s return
SPILL_GAPPED_OVER_BACK_TO_BACK = 0.7


class ContractViolation(AssertionError):
    pass


def check_all(backend: str, **config: Any) -> records.Record:
    describes_without_framework(backend)
    refuses_bad_config(backend)
    step_syncs(backend, **config)
    work_stays_in_its_step(backend, **config)
    return record_validates(backend, **config)


def describes_without_framework(backend: str) -> dict[str, Any]:
    """Listing and describing the backend in a fresh interpreter imports none of its framework."""
    code = (
        "import json, sys\n"
        "from accelbench.registry import PluginHost\n"
        f"[ref] = PluginHost().select(backends=[{backend!r}])\n"
        "info = ref.backend.describe().to_json()\n"
        "print(json.dumps({'info': info, 'loaded': [m for m in info['requires'] if m in sys.modules]}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=path_env())
    if out.returncode:
        raise ContractViolation(f"{backend}: describing it failed: {out.stderr.strip().splitlines()[-1:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if result["loaded"]:
        raise ContractViolation(f"{backend}: describing it imported {', '.join(result['loaded'])}")
    info: dict[str, Any] = result["info"]
    return info


def refuses_bad_config(backend: str) -> list[str]:
    """A precision the backend does not declare is refused before any worker starts; a request
    only the machine can refuse (more accelerators than any machine has) comes back
    ``unavailable`` with a reason, never as a crash."""
    ref = _ref(backend)
    info = ref.backend.describe()
    try:
        planning.plan([ref], RunConfig(precision="no-such-precision"))
    except UsageError as exc:
        reasons = [str(exc)]
    else:
        raise ContractViolation(f"{backend}: a precision it does not declare was not refused")
    for kind in [d for d in info.devices if d != "cpu"][:1]:  # the backend's own check must say no
        config = RunConfig(device=kind, device_count=4096, global_batch=4096, timed_steps=1, warmup_steps=0)
        [record] = runner.execute(planning.plan([ref], config), records.check_all)
        if record.status != "unavailable" or not record.reason:
            raise ContractViolation(f"{backend}: an impossible config gave {record.status!r}: {record.reason}")
        reasons.append(record.reason)
    return reasons


def step_syncs(backend: str, timed_steps: int = 12, **config: Any) -> records.Record:
    """Step times look synchronous: no near-zero steps with the work landing on a few others."""
    record = _run(backend, timed_steps=timed_steps, **config)
    times = sorted(record.trials[0].step_times_s)
    if record.step_time is None:
        raise ContractViolation(f"{backend}: an ok run gave no step-time summary")
    median, mean = record.step_time.median_s, record.step_time.mean_s
    if mean > ASYNC_MEAN_OVER_MEDIAN * median or times[0] < ASYNC_MIN_OVER_MEDIAN * median:
        raise ContractViolation(
            f"{backend}: step times look asynchronous (min {times[0]:.2e} s, median "
            f"{median:.2e} s, mean {mean:.2e} s): step() must return after the device finished"
        )
    return record


def work_stays_in_its_step(backend: str, calls: int = 5, **config: Any) -> tuple[float, float]:
    """A step's work ends before its ``step()`` returns. A step that leaves its last work running
    (an asynchronous framework without a final sync before it returns) is
    finished by the next step's first wait, so back-to-back steps take as long as synced ones and
    ``step_syncs`` cannot see it; but a step after an idle pause finds its predecessor's work done
    and returns early. Returns the median seconds of back-to-back and of paused steps."""
    stepped = session.BackendSession(_ref(backend), RunConfig.from_dict({"warmup_steps": 0, **config}))
    try:
        stepped.steps(2)  # warm-up
        stepped.steps(calls)
        back_to_back = statistics.median(stepped.call_times[-calls:])
        for _ in range(calls):
            time.sleep(max(1.5 * back_to_back, 0.01))  # long enough for spilled work to finish
            stepped.step()
        paused = statistics.median(stepped.call_times[-calls:])
    finally:
        stepped.close()
    if paused < SPILL_GAPPED_OVER_BACK_TO_BACK * back_to_back:
        raise ContractViolation(
            f"{backend}: a step after an idle pause took {paused:.2e} s against {back_to_back:.2e} s "
            "back to back: its work spills past step()'s return (sync the device before returning)"
        )
    return back_to_back, paused


def record_validates(backend: str, **config: Any) -> records.Record:
    """A normal run gives an ``ok`` record that passes the result schema."""
    return _run(backend, **config)


def _run(backend: str, **config: Any) -> records.Record:
    defaults = {"warmup_steps": 2, "timed_steps": 5}
    [record] = runner.execute(planning.plan([_ref(backend)], RunConfig.from_dict({**defaults, **config})), records.check_all)
    if not record.ok:
        raise ContractViolation(f"{backend}: run ended {record.status}: {record.reason}")
    return record


def _ref(backend: str) -> BackendRef:
    [ref] = PluginHost().select(backends=[backend])
    return ref


def path_env() -> dict[str, str]:
    """A subprocess's environment with this interpreter's import path, so it sees the same plugins."""
    import os

    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
