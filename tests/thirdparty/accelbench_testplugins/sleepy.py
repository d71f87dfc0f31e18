"""A backend whose step takes a known time, so the host's images/sec can be checked against it.

The step busy-waits on perf_counter, which is exact to microseconds (sleep overshoots).
Options: ``step_ms`` (default 20), ``noise`` (relative stdev of a seeded random jitter), ``scale``
(multiplies the step time: 1.02 makes this backend 2% slower).
"""

import random
import time

import accelbench


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class Sleepy(accelbench.Backend):
    info = accelbench.BackendInfo(
        name="fixed-time", framework="none", requires=(), variants=("v1", "v1.5"),
        precisions=("fp32", "bf16"), devices=("cpu",), version="1.2.3",
        description="busy-waits a known time per step",
        options={"step_ms": "step time in ms", "noise": "relative stdev of the step time",
                 "scale": "multiplies the step time"})

    def prepare(self, config):
        self.step_s = config.options.get("step_ms", 20) / 1000 * config.options.get("scale", 1.0)
        self.noise = config.options.get("noise", 0.0)
        self.rng = random.Random(config.seed)
        self.loss = 10.0
        return accelbench.Prepared(device_name="test cpu", flops_per_image=1e9,
                                   settings={"step_s": self.step_s, "noise": self.noise})

    def step(self):
        jitter = self.rng.gauss(0, self.noise) if self.noise else 0.0
        spin(max(0.0, self.step_s * (1 + jitter)))
        self.loss *= 0.99
        return self.loss


@accelbench.hookimpl
def register_backends(register):
    register(Sleepy())
