"""The fixed-time backend again, under another name and with a speed of its own: two runs of one
invocation (``--plugin sleepy --plugin twin``), for comparisons of a known ratio."""

import dataclasses

import accelbench
from accelbench_testplugins.sleepy import Sleepy


class SleepyTwin(Sleepy):
    own_scale = "twin_scale"
    own_exit = "twin_exit_after"
    own_flag = "twin_flag"
    info = dataclasses.replace(
        Sleepy.info,
        name="fixed-time-twin",
        options={
            **Sleepy.info.options,
            "twin_scale": "multiplies this twin's step time",
            "twin_exit_after": "this twin's process exits after that many steps",
            "twin_flag_file": "a file this twin creates on reaching a step",
            "twin_flag_at": "the step at which it creates it",
        },
    )


@accelbench.hookimpl
def register_backends(register):
    register(SleepyTwin())
