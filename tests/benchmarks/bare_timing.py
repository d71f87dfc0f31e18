"""The timing every bare loop shares, and nothing of accelbench's: warm-up steps untimed, then
images / wall time of the timed steps (each step returns its loss as a Python number, so it has
finished), with the kernel CPU time and minor page faults per step (the allocator's returns to
the kernel). Prints one JSON line."""

import json
import resource
import time


def time_steps(one_step, batch: int, warmup: int, timed: int) -> None:
    for _ in range(warmup):
        one_step()
    usage, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for _ in range(timed):
        one_step()
    wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"images": batch * timed, "wall_time_s": wall, "images_per_sec": batch * timed / wall,
                      "system_s_per_step": (after.ru_stime - usage.ru_stime) / timed,
                      "minor_faults_per_step": (after.ru_minflt - usage.ru_minflt) / timed}))
