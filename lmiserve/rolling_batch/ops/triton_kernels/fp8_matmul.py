"""Linear layers with e4m3 weights and one fp32 scale per output channel
(:class:`~lmiserve.rolling_batch.quant.weights.Fp8Weight`).

- W8A8: each row of ``x`` is quantized to e4m3 with its own scale (:func:`quantize_per_token`:
  ``scale = max(amax(|x|) / 448, MIN_SCALE)``, ``q = clamp(x / scale, -448, 448)`` rounded to
  nearest even; :func:`quantize_per_token_reference` is the same in torch), then
  ``y = (q_x @ q_w.T) * scale_x[:, None] * scale_w[None, :] (+ bias)``, summed in fp32. The
  product runs in ``torch._scaled_mm`` (cuBLAS, GPUs of compute capability 8.9 and up, bf16
  activations, ``K`` and ``N`` multiples of 16) or in :func:`fp8_linear`'s kernel, which upcasts
  the e4m3 tiles exactly (to fp16 on the GPU) and accumulates in fp32.
- W8A16: the weight tiles dequantized in the kernel (``q_w * scale_w`` in fp32, rounded to
  ``x``'s dtype, as ``Fp8Weight.dequantize(x.dtype)``), ``x`` unquantized: for GPUs below 8.9,
  where Triton has no e4m3 type, so the weight is read as bytes and decoded in the kernel.

Division is correctly rounded in the kernels (``div_rn``), so a row's quants and scale are the
bits the torch reference gives. The kernels' configuration is a function of ``M`` alone (two
row tiles, :func:`fp8_config`); with ``invariant=True`` one configuration serves every ``M``
and a row's bits do not depend on the other rows (quantization is per row already).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ...quant.fp8_activations import FP8_MAX, MIN_SCALE, quantize_per_token_reference, w8a8_reference
from .matmul_tiles import as_rows, output_tile, store_tile, x_step
from .products import fp32_dot
from .rounding import INTERPRETED, cast, to_e4m3

__all__ = ["FP8_MAX", "MIN_SCALE", "fp8_linear", "quantize_per_token", "quantize_per_token_reference", "w8a8_reference"]

_FP8_MAX = tl.constexpr(FP8_MAX)
_MIN_SCALE = tl.constexpr(MIN_SCALE)
SMALL_ROWS = 16


@triton.jit
def _quantize_rows_kernel(x_ptr, q_ptr, s_ptr, K, stride_x, stride_q, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x
    amax = tl.zeros((BLOCK,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK):
        ks = k0 + tl.arange(0, BLOCK)
        amax = tl.maximum(amax, tl.abs(tl.load(x_row + ks, mask=ks < K, other=0.0).to(tl.float32)))
    scale = tl.maximum(tl.math.div_rn(tl.max(amax, axis=0), _FP8_MAX), _MIN_SCALE)
    for k0 in range(0, K, BLOCK):
        ks = k0 + tl.arange(0, BLOCK)
        x = tl.load(x_row + ks, mask=ks < K, other=0.0).to(tl.float32)
        q = tl.minimum(tl.maximum(tl.math.div_rn(x, scale), -_FP8_MAX), _FP8_MAX)
        tl.store(q_ptr + row * stride_q + ks, to_e4m3(q), mask=ks < K)
    tl.store(s_ptr + row, scale)


def quantize_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`quantize_per_token_reference` in one launch (a program a row)."""
    m, k = x.shape
    q = torch.empty((m, k), dtype=torch.float8_e4m3fn, device=x.device)
    scale = torch.empty((m,), dtype=torch.float32, device=x.device)
    if m:
        block = min(triton.next_power_of_2(k), 2048)
        _quantize_rows_kernel[(m,)](x, q, scale, k, x.stride(0), q.stride(0), BLOCK=block)
    return q, scale


@dataclass(frozen=True)
class Fp8Config:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3


def fp8_config(m: int, invariant: bool = False) -> Fp8Config:
    if invariant or m > SMALL_ROWS:
        return Fp8Config(64, 64, 64)
    return Fp8Config(16, 64, 128)


def fp8_variants(invariant: bool = False) -> list[tuple[int, Fp8Config]]:
    """Every configuration with a row count that reaches it (see :func:`.int4_matmul.int4_variants`)."""
    if invariant:
        return [(1, fp8_config(1, True))]
    return [(1, fp8_config(1)), (SMALL_ROWS + 1, fp8_config(SMALL_ROWS + 1))]


