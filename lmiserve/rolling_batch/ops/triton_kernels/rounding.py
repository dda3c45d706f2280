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


@triton.jit
def to_e4m3(x):
    """fp32 ``x`` (within +-448) as e4m3, rounded to nearest even. The interpreter's conversion
    loses a rounding that carries into the next power of two (124.3 becomes 64), so there the
    value is first rounded onto the e4m3 grid in fp32 and then converted exactly."""
    if INTERPRETED:
        raw = x.to(tl.uint32, bitcast=True)
        bits = raw & 0x7FFFFFFF
        mag = bits.to(tl.float32, bitcast=True)
        normal = (bits + 0x7FFFF + ((bits >> 20) & 1)) & 0xFFF00000
        subnormal = ((mag + 16384.0) - 16384.0).to(tl.uint32, bitcast=True)  # a multiple of 2**-9
        bits = tl.where(mag < 0.015625, subnormal, normal)
        x = (bits | (raw & 0x80000000)).to(tl.float32, bitcast=True)  # the sign as it was (-0 too)
    return x.to(tl.float8e4nv)
