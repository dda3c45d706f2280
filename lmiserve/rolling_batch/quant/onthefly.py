"""Plain weights quantized at load (``option.quantize`` fp8 or int8).

- :func:`to_fp8`: e4m3 with one fp32 scale per output channel, ``amax / 448`` (448 is e4m3's
  largest finite value), values saturated to +-448 before the cast (e4m3fn has no infinity).
- :func:`to_q8_0`: GGUF's Q8_0 blocks: per 32 input weights an fp16 scale ``d = amax / 127``
  and ``round(w / d)`` as int8, ``d`` as stored (in fp16; llama.cpp rounds by the fp32 ``d``).

Only the decoder layers' linear projections are quantized (q, k, v, o, gate, up, down); the
embeddings, norms and the LM head stay as they are.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import torch

from .weights import BLOCK, BLOCK_BYTES, BlockWeight, Fp8Weight

FP8_MAX = 448.0
PROJECTION = re.compile(r"(^|\.)layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj)\.weight$")
"""The names of the weights quantized at load."""


def to_fp8(weight: torch.Tensor) -> Fp8Weight:
    w = weight.float()
    amax = w.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    q = (w / scale.unsqueeze(1)).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return Fp8Weight(q, scale)


def to_q8_0(weight: torch.Tensor) -> BlockWeight:
    n, k = weight.shape
    if k % BLOCK:
        raise ValueError(f"int8 blocks need input features in multiples of {BLOCK}, got {k}")
    blocks = weight.float().reshape(n, k // BLOCK, BLOCK)
    d = (blocks.abs().amax(dim=-1, keepdim=True) / 127).to(torch.float16)
    inverse = torch.where(d > 0, 1.0 / d.float(), torch.zeros_like(d, dtype=torch.float32))
    q = (blocks * inverse).round().clamp(-127, 127).to(torch.int8)
    raw = torch.cat([d.view(torch.uint8), q.view(torch.uint8)], dim=-1)  # 2 scale bytes, 32 quants
    assert raw.shape[-1] == BLOCK_BYTES["q8_0"]
    return BlockWeight("q8_0", raw.reshape(n, -1).contiguous(), k)


def quantize_linear_weights(tensors: dict, fn: Callable[[torch.Tensor], object]) -> dict:
    """``tensors`` with each decoder layer's projection weight replaced by ``fn(weight)``."""
    return {
        name: fn(t) if PROJECTION.search(name) and isinstance(t, torch.Tensor) else t for name, t in tensors.items()
    }


ON_THE_FLY = {"fp8": to_fp8, "q8_0": to_q8_0}
"""By :attr:`~.schemes.CheckpointScheme.weights`."""
