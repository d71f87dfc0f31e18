"""Plugins that break the contract the ways a third party's might. Each must give a listed
plugin error or a failed record, never a crash of the host, and never stop the other backends."""

from __future__ import annotations

import dataclasses
import threading

import accelbench

from . import MlpBackend


class WrongTypes(accelbench.Backend):
    # models as a bare string, a variant for a model it does not declare
    info = dataclasses.replace(MlpBackend.info, name="wrong-types", models="mlp", variants={"cnn": ("a",)})


class BadPrepared(MlpBackend):
    """Reports a device name that is not a string."""

    info = dataclasses.replace(MlpBackend.info, name="bad-prepared")

    def prepare(self, config):
        prepared = super().prepare(config)
        return dataclasses.replace(prepared, device_name=["not", "a", "string"])


class BadRecord(MlpBackend):
    """Runs, then reports a count the result schema refuses (negative FLOPs per image)."""

    info = dataclasses.replace(MlpBackend.info, name="bad-record")

    def prepare(self, config):
        prepared = super().prepare(config)
        return dataclasses.replace(prepared, flops_per_image=-5.0)


class Unpicklable(MlpBackend):
    """Holds a lock: it cannot travel to its worker process."""

    info = dataclasses.replace(MlpBackend.info, name="unpicklable")

    def __init__(self):
        self.lock = threading.Lock()


@accelbench.hookimpl
def register_backends(register):
    register(WrongTypes())
    register(BadPrepared())
    register(BadRecord())
    register(Unpicklable())
    register("not a backend")
