"""A backend whose step takes a known time, so the host's images/sec can be checked against it.

The step busy-waits on perf_counter, which is exact to microseconds (sleep overshoots).
Options: ``step_ms`` (default 20), ``noise`` (relative stdev of a seeded random jitter), ``scale``
(multiplies the step time: 1.02 makes this backend 2% slower), ``drift_per_s`` with
``drift_origin`` (a Unix time): a machine that slows down steadily, the step time growing by
``drift_per_s`` of itself per second of wall time since ``drift_origin``; ``slow_first``: the
first N steps are slower, from 5 times as long down towards 1 (a framework's tracing, allocator
growth and cache warm-up, which fade step by step); ``hold_mb``: memory the worker allocates and
touches in prepare and holds to the end (a framework's weights and activations, for --huge-pages);
``steps_per_call``: each call runs that many steps (a host loop of steps, as ``tpu_official``'s).
``wave`` with ``wave_period_s``: a machine whose speed swings, the step time multiplied by
``1 + wave * sin(2 pi t / period)`` (t from ``drift_origin``): a neighbour's load coming and going
on the scale of seconds. ``prepare_s``: prepare takes that long (imports, model build, compilation).
``device_bytes``: what ``device_memory`` reports as the framework's device peak.
``energy_uj_per_step``: each step advances the fake RAPL counter ``intel-rapl:0/energy_uj`` under
``$ACCELBENCH_POWERCAP_ROOT`` by that much, wrapping at its ``max_energy_range_uj`` as RAPL does.
A subclass may name an option of its own that multiplies its step time (``own_scale``) or makes
its process exit abruptly after that many steps (``own_exit``), or that creates a file when it
reaches a step (``own_flag``: options ``<own_flag>_file`` and ``<own_flag>_at``, a signal to a
process outside the run, which can then load the machine in the middle of a block), so one of two otherwise equal
backends in one invocation can differ.
"""

import math
import os
import random
import time

import accelbench


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class Sleepy(accelbench.Backend):
    #: an option that multiplies this backend's step time on top of ``scale`` (None: none)
    own_scale = None
    #: an option: the process exits (code 3) after this many steps, warm-up included (None: none)
    own_exit = None
    #: the prefix of two options: create the file ``<prefix>_file`` on reaching step ``<prefix>_at``
    own_flag = None
    info = accelbench.BackendInfo(
        name="fixed-time",
        framework="none",
        requires=(),
        models=("resnet50",),
        variants={"resnet50": ("v1", "v1.5")},
        precisions=("fp32", "bf16"),
        devices=("cpu",),
        version="1.2.3",
        description="busy-waits a known time per step",
        options={
            "step_ms": "step time in ms",
            "noise": "relative stdev of the step time",
            "scale": "multiplies the step time",
            "drift_per_s": "step time growth per second",
            "drift_origin": "Unix time the drift counts from",
            "slow_first": "steps at the start that are slower, fading from 5x",
            "hold_mb": "MiB allocated and touched in prepare, held to the end",
            "steps_per_call": "steps each call runs (a host loop of steps)",
            "wave": "relative amplitude of a swinging machine speed",
            "wave_period_s": "period of that swing, seconds",
            "prepare_s": "seconds prepare takes",
            "device_bytes": "the device memory peak device_memory reports",
            "energy_uj_per_step": "microjoules each step adds to a fake RAPL counter",
        },
    )

    def prepare(self, config):
        self.step_s = config.options.get("step_ms", 20) / 1000 * config.options.get("scale", 1.0)
        if self.own_scale:
            self.step_s *= config.options.get(self.own_scale, 1.0)
        self.noise = config.options.get("noise", 0.0)
        self.drift = config.options.get("drift_per_s", 0.0)
        self.origin = config.options.get("drift_origin", time.time())
        self.slow_first = self.slow_steps = config.options.get("slow_first", 0)
        # noise of its own in every trial's process, as a real machine's is (the seed still varies it)
        self.rng = random.Random(f"{config.seed}-{os.getpid()}")
        self.loss = 10.0
        self.held = bytearray(config.options.get("hold_mb", 0) << 20)  # zero-filled: every page touched
        self.steps_per_call = config.options.get("steps_per_call", 1)
        self.exit_after = config.options.get(self.own_exit) if self.own_exit else None
        self.flag = (
            (config.options.get(f"{self.own_flag}_file"), config.options.get(f"{self.own_flag}_at"))
            if self.own_flag
            else (None, None)
        )
        self.steps_run = 0
        self.wave, self.period = config.options.get("wave", 0.0), config.options.get("wave_period_s", 1.0)
        self.device_bytes = config.options.get("device_bytes")
        self.energy_uj = config.options.get("energy_uj_per_step")
        time.sleep(config.options.get("prepare_s", 0.0))
        return accelbench.Prepared(
            device_name="test cpu",
            flops_per_image=1e9,
            steps_per_call=self.steps_per_call,
            settings={"step_s": self.step_s, "noise": self.noise},
        )

    def device_memory(self):
        if self.device_bytes is None:
            return super().device_memory()
        return accelbench.DeviceMemory(self.device_bytes, "the test's device_bytes option")

    def step(self):
        for _ in range(self.steps_per_call):
            loss = self.one_step()
        return loss

    def one_step(self):
        self.steps_run += 1
        if self.exit_after is not None and self.steps_run > self.exit_after:
            os._exit(3)
        if self.flag[0] and self.steps_run == self.flag[1]:
            open(self.flag[0], "w").close()
        jitter = self.rng.gauss(0, self.noise) if self.noise else 0.0
        since = time.time() - self.origin
        slowdown = (1 + self.drift * since) * (1 + self.wave * math.sin(2 * math.pi * since / self.period))
        if self.slow_steps > 0:
            slowdown *= 1 + 4 * self.slow_steps / self.slow_first
            self.slow_steps -= 1
        spin(max(0.0, self.step_s * slowdown * (1 + jitter)))
        if self.energy_uj:
            self.advance_energy_counter()
        self.loss *= 0.99
        return self.loss

    def advance_energy_counter(self):
        zone = os.path.join(os.environ["ACCELBENCH_POWERCAP_ROOT"], "intel-rapl:0")
        with open(os.path.join(zone, "max_energy_range_uj")) as limit, open(os.path.join(zone, "energy_uj")) as now:
            value = (int(now.read()) + self.energy_uj) % int(limit.read())
        with open(os.path.join(zone, "energy_uj"), "w") as counter:
            counter.write(str(value))


@accelbench.hookimpl
def register_backends(register):
    register(Sleepy())
