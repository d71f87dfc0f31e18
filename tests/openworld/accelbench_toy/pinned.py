"""A backend whose worker needs another version of a package than the host has: accelbench makes
its environment (``BackendInfo.environment``) and runs its workers there."""

import time

import accelbench

#: the host has six 1.17 (a dependency of its frameworks); this backend's environment pins 1.16
PINNED = "six==1.16.0"


class PinnedBackend(accelbench.Backend):
    info = accelbench.BackendInfo(
        name="pinned",
        framework="six",
        requires=("six",),
        models=("sleep",),
        precisions=("fp32",),
        devices=("cpu",),
        default_batch={"cpu": 4},
        version="0.1",
        environment=(PINNED,),
        description="sleeps 5 ms a step, in an environment with six 1.16.0",
    )

    def prepare(self, config):
        import six  # the environment's, not the host's

        return accelbench.Prepared(
            device_name="the host CPU", framework_version=six.__version__, settings={"six_file": six.__file__}
        )

    def step(self):
        time.sleep(0.005)


@accelbench.hookimpl
def register_backends(register):
    register(PinnedBackend())
