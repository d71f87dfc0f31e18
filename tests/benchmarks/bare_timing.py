"""The timing every bare loop shares, and nothing of accelbench's: warm-up steps untimed, then
images / wall time of the timed steps (each step returns its loss as a Python number, so it has
finished), with the kernel CPU time and minor page faults per step (the allocator's returns to
the kernel). Prints one JSON line.

With ``BARE_LOCKSTEP`` set in its environment (``lockstep.py``) a loop instead stays up after its
warm-up and times blocks of steps on request: a number of steps per line on stdin, one
``lockstep {JSON}`` line back per block; an empty line or the end of stdin ends it."""

import json
import os
import resource
import sys
import time

LOCKSTEP = "BARE_LOCKSTEP"
#: the line a lockstep loop prints once warm, and the prefix of each block's answer
READY, ANSWER = "lockstep ready", "lockstep "


def time_steps(one_step, batch: int, warmup: int, timed: int) -> None:
    for _ in range(warmup):
        one_step()
    if os.environ.get(LOCKSTEP):
        serve_blocks(one_step, batch)
        return
    usage, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for _ in range(timed):
        one_step()
    wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF)
    print(
        json.dumps(
            {
                "images": batch * timed,
                "wall_time_s": wall,
                "images_per_sec": batch * timed / wall,
                "system_s_per_step": (after.ru_stime - usage.ru_stime) / timed,
                "minor_faults_per_step": (after.ru_minflt - usage.ru_minflt) / timed,
            }
        )
    )


def serve_blocks(one_step, batch: int) -> None:
    print(READY, flush=True)
    for line in sys.stdin:
        steps = int(line) if line.strip() else 0
        if steps <= 0:
            return
        start = time.perf_counter()
        for _ in range(steps):
            one_step()
        wall = time.perf_counter() - start
        print(ANSWER + json.dumps({"images": batch * steps, "wall_time_s": wall}), flush=True)
