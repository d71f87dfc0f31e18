"""What the first touch of a page of memory costs on this machine, chunk by chunk.

A framework's allocator that grows (TensorFlow's, XLA's) has the kernel map new pages, one minor
page fault each. On bare metal that costs about the same for every page; on a virtual machine
whose balloon reports free pages to its host (``environment.memory_returned_to_host`` in every
record), a page the host took back costs a host fault as well, and which pages a process gets
depends on what ran before it. This benchmark maps anonymous memory, writes one byte into each
4 KiB page chunk by chunk, timing each chunk, and unmaps it; each pass the same way.

    python tests/benchmarks/bench_first_touch.py --gib 12 --chunk-mib 256 --passes 3 --pause 8

Prints the machine, then per pass: microseconds per page of every chunk, the pass's minor page
faults against its pages, and how many chunks cost more than twice the pass's fastest.
"""

from __future__ import annotations

import argparse
import mmap
import resource
import time

import numpy as np

PAGE = 4096


def touch_pass(size: int, chunk: int) -> tuple[list[float], int]:
    """Map ``size`` bytes, write one byte per page ``chunk`` bytes at a time; microseconds per
    page of each chunk and the minor page faults of the whole pass."""
    mapping = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    pages = np.frombuffer(mapping, dtype=np.uint8)
    faults_before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    per_page_us = []
    for start in range(0, size, chunk):
        began = time.perf_counter()
        pages[start : start + chunk : PAGE] = 1
        per_page_us.append((time.perf_counter() - began) / (min(chunk, size - start) / PAGE) * 1e6)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults_before
    del pages
    mapping.close()
    return per_page_us, faults


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gib", type=float, default=4.0, help="memory touched per pass")
    parser.add_argument("--chunk-mib", type=int, default=256)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--pause", type=float, default=0.0, help="seconds between passes")
    options = parser.parse_args(argv)
    from bench_reference import machine_header

    size, chunk = int(options.gib * 2**30) // PAGE * PAGE, options.chunk_mib * 2**20
    print(machine_header(), flush=True)
    for number in range(1, options.passes + 1):
        if number > 1:
            time.sleep(options.pause)
        per_page_us, faults = touch_pass(size, chunk)
        fastest = min(per_page_us)
        slow = sum(us > 2 * fastest for us in per_page_us)
        print(
            f"pass {number}: {' '.join(f'{us:.1f}' for us in per_page_us)} us/page; "
            f"{faults} faults for {size // PAGE} pages; {slow} of {len(per_page_us)} chunks over twice "
            f"the fastest ({fastest:.1f} us)",
            flush=True,
        )


if __name__ == "__main__":
    main()
