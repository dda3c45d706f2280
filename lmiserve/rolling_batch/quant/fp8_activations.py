"""FP8 W8A8 as the engine defines it: activations quantized per token to e4m3 at run time
(``scale = max(amax / 448, 1e-12)``, values clamped to +-448), the product of the two e4m3
matrices summed in fp32 and scaled by both scales. The reference ops multiply this way; the CUDA
kernels (``ops/triton_kernels/fp8_matmul.py``, ``torch._scaled_mm``) must match it."""

from __future__ import annotations

import torch

FP8_MAX = 448.0
"""The largest finite e4m3 value."""
MIN_SCALE = 1e-12
"""The smallest activation scale (a row of zeros quantizes to zeros)."""


def quantize_per_token_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q, scale)``: ``x`` ``(M, K)`` as e4m3 ``(M, K)`` and fp32 ``(M,)``, ``x ~ q * scale``."""
    xf = x.float()
    amax = xf.abs().amax(dim=-1)
    # divided by a tensor: torch on CUDA multiplies by the reciprocal of a Python number instead,
    # which can miss the correctly rounded quotient by one bit
    scale = torch.clamp(amax / torch.full_like(amax, FP8_MAX), min=MIN_SCALE)
    q = torch.clamp(xf / scale[:, None], -FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, scale


def w8a8_reference(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None):
    """The W8A8 product in torch, fp32 throughout, rounded to ``x``'s dtype at the end; ``x``
    ``(..., K)``, ``weight`` e4m3 ``(N, K)``, ``scale`` fp32 ``(N,)``."""
    rows = x.reshape(-1, x.shape[-1])
    q, xs = quantize_per_token_reference(rows)
    y = (q.float() @ weight.float().t()) * xs[:, None] * scale.float()[None, :]
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype).reshape(*x.shape[:-1], weight.shape[0])
