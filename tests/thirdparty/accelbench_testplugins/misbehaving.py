"""Backends that fail the ways real ones do: raise, exit abruptly, segfault, hang, run out of memory."""

import os
import signal
import time

import accelbench

#: a model of its own: no core list is consulted
MODELS = ("toy",)


class Misbehaving(accelbench.Backend):
    def __init__(self, name: str, when: str = "step"):
        self.info = accelbench.BackendInfo(
            name=name, framework="none", requires=(), models=MODELS, version="0.1", description=f"fails by {name} during {when}"
        )
        self.when = when

    def prepare(self, config):
        if self.when == "prepare":
            self.fail()
        return accelbench.Prepared(device_name="test cpu")

    def step(self):
        self.fail()

    def fail(self):
        if self.info.name == "raises":
            raise RuntimeError("deliberate failure in the test plugin")
        if self.info.name == "exits":
            os._exit(3)
        if self.info.name == "segfaults":
            os.kill(os.getpid(), signal.SIGSEGV)
        if self.info.name == "hangs":
            time.sleep(3600)
        if self.info.name == "oom":  # grows like a runaway input pipeline, touching every page
            self.hog = []
            page = os.sysconf("SC_PAGE_SIZE")
            for _ in range(64):  # at most 16 GB: the host's limit must stop it long before
                chunk = bytearray(256 * 1024**2)
                # one byte per page makes every page resident at one fault each; filling the
                # whole chunk (twice, through a bytes copy) took 5.8 s for 2.3 GB on a VM with
                # slow faults, which the 8 s timeout of test_every_failure... could not absorb
                chunk[::page] = b"x" * (len(chunk) // page)
                self.hog.append(chunk)
                time.sleep(0.05)
            time.sleep(3600)
        raise AssertionError(self.info.name)


class AsyncStep(accelbench.Backend):
    """Returns before its work is done: the work lands on every fifth call (an async framework)."""

    info = accelbench.BackendInfo(name="async-step", framework="none", requires=(), models=MODELS)

    def prepare(self, config):
        self.calls = 0
        return accelbench.Prepared(device_name="test cpu")

    def step(self):
        self.calls += 1
        if self.calls % 5 == 0:
            time.sleep(0.05)


class SpillingStep(accelbench.Backend):
    """Leaves each step's work running when it returns (as MXNet without ``waitall``): the next
    step waits for it first. Back to back every step takes the work's time; after a pause none."""

    info = accelbench.BackendInfo(name="spilling-step", framework="none", requires=(), models=MODELS)
    WORK_S = 0.02

    def prepare(self, config):
        self.done_at = time.perf_counter()
        return accelbench.Prepared(device_name="test cpu")

    def step(self):
        while time.perf_counter() < self.done_at:  # the previous step's work, still running
            pass
        self.done_at = time.perf_counter() + self.WORK_S  # this step's, left running


class Unavailable(accelbench.Backend):
    info = accelbench.BackendInfo(name="needs-gpu", framework="none", requires=(), models=MODELS, devices=("cpu", "gpu"))

    def check(self, config):
        return "no GPU here (test plugin always refuses)"


class MissingFramework(accelbench.Backend):
    info = accelbench.BackendInfo(
        name="needs-framework", framework="nonexistent", requires=("accelbench_nonexistent_framework",), models=MODELS
    )


@accelbench.hookimpl
def register_backends(register):
    for name in ("raises", "exits", "segfaults", "hangs", "oom"):
        register(Misbehaving(name))
    register(AsyncStep())
    register(SpillingStep())
    register(Unavailable())
    register(MissingFramework())
