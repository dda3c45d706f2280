"""Weights quantized at load into GGUF's Q8_0 blocks (``option.quantize=int8`` on CPUs).

Q8_0 as ggml defines it: per block of 32 weights, ``d = max|w| / 127`` (stored as fp16) and
``q = round(w / d)`` rounded half away from zero, computed with the fp32 ``d``. The CPU kernel
(``ops/csrc/quant_linear.cpp``) then reads 8.5 bits a weight instead of 16 or 32.
"""

from __future__ import annotations

import torch

from .weights import BLOCK, BlockWeight


def quantize_q8_0(weight: torch.Tensor) -> BlockWeight:
    """``weight`` (out, in), ``in`` a multiple of 32, as Q8_0 blocks."""
    n, k = weight.shape
    if k % BLOCK:
        raise ValueError(f"int8 blocks need the input features to be a multiple of {BLOCK}, not {k}")
    w = weight.detach().float().reshape(n, k // BLOCK, BLOCK)
    d = w.abs().amax(dim=-1, keepdim=True) / 127
    inverse = torch.where(d == 0, torch.zeros_like(d), 1 / d)
    scaled = w * inverse
    q = (scaled.sign() * (scaled.abs() + 0.5).floor()).to(torch.int8)
    raw = torch.cat([d.to(torch.float16).view(torch.uint8), q.view(torch.uint8)], dim=-1)
    return BlockWeight("q8_0", raw.reshape(n, -1).contiguous(), k)
