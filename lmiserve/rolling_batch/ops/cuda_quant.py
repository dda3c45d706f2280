"""Quantized linear layers on CUDA (:class:`.cuda.CudaOps`): which kernel runs which layout.

- :class:`~..quant.weights.Int4Weight` (AWQ, GPTQ): :mod:`.triton_kernels.int4_matmul`, the
  weights dequantized tile by tile in the kernel; decode steps split the inner dimension.
- :class:`~..quant.weights.Fp8Weight`: :mod:`.triton_kernels.fp8_matmul`. W8A8 (activations
  quantized per token) on GPUs of compute capability 8.9 and up, and under the interpreter (so
  the tests run the path those GPUs take, ``_scaled_mm`` aside): ``torch._scaled_mm`` for bf16
  activations with ``K`` and ``N`` multiples of 16, else the Triton kernel. Below 8.9 (no fp8
  instructions): W8A16, the weights dequantized in the kernel and the activations as they are.
- :class:`~..quant.weights.BlockWeight` (GGUF): dequantized once to the model's dtype (at
  prepare when the ops know it, else at the layer's first product) and run as a dense weight.

Deterministic mode (``invariant=True``): the int4 and fp8 kernels with one fixed tiling, no
split of the inner dimension and never ``_scaled_mm``, so a row's bits do not depend on the
other rows; dense weights through :mod:`.triton_kernels.invariant_matmul`.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

from ..quant.weights import BlockWeight, Fp8Weight, Int4Weight, QuantizedWeight
from .interface import LinearWeight
from .reference import quantized_linear
from .triton_kernels.rounding import INTERPRETED

log = logging.getLogger("lmiserve.ops")
_logged = False


def fp8_activations(x: torch.Tensor) -> bool:
    """Whether FP8 weights take W8A8 (activations quantized too) for ``x``: under the interpreter,
    and on GPUs of compute capability 8.9 and up."""
    if INTERPRETED or not x.is_cuda:
        return True
    return torch.cuda.get_device_capability(x.device) >= (8, 9)


def _dense(weight: BlockWeight, dtype: torch.dtype) -> torch.Tensor:
    global _logged
    if not _logged:
        log.info("GGUF blocks dequantized on CUDA")
        _logged = True
    return weight.dequantize(dtype).contiguous()


def prepare(weight: QuantizedWeight, bias: torch.Tensor | None, dtype: torch.dtype | None) -> LinearWeight:
    """The ops' weight: GGUF blocks dense in ``dtype`` where it is known, the rest as stored."""
    if isinstance(weight, BlockWeight) and dtype is not None:
        return LinearWeight(_dense(weight, dtype), bias)
    return quantized_linear(weight, bias)


def linear(kernels, x: torch.Tensor, w: LinearWeight, invariant: bool = False) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """``x @ W.T + bias`` for a prepared weight, quantized or not."""
    q = w.quant
    if isinstance(q, BlockWeight):  # dense from now on (the first call is the warm-up's)
        w.weight, w.quant = _dense(q, x.dtype), None
        q = None
    if q is None:
        if invariant:
            return kernels.invariant_linear(x, w.weight, w.bias)
        return F.linear(x, w.weight, w.bias)
    if isinstance(q, Int4Weight):
        return kernels.int4_linear(x, q.qweight, q.scales, q.zeros, q.group_size, q.g_idx, w.bias, invariant)
    if isinstance(q, Fp8Weight):
        a8 = fp8_activations(x)
        scaled_mm = a8 and not invariant and kernels.scaled_mm_takes(x, q.weight)
        return kernels.fp8_linear(x, q.weight, q.scale, w.bias, a8, invariant, scaled_mm)
    raise TypeError(f"no CUDA kernel for {type(q).__name__}")
