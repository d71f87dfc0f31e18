"""MXNet 1.9.1's oneDNN (v2.4): the instruction set it may use (set before ``import_mxnet``
imports mxnet), and the kernel it then picks, read back from oneDNN itself. Imported only in the
worker (and in the probe process it starts).

oneDNN 2.4 keeps Intel AMX out of its default ceiling: on a CPU with AMX it runs bf16 on AVX-512
unless ``DNNL_MAX_CPU_ISA`` allows AMX, and it never asks Linux for the AMX tile state, so
allowing AMX alone dies of SIGILL at the first tile instruction. With both done, a bf16
ResNet-50 training step ran 2.3x as fast on a 2-core Sapphire Rapids-class Xeon (README,
"Headroom levers"); the work is the same (bf16 products, fp32 accumulation).
"""

from __future__ import annotations

import os
import sys

from accelbench.api import cpu_flags
from accelbench.plugins.shared.cpu_features import OnednnProbe, request_amx_tiles

#: the name oneDNN 2.4 reads its ISA ceiling from (ONEDNN_MAX_CPU_ISA came later and is ignored)
ISA_VARIABLE = "DNNL_MAX_CPU_ISA"
AMX_CEILING = "AVX512_CORE_AMX"
# numpy >= 1.24 removed these aliases; mxnet 1.9.1 uses them at import and at run time
REMOVED_NUMPY_ALIASES = {"bool": bool, "int": int, "float": float, "object": object, "str": str, "complex": complex}


def allow_amx() -> None:
    """Before mxnet is imported: on a CPU with AMX, get the tile state from the kernel and raise
    oneDNN's ceiling to AMX, unless the user set a ceiling of their own (theirs stands; the tile
    state is asked for all the same, so a ceiling of AVX512_CORE_AMX given by hand works too)."""
    if "amx_bf16" in cpu_flags() and request_amx_tiles():
        os.environ.setdefault(ISA_VARIABLE, AMX_CEILING)


def import_mxnet():
    """Import mxnet after restoring numpy's removed aliases (only those missing), with oneDNN
    allowed the CPU's AMX (``allow_amx``: it must precede the import)."""
    import numpy

    if "mxnet" not in sys.modules:  # check, prepare and the dataset code each call this; once is enough
        allow_amx()

    for name, value in REMOVED_NUMPY_ALIASES.items():
        if not hasattr(numpy, name):
            setattr(numpy, name, value)
    import mxnet

    return mxnet


def ceiling() -> str | None:
    """The ISA ceiling oneDNN was given; None: its default (AVX-512 with bf16, no AMX)."""
    return os.environ.get(ISA_VARIABLE) or None


def start_probe(precision: str, framework: str) -> OnednnProbe:
    """A probe process with this process's environment (the ceiling included) that runs one
    convolution at ``precision``; its ``read_back`` gives oneDNN's instruction set and the kernel.

    A probe, because libmxnet.so exports none of oneDNN's own functions and oneDNN reads its
    verbose switch once, at start: the worker cannot ask its own copy.
    """
    return OnednnProbe(__name__, (precision,), "DNNL_VERBOSE", framework)


def _run_one_convolution(precision: str) -> None:
    """The probe: one small convolution, bf16 through AMP as the training step runs it."""
    mx = import_mxnet()
    if precision == "bf16":
        from mxnet.contrib import amp

        amp.init(target_dtype="bfloat16")
    images, weights = mx.nd.ones((2, 32, 14, 14)), mx.nd.ones((32, 32, 3, 3))
    mx.nd.Convolution(images, weights, kernel=(3, 3), pad=(1, 1), num_filter=32, no_bias=True).wait_to_read()


if __name__ == "__main__":
    _run_one_convolution(sys.argv[1])
