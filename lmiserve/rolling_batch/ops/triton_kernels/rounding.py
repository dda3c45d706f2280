"""Casting to the activation dtype with round-to-nearest-even, also under the interpreter.

On a GPU ``x.to(tl.bfloat16)`` rounds to nearest even. Triton's CPU interpreter truncates
instead, which would make the kernels' tested rounding differ from what the GPU computes; there,
the rounding is done on the bits first so that the cast is exact.
"""

import os

import triton
import triton.language as tl

INTERPRETED = tl.constexpr(os.environ.get("TRITON_INTERPRET") == "1")


@triton.jit
def cast(x, dtype: tl.constexpr):
    if INTERPRETED and dtype == tl.bfloat16:
        bits = x.to(tl.float32).to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return bits.to(tl.float32, bitcast=True).to(dtype)
    else:
        return x.to(dtype)
