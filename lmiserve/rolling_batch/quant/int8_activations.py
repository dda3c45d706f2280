"""GGUF blocks against activations quantized to int8 (``option.quantize_activations=int8``), as
the engine defines it; the CPU kernel (``ops/csrc/quant_linear_int8.cpp``) computes exactly these
integers and sums their scaled products in fp32.

Each activation row is quantized per block of 32 inputs, as llama.cpp quantizes its activations
to Q8 blocks: ``d = max|x| * (1/127)`` in fp32, ``q = round(x * (1/d))`` to nearest even (0 where
``d`` is 0), so ``x ~ d q``. A block's product is then an integer sum times scales: Q8_0
``d_w d_x sum(q_w q_x)``; Q4_0 and Q4_1 (``w = d_w q_w + m_w``, ``m_w = -8 d_w`` for Q4_0)
``d_w d_x sum(q_w q_x) + m_w d_x sum(q_x)``. Results differ from the dequantized model's by the
activations' rounding; greedy text may differ, which is why it is opt-in.
"""

from __future__ import annotations

import torch

from .loading import QuantizationError
from .weights import BLOCK, BlockWeight

INV_127 = 1.0 / 127.0


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q, d)``: ``x`` ``(M, K)`` as quants ``(M, K / 32, 32)`` (float, integral) and fp32 scales
    ``(M, K / 32)``."""
    rows = x.float().reshape(x.shape[0], -1, BLOCK)
    d = rows.abs().amax(dim=-1) * INV_127
    inverse = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
    q = torch.round(rows * inverse[..., None]).clamp(-127, 127)
    return q, d


def linear_int8_activations(
    x: torch.Tensor, weight: BlockWeight, bias: torch.Tensor | None = None, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """``x W^T (+ bias)`` with ``x`` ``(..., K)`` quantized as above; the integer sums exact, the
    scaled sums in ``dtype`` (float64 for a reference the kernel's fp32 sums are compared with)."""
    rows = x.reshape(-1, x.shape[-1])
    qx, dx = quantize_rows(rows)
    qw, dw, mw = weight.parts()
    dw, mw = dw[..., 0], mw[..., 0]
    sums = torch.einsum("mbi,nbi->mnb", qx.double(), qw.double())  # integers, exact in float64
    y = (sums.to(dtype) * (dw[None] * dx[:, None]).to(dtype)).sum(-1)
    y = y + ((dx * qx.sum(-1)).to(dtype) @ mw.to(dtype).t())
    if bias is not None:
        y = y + bias.to(dtype)
    return y.to(x.dtype if dtype != torch.float64 else dtype).reshape(*x.shape[:-1], weight.shape[0])


def with_int8_activations(tensors: dict, quantization: str) -> str:
    """What was loaded, in words, with int8 activations; a QuantizationError where no linear
    layer is in blocks (nothing would run with them)."""
    if not any(isinstance(t, BlockWeight) for t in tensors.values()):
        raise QuantizationError(
            "option.quantize_activations=int8 multiplies weights in blocks: a GGUF file's (Q4_0, Q4_1, Q8_0), "
            f"or any model's with option.quantize=int8; this model's linear layers are not ({quantization})"
        )
    return f"{quantization}, int8 activations"
