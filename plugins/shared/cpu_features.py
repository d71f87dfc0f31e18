"""What this CPU runs natively: the one helper the built-in plugins share for it (from the flags
core reads, ``accelbench.environments.machine.cpu_flags``, the ceiling oneDNN is given in the environment,
and what oneDNN's verbose log says it ran; no framework is imported here)."""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

#: either gives the CPU native bf16 dot products (AMD Zen 4, Intel Cooper Lake / Sapphire Rapids)
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


#: oneDNN's instruction-set ceilings that hold no bf16 dot product: under one of them oneDNN
#: computes bf16 in fp32 whatever the CPU has (AVX2_VNNI_2 converts bf16, it does not multiply it)
CEILINGS_WITHOUT_BF16 = frozenset({"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI"})
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
        return (
            "bf16 is emulated on this CPU (neither avx512_bf16 nor amx_bf16 in its flags): "
            "expect it several times slower than fp32; the figure measures the emulation"
        )
    if ceiling and ceiling.partition("=")[2].upper() in CEILINGS_WITHOUT_BF16:
        return (
            f"bf16 is emulated: oneDNN's instruction-set ceiling {ceiling} holds no bf16 instructions, "
            "whatever this CPU has; the figure measures the emulation"
        )
    return None


# oneDNN 2.x writes "dnnl_verbose,info,..." and "dnnl_verbose,exec,cpu,convolution,<kernel>,...";
# 3.x "onednn_verbose,v1,info,..." and "onednn_verbose,v1,primitive,exec,cpu,convolution,<kernel>,..."
_VERBOSE_ISA = re.compile(r"(?:dnnl|onednn)_verbose,(?:v\d+,)?info,cpu,isa:(.+)")
_VERBOSE_CONVOLUTION = re.compile(r"(?:dnnl|onednn)_verbose,(?:v\d+,)?(?:primitive,)?exec,cpu,convolution,([^,]+),")


def onednn_unread() -> dict[str, str | None]:
    """What a record says where oneDNN was not asked (a GPU, oneDNN off): nothing read back, and
    no probe."""
    return {"onednn_isa": None, "onednn_convolution": None, "onednn_probe": None}


def onednn_verbose_read_back(log: str) -> dict[str, str | None]:
    """The instruction set oneDNN says it runs on and the kernel of the first convolution in its
    verbose log (None for either it did not print)."""
    isa, convolution = _VERBOSE_ISA.search(log), _VERBOSE_CONVOLUTION.search(log)
    return {
        "onednn_isa": isa.group(1).strip() if isa else None,
        "onednn_convolution": convolution.group(1) if convolution else None,
    }


class CapturedOutput:
    text = ""


@contextlib.contextmanager
def c_stdout_captured() -> Iterator[CapturedOutput]:
    """This process's file descriptor 1 caught in a file while the block runs: what a C++ library
    prints (oneDNN's verbose log) passes by Python's sys.stdout. ``.text`` holds it after the block."""
    captured = CapturedOutput()
    sys.stdout.flush()
    saved = os.dup(1)
    with tempfile.TemporaryFile(mode="w+") as sink:
        os.dup2(sink.fileno(), 1)
        try:
            yield captured
        finally:
            os.dup2(saved, 1)
            os.close(saved)
            sink.seek(0)
            captured.text = sink.read()


#: what decides the kernel oneDNN picks besides the CPU and its own build: the environment's
#: variables for oneDNN (its ceiling and switches, under each of its names), for the frameworks'
#: use of it, and for OpenMP, which runs its threads
PROBE_ENVIRONMENT_PREFIXES = ("ONEDNN_", "DNNL_", "MKLDNN_", "TF_", "MXNET_", "OMP_", "KMP_")
#: of those, what the key leaves out: the probe's own verbose switch, which the probe sets whatever
#: the worker has, and TensorFlow's cluster description (each multi-worker job's own ports), which
#: says where a worker is, not how it computes: in the key it would keep a probe for every job
_NOT_KEYED = ("ONEDNN_VERBOSE", "DNNL_VERBOSE", "MKLDNN_VERBOSE", "TF_CONFIG")


