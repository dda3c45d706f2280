"""Fused element-wise kernels for half-precision activations: RMSNorm (with the residual
add), rotary embedding and SwiGLU, one program per token row.

Each rounds where the plain torch version rounds (transformers' order): the normalised row
is cast to the activation dtype before the weight multiplies it, the residual sum is rounded
before it is normalised, each product of the rotation is rounded before the sum. The rotation
is compiled without floating-point contraction: the GPU compiler would otherwise see through
the rounding of a product and fuse it with the sum after it into one multiply-add, rounded once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .rounding import cast


@triton.jit
def _rms_norm_kernel(x_ptr, residual_ptr, w_ptr, y_ptr, rstd_ptr, n, eps, ADD: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    ok = cols < n
    x = tl.load(x_ptr + row * n + cols, mask=ok, other=0.0)
    if ADD:
        h = cast(x.to(tl.float32) + tl.load(residual_ptr + row * n + cols, mask=ok, other=0.0).to(tl.float32), x.dtype)
        tl.store(residual_ptr + row * n + cols, h, mask=ok)
        x = h
    xf = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / n + eps)
    normed = cast(xf * rstd, x.dtype).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * n + cols, cast(normed * w, y_ptr.dtype.element_ty), mask=ok)
    tl.store(rstd_ptr + row, rstd)


def _norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float):  # type: ignore[no-untyped-def]
    n = x.shape[-1]
    rows = x.numel() // n
    y = torch.empty_like(x)
    rstd = torch.empty(x.shape[:-1] + (1,), dtype=torch.float32, device=x.device)
    if rows:
        _rms_norm_kernel[(rows,)](
            x, x if residual is None else residual, weight, y, rstd, n, eps,
            ADD=residual is not None, BLOCK=triton.next_power_of_2(n),
        )  # fmt: skip
    return y, rstd


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(weight * x / rms(x), rstd)`` over the last dimension of a contiguous ``x``."""
    return _norm(x, None, weight, eps)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rms_norm(residual + x), residual + x)``; the sum is written over ``residual``."""
    y, _ = _norm(x, residual, weight, eps)
    return y, residual


@triton.jit
def _rotate_rows(
    ptr, row, c1, c2, s1, s2, heads, HEAD_DIM: tl.constexpr, HEADS_PAD: tl.constexpr, HALF_PAD: tl.constexpr
):
    half = HEAD_DIM // 2
    h = tl.arange(0, HEADS_PAD)
    d = tl.arange(0, HALF_PAD)
    ok = (h < heads)[:, None] & (d < half)[None, :]
    base = ptr + row * heads * HEAD_DIM + h[:, None] * HEAD_DIM + d[None, :]
    x1 = tl.load(base, mask=ok, other=0.0)
    x2 = tl.load(base + half, mask=ok, other=0.0)
    dt = x1.dtype
    # x * cos + rotate_half(x) * sin, each product rounded as torch rounds it
    a1 = cast(x1.to(tl.float32) * c1, dt).to(tl.float32)
    b1 = cast(-x2.to(tl.float32) * s1, dt).to(tl.float32)
    a2 = cast(x2.to(tl.float32) * c2, dt).to(tl.float32)
    b2 = cast(x1.to(tl.float32) * s2, dt).to(tl.float32)
    o1 = cast(a1 + b1, dt)
    o2 = cast(a2 + b2, dt)
    tl.store(base, o1, mask=ok)
    tl.store(base + half, o2, mask=ok)


@triton.jit
def _rotary_kernel(
    q_ptr, k_ptr, cos_ptr, sin_ptr, q_heads, k_heads,
    HEAD_DIM: tl.constexpr, Q_PAD: tl.constexpr, K_PAD: tl.constexpr, HALF_PAD: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    half = HEAD_DIM // 2
    d = tl.arange(0, HALF_PAD)
    ok = d < half
    c1 = tl.load(cos_ptr + row * HEAD_DIM + d, mask=ok, other=0.0).to(tl.float32)[None, :]
    c2 = tl.load(cos_ptr + row * HEAD_DIM + half + d, mask=ok, other=0.0).to(tl.float32)[None, :]
    s1 = tl.load(sin_ptr + row * HEAD_DIM + d, mask=ok, other=0.0).to(tl.float32)[None, :]
    s2 = tl.load(sin_ptr + row * HEAD_DIM + half + d, mask=ok, other=0.0).to(tl.float32)[None, :]
    _rotate_rows(q_ptr, row, c1, c2, s1, s2, q_heads, HEAD_DIM, Q_PAD, HALF_PAD)
    _rotate_rows(k_ptr, row, c1, c2, s1, s2, k_heads, HEAD_DIM, K_PAD, HALF_PAD)


def rotary_(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate contiguous q ``(T, H, D)`` and k ``(T, KVH, D)`` in place (half layout) by
    per-token ``cos``/``sin`` ``(T, D)`` of the same dtype."""
    tokens, heads, dim = q.shape
    if tokens:
        _rotary_kernel[(tokens,)](
            q, k, cos, sin, heads, k.shape[1],
            HEAD_DIM=dim, Q_PAD=triton.next_power_of_2(heads), K_PAD=triton.next_power_of_2(k.shape[1]),
            HALF_PAD=triton.next_power_of_2(dim // 2), enable_fp_fusion=False,
        )  # fmt: skip
    return q, k


@triton.jit
def _swiglu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    cols = chunk * BLOCK + tl.arange(0, BLOCK)
    ok = cols < n
    gate = tl.load(x_ptr + row * 2 * n + cols, mask=ok, other=0.0)
    up = tl.load(x_ptr + row * 2 * n + n + cols, mask=ok, other=0.0)
    g = gate.to(tl.float32)
    silu = cast(g / (1.0 + tl.exp(-g)), gate.dtype).to(tl.float32)
    tl.store(y_ptr + row * n + cols, cast(silu * up.to(tl.float32), gate.dtype), mask=ok)


def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` for a contiguous ``gate_up`` whose last dimension is ``[gate, up]``."""
    n = gate_up.shape[-1] // 2
    rows = gate_up.numel() // (2 * n)
    y = torch.empty(gate_up.shape[:-1] + (n,), dtype=gate_up.dtype, device=gate_up.device)
    if rows:
        block = min(1024, triton.next_power_of_2(n))
        _swiglu_kernel[(rows, triton.cdiv(n, block))](gate_up, y, n, BLOCK=block)
    return y
