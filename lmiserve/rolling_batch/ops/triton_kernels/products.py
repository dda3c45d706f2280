"""Products of two tiles summed in fp32, the same sums for every output of a tile, on a GPU and
under Triton's interpreter.

On a GPU ``tl.dot`` runs on the matrix units: on the operands as they are where they are fp16 or
bf16 (``HALF_DOT``), else on their fp32 values with IEEE products (no TF32 rounding). Every output
of a tile is summed by the same instructions, wherever its row and column lie in the tile.

Triton's interpreter multiplies fp16 and bf16 matrices wrongly, so there the operands are
widened to fp32 (exactly: what the matrix units multiply), and it hands ``tl.dot`` to numpy's
``matmul``, that is to the machine's BLAS, whose order of a sum can depend on where the output
lies in its blocking: OpenBLAS's Haswell and Zen kernels (the ones an AMD EPYC gets) sum a row of
a 64-row tile in another order than the row six places on, so a row's bits would change with the
number of rows before it. Under the interpreter the product is therefore the products of each
pair summed along k by numpy, one order for every output of the tile, so a kernel whose rows do
not depend on the rows beside them keeps that on every machine.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .rounding import INTERPRETED


def half_dot(dtype: torch.dtype) -> bool:
    """``HALF_DOT`` for operands of ``dtype``: fp16 and bf16 on a GPU."""
    return dtype in (torch.float16, torch.bfloat16) and not INTERPRETED


@triton.jit
def fp32_dot(a, b, HALF_DOT: tl.constexpr):
    """``a @ b`` (``(M, K) x (K, N)``) summed in fp32: on the operands as they are where
    ``HALF_DOT``, else on their values in fp32."""
    if HALF_DOT:
        return tl.dot(a, b)
    elif INTERPRETED:
        return tl.sum(a.to(tl.float32)[:, :, None] * b.to(tl.float32)[None, :, :], axis=1)
    else:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
