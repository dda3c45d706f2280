"""compressed-tensors checkpoints (llm-compressor): one linear module's tensors.

"pack-quantized" (W4A16, int4):

- ``weight_packed`` int32 ``(out, ceil(in / 8))``: packed along the *input* dimension, in
  order: quant of column ``k`` is nibble ``k % 8`` of word ``[n, k // 8]`` (``pack_to_int32``),
  stored as ``q + 8`` (the signed quant -8..7 offset by 8 to unsigned 0..15).
- ``weight_shape`` int ``(2,)``: ``(out, in)`` before padding.
- ``weight_scale`` ``(out, in / group_size)`` (strategy "group") or ``(out, 1)`` ("channel").
- ``weight_zero_point`` (asymmetric only): the signed zero points -8..7 packed along the
  *output* dimension, ``(ceil(out / 8), groups)`` int32, each stored plus 8; older files hold
  them unpacked, int8 ``(out, groups)``. Symmetric checkpoints have zero point 0.
- ``weight_g_idx`` int32 ``(in,)`` (``actorder``): the group of each input column.
- ``w[n, k] = (q[n, k] - zp[n, g]) * scale[n, g]`` in signed terms; with both offset by 8
  that is the canonical ``(stored_q - (zp + 8)) * scale``: zeros are ``zp + 8`` (8 when
  symmetric).

"float-quantized" (FP8 W8A8): ``weight`` e4m3 + ``weight_scale`` per tensor or per channel,
read by :mod:`.fp8_checkpoint`.
"""

from __future__ import annotations

import torch

from .nibbles import int4_weight, unpack
from .weights import Int4Weight

MARKER = "weight_packed"
TENSORS = ("weight_packed", "weight_shape", "weight_scale", "weight_zero_point", "weight_g_idx")
OFFSET = 8
"""int4's signed-to-unsigned offset in ``pack_to_int32`` (``1 << (bits - 1)``)."""


def read(parts: dict[str, torch.Tensor], dtype: torch.dtype, group_size: int = -1) -> Int4Weight:
    """The canonical 4-bit layout of one pack-quantized module (``parts`` keyed by suffix)."""
    packed, scale = parts["weight_packed"], parts["weight_scale"]
    if packed.dtype != torch.int32:
        raise ValueError(f"compressed-tensors weight_packed must be int32, got {packed.dtype}")
    n = packed.shape[0]
    k = int(parts["weight_shape"][1]) if "weight_shape" in parts else packed.shape[1] * 8
    if k % 8:
        raise ValueError(f"{k} input features are not a multiple of 8")
    quants = unpack(packed, dim=1)[:, :k].t()  # (in, out), unsigned
    groups = scale.shape[1] if scale.dim() == 2 else 1
    if scale.shape[0] != n:
        raise ValueError(f"weight_scale of shape {tuple(scale.shape)} for {n} output channels")
    zp = parts.get("weight_zero_point")
    if zp is None:
        zeros = torch.full((groups, n), OFFSET, dtype=torch.int32)
    elif zp.dtype == torch.int32 and zp.shape[0] == -(-n // 8):
        zeros = unpack(zp, dim=0)[:n].t()  # already offset by 8
    elif zp.shape[0] == n and not zp.is_floating_point():
        zeros = (zp.to(torch.int32) + OFFSET).reshape(n, groups).t()
    else:
        raise ValueError(f"weight_zero_point of shape {tuple(zp.shape)} and {zp.dtype} is not understood")
    g_idx = parts.get("weight_g_idx")
    size = group_size if group_size > 0 else -(-k // groups)
    if g_idx is not None and int(g_idx.min()) < 0:
        g_idx = None  # compressed-tensors' placeholder (-1) when no act-order
    if g_idx is not None:
        g_idx = g_idx.to(torch.int32)
        if torch.equal(g_idx, torch.arange(k, dtype=torch.int32) // size):
            g_idx = None
    elif k % groups:
        raise ValueError(f"{groups} scale groups do not divide {k} input columns")
    return int4_weight(quants, scale.reshape(n, groups).t(), zeros, size, dtype, g_idx)