class OnednnProbe:
    """oneDNN's verbose log from a probe process, ``python -m module *args``, that runs one small
    convolution with this process's environment and the verbose switch on: for a framework whose
    library exports none of oneDNN's functions (TensorFlow's, mxnet's), where oneDNN reads that
    switch once, at its start, and would then log every primitive of the run. Started when made,
    so it runs while the worker builds its model; ``read_back`` waits for it.

    A probe that read a kernel back is kept in the user's cache (``probe_key``: the CPU's model
    and flags, the kernel, which grants AMX, the interpreter, ``framework``, the probe's arguments
    and the environment's oneDNN, framework and OpenMP variables), and a worker for which all of
    them are the same reads it from there instead of starting a process that imports the
    framework a second time (seconds of a core, during the worker's start-up). The read-back's
    ``onednn_probe`` says which it was. A probe that read nothing back is not kept."""

    timeout_s = 120

    def __init__(self, module: str, args: tuple[str, ...], verbose_variable: str, framework: str):
        """``framework``: the framework's ``framework_identity``."""
        self.key = probe_key(module, args, framework)
        self.result: dict[str, str | None] | None = _kept_read_back(self.key)
        self.process = None
        if self.result is None:
            self.process = subprocess.Popen(
                [sys.executable, "-m", module, *args],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env={**os.environ, verbose_variable: "1"},
            )

    def read_back(self) -> dict[str, str | None]:
        """``onednn_verbose_read_back`` of the probe's log (None for what it did not print: a
        build without the switch, a probe that failed or ran past ``timeout_s``), and
        ``onednn_probe``: which probe process it came from."""
        if self.result is None:
            assert self.process is not None
            try:
                log, _ = self.process.communicate(timeout=self.timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                log = ""
                self.process.communicate()
            read = onednn_verbose_read_back(log)
            if read["onednn_convolution"]:
                _keep_read_back(self.key, read)
            self.result = {**read, "onednn_probe": "a probe process of this run"}
        return self.result


def framework_identity(framework: object) -> str:
    """The imported framework as a probe's key names it: its name and version, and where its
    package lies and when that was written, so a reinstall of another build under the same version
    (another oneDNN inside) is another key."""
    path = str(getattr(framework, "__file__", "") or "")
    try:
        written = os.stat(path).st_mtime_ns
    except OSError:
        written = 0
    return f"{getattr(framework, '__name__', '?')} {getattr(framework, '__version__', '?')} at {path} ({written})"


def probe_key(module: str, args: tuple[str, ...], framework: str) -> dict[str, object]:
    """Everything that decides what a probe reads back: the same key, the same kernel."""
    from accelbench.api import cpu_flags, cpu_model

    return {
        "probe": [module, *args],
        "framework": framework,
        "python": sys.executable,
        "cpu": cpu_model(),
        "cpu_flags": sorted(cpu_flags()),
        "kernel": platform.release(),
        "environment": {
            name: value
            for name, value in sorted(os.environ.items())
            if name.startswith(PROBE_ENVIRONMENT_PREFIXES) and name not in _NOT_KEYED
        },
    }


def _kept_path(key: dict[str, object]) -> Path:
    from accelbench.api import cache_dir

    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir("onednn-probes", f"{digest}.json")


def _kept_read_back(key: dict[str, object]) -> dict[str, str | None] | None:
    """The read-back kept for this key, as a run's read-back; None where none is (or it is unreadable)."""
    try:
        kept = json.loads(_kept_path(key).read_text())
        if kept["key"] != key:  # a digest's collision, or a file from elsewhere
            return None
        read = {name: kept["read_back"][name] for name in ("onednn_isa", "onednn_convolution")}
        when = kept["probed_utc"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    source = f"a probe process of {when}, kept in the cache for the same CPU, kernel, interpreter, framework and environment"
    return {**read, "onednn_probe": source}


def _keep_read_back(key: dict[str, object], read: dict[str, str | None]) -> None:
    """Kept whole or not at all (written beside, then renamed): two workers of one job may both keep one."""
    path, partial = _kept_path(key), None
    kept = {"key": key, "read_back": read, "probed_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".partial", delete=False) as partial:
            json.dump(kept, partial)
        os.replace(partial.name, path)
    except OSError:  # a cache that cannot be written costs the next worker a probe, nothing more
        if partial is not None:
            Path(partial.name).unlink(missing_ok=True)  # no half-written file left beside the kept ones


def bf16_emulation_from_onednn(
    framework: str,
    read_back: dict[str, str | None],
    flags: frozenset[str],
    ceiling_variables: tuple[str, ...] = ONEDNN_CEILING_VARIABLES,
) -> str | None:
    """A warning for a bf16 run from the kernel oneDNN ran a bf16 convolution with (``read_back``:
    ``onednn_verbose_read_back``): its name ends in the instruction set it runs ("brg_conv_fwd:
    avx512_core_bf16", "jit_bf16:avx512_core"), emulated where that set holds no bf16 dot product.
    Where oneDNN ran none, or names a set this cannot tell, from the CPU flags and the ceiling."""
    kernel = read_back.get("onednn_convolution") or ""
    kernel_isa = kernel.rpartition(":")[2].upper() if ":" in kernel else ""
    if kernel_isa in CEILINGS_WITHOUT_BF16:
        return (
            f"bf16 is emulated: {framework}'s oneDNN ran its bf16 convolution with {kernel!r} on "
            f"{read_back.get('onednn_isa')!r} (read back from oneDNN), without bf16 instructions; "
            "the figure measures the emulation"
        )
    if "BF16" in kernel_isa or "AMX" in kernel_isa:
        return None
    return bf16_emulation_warning(flags, onednn_ceiling(ceiling_variables))


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
    libc.syscall(ctypes.c_long(_SYS_ARCH_PRCTL), ctypes.c_long(_ARCH_REQ_XCOMP_PERM), ctypes.c_long(_XFEATURE_XTILEDATA))
    permitted = ctypes.c_uint64(0)
    if libc.syscall(ctypes.c_long(_SYS_ARCH_PRCTL), ctypes.c_long(_ARCH_GET_XCOMP_PERM), ctypes.byref(permitted)):
        return False
    return bool(permitted.value >> _XFEATURE_XTILEDATA & 1)
