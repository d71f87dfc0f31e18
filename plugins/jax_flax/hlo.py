"""What XLA compiled: the element types a compiled program's convolutions and matrix products
multiply, read from its optimised HLO text (``jax.jit(f).lower(...).compile().as_text()``).

The program asks for bf16; the compiler decides. XLA's CPU backend (the PyPI jaxlib 0.10, built
without oneDNN) rewrites every bf16 convolution and dot into converts to f32 and an f32
operation, whatever the CPU's bf16 units (seen on an Intel Xeon with AMX); a GPU's or a TPU's
backend may keep bf16 (not seen here: no accelerator was at hand). Only the compiled HLO says
which happened. No JAX is imported here, so the host's tests can read HLO text too.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable

#: an instruction's definition: ``%name = f32[8,56,56,64]{3,2,1,0} op(`` or, for a tuple-valued
#: one (a cuDNN call), ``%name = (bf16[...]{...}, u8[0]{0}) custom-call(``
_DEFINITION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*\(?([a-z]+[0-9]*)\[")
#: what multiplies: XLA's own instructions, and the cuDNN calls its GPU backend makes of convolutions
_CONVOLUTION = re.compile(r"\s(?:convolution|custom-call)\(([^)]*)\)")
_DOT = re.compile(r"\sdot\(([^)]*)\)")
#: one operand of a call: ``%name``, or ``f32[8,56,56,64]{3,2,1,0} %name`` where HLO prints its type
_OPERAND = re.compile(r"(?:([a-z]+[0-9]*)\[[^\]]*\](?:\{[^}]*\})?\s+)?%([\w.\-]+)")
_CUDNN_CONVOLUTION = 'custom_call_target="__cudnn$conv'


def convolution_operands(hlo_text: str) -> dict[str, int]:
    """How many convolutions of the compiled program multiply each operand type ("f32", "bf16",
    or e.g. "bf16,f32" where the two differ), keyed by HLO's type names."""
    return _operand_types(hlo_text, _CONVOLUTION, lambda line: " convolution(" in line or _CUDNN_CONVOLUTION in line)


def dot_operands(hlo_text: str) -> dict[str, int]:
    """How many matrix products (``dot``) of the compiled program multiply each operand type."""
    return _operand_types(hlo_text, _DOT, lambda line: " dot(" in line)


def _operand_types(hlo_text: str, call: re.Pattern, is_operation: Callable[[str], bool]) -> dict[str, int]:
    """The lhs/rhs operand types of every line ``is_operation`` picks, counted; ``call`` catches
    the line's operand list."""
    lines = hlo_text.splitlines()
    # this XLA prints an operand by name only: its type is where it is defined (names are unique in
    # an HLO module, across its computations)
    types = {found.group(1): found.group(2) for found in map(_DEFINITION.match, lines) if found}
    counts: Counter[str] = Counter()
    for line in lines:
        operands = call.search(line) if is_operation(line) else None
        if operands:
            lhs_rhs = list(_OPERAND.finditer(operands.group(1)))[:2]  # a cuDNN call may take more (a bias)
            counts[
                ",".join(
                    sorted({typed or types.get(name, "unknown") for typed, name in (operand.groups() for operand in lhs_rhs)})
                )
            ] += 1
    return dict(counts)


def computes_in(operands: dict[str, int], dtype: str) -> bool:
    """Whether any of the counted operations multiplies ``dtype`` operands."""
    return any(dtype in key.split(",") for key in operands)
