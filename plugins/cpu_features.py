"""What this CPU runs natively: the one helper the built-in plugins share for it (from the flags
core reads, ``accelbench.environment.cpu_flags``; no framework is imported here)."""

from __future__ import annotations

#: either gives the CPU native bf16 dot products (AMD Zen 4, Intel Cooper Lake / Sapphire Rapids)
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


def bf16_emulation_warning(flags: frozenset[str]) -> str | None:
    """A warning for a bf16 run on a CPU without native bf16 (None when native, or flags unknown)."""
    if not flags or flags & NATIVE_BF16_FLAGS:
        return None
    return ("bf16 is emulated on this CPU (neither avx512_bf16 nor amx_bf16 in its flags): "
            "expect it several times slower than fp32; the figure measures the emulation")
