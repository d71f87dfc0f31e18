"""What this CPU runs natively: the one helper the built-in plugins share for it (from the flags
core reads, ``accelbench.environment.cpu_flags``, and the ceiling oneDNN is given in the
environment; no framework is imported here)."""

from __future__ import annotations

import ctypes
import os
import platform

#: either gives the CPU native bf16 dot products (AMD Zen 4, Intel Cooper Lake / Sapphire Rapids)
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


#: oneDNN's instruction-set ceilings that hold no bf16 dot product: under one of them oneDNN
#: computes bf16 in fp32 whatever the CPU has (AVX2_VNNI_2 converts bf16, it does not multiply it)
CEILINGS_WITHOUT_BF16 = frozenset({"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE",
                                   "AVX512_CORE_VNNI"})
#: where oneDNN reads its ceiling: 3.x (TensorFlow's, PyTorch's) ONEDNN_MAX_CPU_ISA before the older
#: name; 2.x (mxnet 1.9.1's) only DNNL_MAX_CPU_ISA
ONEDNN_CEILING_VARIABLES = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")


def onednn_ceiling(variables: tuple[str, ...] = ONEDNN_CEILING_VARIABLES) -> str | None:
    """The instruction-set ceiling this process gives oneDNN, as "VARIABLE=VALUE" (None: its default)."""
    for variable in variables:
        if os.environ.get(variable):
            return f"{variable}={os.environ[variable]}"
    return None


def bf16_emulation_warning(flags: frozenset[str], ceiling: str | None = None) -> str | None:
    """A warning for a bf16 run that has no native bf16: on a CPU without it, or under a oneDNN
    ceiling (``onednn_ceiling``) below it. None when native, or the flags are unknown."""
    if flags and not flags & NATIVE_BF16_FLAGS:
        return ("bf16 is emulated on this CPU (neither avx512_bf16 nor amx_bf16 in its flags): "
                "expect it several times slower than fp32; the figure measures the emulation")
    if ceiling and ceiling.partition("=")[2].upper() in CEILINGS_WITHOUT_BF16:
        return (f"bf16 is emulated: oneDNN's instruction-set ceiling {ceiling} holds no bf16 instructions, "
                "whatever this CPU has; the figure measures the emulation")
    return None


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
