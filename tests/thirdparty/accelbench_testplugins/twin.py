"""The fixed-time backend again, under another name and with a speed of its own: two runs of one
invocation (``--plugin sleepy --plugin twin``), for comparisons of a known ratio."""

import dataclasses

import accelbench
from accelbench_testplugins.sleepy import Sleepy


class SleepyTwin(Sleepy):
    own_scale = "twin_scale"
    info = dataclasses.replace(Sleepy.info, name="fixed-time-twin",
                               options={**Sleepy.info.options, "twin_scale": "multiplies this twin's step time"})


@accelbench.hookimpl
def register_backends(register):
    register(SleepyTwin())
