"""Exclusive locks between processes on one machine, held on a folder, so that no lock file is
left behind: a results file's writers lock the folder it is in (two runs given one ``-o``), and
whatever is made on first use in the user's cache (a dataset, a worker environment, the measured
peaks) is made under a lock on its cache folder, so that two processes that need it at once
make it once (the second waits, then finds it made).

``fcntl.flock`` on the folder's own descriptor: the kernel drops the lock when the holder exits
however it exits (SIGKILL included), so a crashed holder never leaves the folder locked, and
nothing is written into the folder to hold it (the user's folder stays as the run left it).
"""

from __future__ import annotations

import fcntl
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

#: how often a bounded wait tries the lock again
POLL_S = 0.05


@contextmanager
def folder_lock(folder: Path, timeout_s: float | None = None, on_wait: Callable[[], None] | None = None) -> Iterator[None]:
    """Hold an exclusive lock on ``folder`` (made if missing). Wait for it as long as it takes, or
    up to ``timeout_s`` (TimeoutError); ``on_wait`` is called once if another process holds it."""
    folder.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        _acquire(descriptor, folder, timeout_s, on_wait)
        try:
            yield
        finally:
            fcntl.flock(descriptor, fcntl.LOCK_UN)
    finally:
        os.close(descriptor)


def _acquire(descriptor: int, folder: Path, timeout_s: float | None, on_wait: Callable[[], None] | None) -> None:
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return
    except BlockingIOError:
        if on_wait:
            on_wait()
    if timeout_s is None:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        return
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"another process held the lock on {folder} for {timeout_s:.0f} s") from None
            time.sleep(POLL_S)
