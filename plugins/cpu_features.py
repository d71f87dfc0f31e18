"""What this CPU runs natively: the one helper the built-in plugins share for it (from the flags
core reads, ``accelbench.environment.cpu_flags``; no framework is imported here)."""

from __future__ import annotations

import ctypes
import platform

#: either gives the CPU native bf16 dot products (AMD Zen 4, Intel Cooper Lake / Sapphire Rapids)
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


def bf16_emulation_warning(flags: frozenset[str]) -> str | None:
    """A warning for a bf16 run on a CPU without native bf16 (None when native, or flags unknown)."""
    if not flags or flags & NATIVE_BF16_FLAGS:
        return None
    return ("bf16 is emulated on this CPU (neither avx512_bf16 nor amx_bf16 in its flags): "
            "expect it several times slower than fp32; the figure measures the emulation")


# Linux's arch_prctl (x86-64): AMX's tile data is a CPU state the kernel hands out only on request
_SYS_ARCH_PRCTL = 158
_ARCH_GET_XCOMP_PERM = 0x1022
_ARCH_REQ_XCOMP_PERM = 0x1023
_XFEATURE_XTILEDATA = 18


def request_amx_tiles() -> bool:
    """Ask Linux (5.16 and later) for this process's AMX tile state; True once the kernel reports
    it permitted (read back, not assumed).

    A library that runs an AMX instruction without this permission dies of SIGILL. Recent oneDNN
    asks by itself; oneDNN 2.4, inside mxnet 1.9.1, does not. The permission covers the whole
    process, so it is asked before the library starts its threads.
    """
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall(ctypes.c_long(_SYS_ARCH_PRCTL), ctypes.c_long(_ARCH_REQ_XCOMP_PERM),
                 ctypes.c_long(_XFEATURE_XTILEDATA))
    permitted = ctypes.c_uint64(0)
    if libc.syscall(ctypes.c_long(_SYS_ARCH_PRCTL), ctypes.c_long(_ARCH_GET_XCOMP_PERM), ctypes.byref(permitted)):
        return False
    return bool(permitted.value >> _XFEATURE_XTILEDATA & 1)
