"""accelbench peak's fp32 product on a CPU: the faster of the two libraries PyTorch multiplies
matrices with there (worker side; PyTorch is passed in, not imported).

``a @ b`` in fp32 goes to the BLAS PyTorch was built with (MKL in PyPI's wheels), while its
convolutions and its bf16 products go to oneDNN. MKL picks its code path by CPU vendor: on an AMD
CPU it runs its generic path ("Intel(R) Architecture processors" in MKL_VERBOSE, not AVX-512),
which on a Zen 5 VM with full-width AVX-512 ran at less than half the rate of every other
framework's product (README, "Peak, measured here"). A peak is the best the framework attains on
the machine, so both are timed and the faster becomes the peak's product; the record names it.
"""

from __future__ import annotations

import time
from typing import Callable

#: timed calls per library after its warm-up call; the best is kept, as for the peak itself
PROBE_CALLS = 2


def products(torch, left, right) -> dict[str, Callable[[], object]]:
    """Library name -> a product of ``left`` and ``right`` through it: the dense ``@`` (the BLAS
    PyTorch was built with, named from its build) and, where PyTorch has oneDNN, oneDNN's inner
    product (``linear(x, W) = x @ W^T``, so W is ``right`` transposed, made once here)."""
    blas = "mkl" if torch.backends.mkl.is_available() else "blas"
    found = {blas: lambda: left @ right}
    if torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled:
        x, weight = left.to_mkldnn(), right.t().contiguous().to_mkldnn()
        found["onednn"] = lambda: torch._C._nn.mkldnn_linear(x, weight, None)
    return found


def fastest(candidates: dict[str, Callable[[], object]], calls: int = PROBE_CALLS) -> tuple[str, dict[str, float]]:
    """The name of the fastest product, and each one's best seconds per call (after one call that
    warms its caches and JIT kernels up). CPU products return when done: no sync is needed."""
    seconds: dict[str, float] = {}
    for name, product in candidates.items():
        product()
        seconds[name] = min(_seconds(product) for _ in range(calls))
    return min(seconds, key=lambda name: seconds[name]), seconds


def _seconds(product: Callable[[], object]) -> float:
    start = time.perf_counter()
    product()
    return time.perf_counter() - start