@triton.jit
def _e4m3_bits_to_f32(b):
    """e4m3 values from their bits (uint8): GPUs below compute capability 8.9 have no e4m3 type
    in Triton, so the W8A16 kernel reads the weight as bytes."""
    b = b.to(tl.int32)
    sign = (b & 0x80) << 24
    e = (b >> 3) & 0xF
    m = b & 0x7
    normal = (sign | ((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)
    subnormal = m.to(tl.float32) * 0.001953125  # m * 2**-9
    return tl.where(e == 0, tl.where(sign != 0, -subnormal, subnormal), normal)


@triton.jit(do_not_specialize=["M"])
def _fp8_matmul_kernel(
    x_ptr,
    xs_ptr,
    w_ptr,
    ws_ptr,
    bias_ptr,
    y_ptr,
    M,
    N,
    K,
    stride_x,
    stride_w,
    stride_y,
    A8: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    HALF_DOT: tl.constexpr,
):
    rows, cols, row_ok, col_ok, x_rows = output_tile(x_ptr, stride_x, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    w_cols = w_ptr + cols[None, :].to(tl.int64) * stride_w
    ws = tl.load(ws_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks, k_ok, x = x_step(x_rows, row_ok, k0, K, BLOCK_K)
        w = tl.load(w_cols + ks[:, None], mask=col_ok[None, :] & k_ok[:, None], other=0.0)
        if A8:  # e4m3 on both sides: every e4m3 value is exact in fp16, every product in fp32
            acc += fp32_dot(x.to(tl.float16), w.to(tl.float16), HALF_DOT)
        else:  # the weight dequantized to x's dtype, as Fp8Weight.dequantize(x.dtype)
            acc += fp32_dot(x, cast(_e4m3_bits_to_f32(w) * ws[None, :], x_ptr.dtype.element_ty), HALF_DOT)
    if A8:
        xs = tl.load(xs_ptr + rows, mask=row_ok, other=0.0)
        acc = acc * xs[:, None] * ws[None, :]
    store_tile(y_ptr, stride_y, acc, bias_ptr, rows, cols, row_ok, col_ok, HAS_BIAS)


def scaled_mm_takes(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether ``torch._scaled_mm`` can run this W8A8 product: a CUDA GPU of compute capability
    8.9 or more, bf16 activations (its row-wise scaling writes bf16), ``K`` and ``N`` multiples
    of 16."""
    return (
        x.is_cuda
        and x.dtype == torch.bfloat16
        and weight.shape[0] % 16 == 0
        and weight.shape[1] % 16 == 0
        and torch.cuda.get_device_capability(x.device) >= (8, 9)
    )


def fp8_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    activations: bool = True,
    invariant: bool = False,
    scaled_mm: bool = False,
) -> torch.Tensor:
    """``x @ W.T + bias`` for ``x`` ``(..., K)``, ``W = weight * scale[:, None]`` (e4m3 ``(N, K)``,
    fp32 ``(N,)``), in ``x``'s dtype. ``activations``: W8A8 (``x`` quantized per row), else
    W8A16. ``scaled_mm``: the W8A8 product through ``torch._scaled_mm`` (see :func:`scaled_mm_takes`).
    ``invariant``: one kernel configuration for every ``M`` (and never ``_scaled_mm``)."""
    shape = x.shape
    x2 = as_rows(x)
    m, k = x2.shape
    n = weight.shape[0]
    if weight.stride(-1) != 1:
        weight = weight.contiguous()
    if m == 0:
        return torch.empty((*shape[:-1], n), dtype=x.dtype, device=x.device)
    xs = None
    if activations:
        x2, xs = quantize_per_token(x2)
        if scaled_mm and not invariant:
            y = torch._scaled_mm(
                x2, weight.t(), scale_a=xs.view(m, 1), scale_b=scale.view(1, n), out_dtype=torch.bfloat16
            )
            if bias is not None:
                y.add_(bias)
            return y.to(x.dtype).view(*shape[:-1], n)
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    cfg = fp8_config(m, invariant)
    grid = (triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n),)
    _fp8_matmul_kernel[grid](
        x2,
        scale if xs is None else xs,
        weight if activations else weight.view(torch.uint8),
        scale,
        scale if bias is None else bias,
        y,
        m,
        n,
        k,
        x2.stride(0),
        weight.stride(0),
        y.stride(0),
        A8=activations,
        HAS_BIAS=bias is not None,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        GROUP_M=8,
        HALF_DOT=not INTERPRETED and (activations or x.dtype in (torch.float16, torch.bfloat16)),
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    return y.view(*shape[:-1], n)
