"""A private network namespace whose only interface is loopback, for a local multi-worker run.

Some engines listen on every interface whatever address they are given (one framework's gRPC
server hard-codes ``0.0.0.0``, another's rendezvous store binds all interfaces), and none of them
authenticates. Inside a namespace that holds nothing but loopback, what they open cannot be
reached from another machine, whatever the engine does. Every worker and service of the run joins
one namespace, so they still reach each other on 127.0.0.1; the host talks to them over pipes.

Linux only: it needs root or unprivileged user namespaces. Where the kernel refuses, the run goes
on in the host's namespace and its record says so (``distributed.network``).

``python -m accelbench.execution.netns hold`` is the process that owns the namespace;
``python -m accelbench.execution.netns enter PID -- COMMAND...`` joins PID's namespace and executes COMMAND
(a fresh single-threaded process, as ``setns`` into a user namespace requires).
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import socket
import struct
import subprocess
import sys
from dataclasses import dataclass

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
HOLDER_START_TIMEOUT_S = 10

ISOLATED = "loopback only (a private network namespace)"


@dataclass
class LoopbackNamespace:
    """A running holder process; its namespace lives as long as it does."""

    holder: subprocess.Popen[str]
    #: whether the namespace has its own user namespace (not root): joining enters it first
    with_user_namespace: bool

    def launcher(self) -> list[str]:
        """The command prefix that runs a command inside this namespace."""
        user = ["--user"] if self.with_user_namespace else []
        return [sys.executable, "-m", "accelbench.execution.netns", "enter", str(self.holder.pid), *user, "--"]

    def close(self) -> None:
        if self.holder.poll() is None and self.holder.stdin is not None:
            self.holder.stdin.close()  # the holder exits when its stdin ends
            try:
                self.holder.wait(5)
            except subprocess.TimeoutExpired:
                self.holder.kill()
                self.holder.wait()


def start() -> tuple[LoopbackNamespace | None, str]:
    """A loopback-only namespace and ``ISOLATED``, or None and why the kernel refused one."""
    if not sys.platform.startswith("linux"):
        return None, f"the host's network (private network namespaces need Linux, this is {sys.platform})"
    holder = subprocess.Popen(
        [sys.executable, "-m", "accelbench.execution.netns", "hold"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        line = _read_line(holder)
    except TimeoutError:
        line = "error: the namespace holder did not answer"
    if line.startswith("ok"):
        return LoopbackNamespace(holder, with_user_namespace=line.strip() == "ok user"), ISOLATED
    _stop(holder)
    return None, f"the host's network (no private network namespace here: {line.removeprefix('error: ').strip()})"


def _read_line(holder: subprocess.Popen[str]) -> str:
    import selectors

    assert holder.stdout is not None, "the holder is started with stdout=PIPE"
    with selectors.DefaultSelector() as selector:
        selector.register(holder.stdout, selectors.EVENT_READ)
        if not selector.select(HOLDER_START_TIMEOUT_S):
            raise TimeoutError
    return holder.stdout.readline() or f"error: the namespace holder exited with code {holder.wait()}"


def _stop(holder: subprocess.Popen[str]) -> None:
    if holder.poll() is None:
        holder.kill()
    holder.wait()


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        raise OSError(ctypes.get_errno(), f"{what}: {os.strerror(ctypes.get_errno())}")


def hold() -> None:
    """Make the namespace, bring loopback up, say ``ok``, then wait until stdin closes."""
    libc = _libc()
    as_root = os.geteuid() == 0
    uid, gid = os.geteuid(), os.getegid()
    try:
        _check(libc.unshare(CLONE_NEWNET | (0 if as_root else CLONE_NEWUSER)), "unshare")
        if not as_root:  # the same ids inside, so files the workers write are the user's
            _write("/proc/self/setgroups", "deny")
            _write("/proc/self/uid_map", f"{uid} {uid} 1")
            _write("/proc/self/gid_map", f"{gid} {gid} 1")
        _loopback_up()
    except OSError as exc:
        print(f"error: {exc.strerror or exc}", flush=True)
        return
    print("ok" if as_root else "ok user", flush=True)
    sys.stdin.read()


def _write(path: str, text: str) -> None:
    with open(path, "w") as handle:
        handle.write(text)


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH22x", fcntl.ioctl(sock, SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | IFF_UP))


def enter(pid: int, with_user_namespace: bool, command: list[str]) -> None:
    """Join ``pid``'s (user and) network namespace, then become ``command``."""
    libc = _libc()
    kinds = [("user", CLONE_NEWUSER)] if with_user_namespace else []
    for kind, flag in kinds + [("net", CLONE_NEWNET)]:
        fd = os.open(f"/proc/{pid}/ns/{kind}", os.O_RDONLY)
        try:
            _check(libc.setns(fd, flag), f"setns {kind}")
        finally:
            os.close(fd)
    os.execv(command[0], command)


def main(argv: list[str]) -> None:
    if argv[:1] == ["hold"]:
        hold()
    elif argv[:1] == ["enter"]:
        split = argv.index("--")
        enter(int(argv[1]), "--user" in argv[2:split], argv[split + 1 :])
    else:
        sys.exit("usage: python -m accelbench.execution.netns hold | enter PID [--user] -- COMMAND...")


if __name__ == "__main__":
    main(sys.argv[1:])
