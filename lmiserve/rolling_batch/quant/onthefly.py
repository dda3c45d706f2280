"""Plain weights quantized at load (``option.quantize`` fp8 or int8).

- :func:`to_fp8`: e4m3 with one fp32 scale per output channel, ``amax / 448`` (448 is e4m3's
  largest finite value), values saturated to +-448 before the cast (e4m3fn has no infinity).
- :func:`~.blocks.quantize_q8_0`: GGUF's Q8_0 blocks, as llama.cpp quantizes them.

Only the decoder layers' linear projections are quantized (q, k, v, o, gate, up, down, and the
fused qkv and gate_up of Phi-3's checkpoints); the embeddings, norms and the LM head stay as they are.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import torch

from .blocks import quantize_q8_0
from .weights import Fp8Weight

FP8_MAX = 448.0
PROJECTION = re.compile(r"(^|\.)layers\.\d+\.(self_attn\.(qkv|[qkvo])_proj|mlp\.(gate_up|gate|up|down)_proj)\.weight$")
"""The names of the weights quantized at load."""


def to_fp8(weight: torch.Tensor) -> Fp8Weight:
    w = weight.float()
    amax = w.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    q = (w / scale.unsqueeze(1)).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return Fp8Weight(q, scale)


def quantize_linear_weights(tensors: dict, fn: Callable[[torch.Tensor], object]) -> dict:
    """``tensors`` with each decoder layer's projection weight replaced by ``fn(weight)``."""
    return {
        name: fn(t) if PROJECTION.search(name) and isinstance(t, torch.Tensor) else t for name, t in tensors.items()
    }


ON_THE_FLY = {"fp8": to_fp8, "q8_0": quantize_q8_0}
"""By :attr:`~.schemes.CheckpointScheme.weights`."""
