"""GPTQ checkpoints (AutoGPTQ, GPTQModel, ``checkpoint_format`` "gptq", i.e. v1), 4-bit.

One linear module's tensors:

- ``qweight`` int32 ``(in / 8, out)``: packed along the *input* dimension, in order: quant of
  input row ``k`` is nibble ``k % 8`` (bits ``4 (k % 8)`` up) of word ``[k // 8, n]``. This is
  the canonical layout itself.
- ``qzeros`` int32 ``(groups, out / 8)``: packed along the output dimension, in order (nibble
  ``i`` of word ``[g, c]`` is column ``8 c + i``). v1 stores each zero point *minus one*
  (symmetric checkpoints: 7 for a zero point of 8), wrapping to 4 bits; the zero point is the
  stored nibble plus one (1..16), as the v1 kernels compute it.
- ``scales`` ``(groups, out)``, fp16.
- ``g_idx`` int32 ``(in,)``: the group of each input row. Without act-order it is
  ``k // group_size``; with ``desc_act`` the rows were quantized in a permuted order and the
  groups follow that order.
- ``w[n, k] = (q[k, n] - z[g, n]) * s[g, n]`` with ``g = g_idx[k]``.
"""

from __future__ import annotations

import torch

from .nibbles import unpack
from .weights import Int4Weight

MARKER = "qweight"
TENSORS = ("qweight", "qzeros", "scales", "g_idx")


def read(parts: dict[str, torch.Tensor], dtype: torch.dtype, group_size: int = -1) -> Int4Weight:
    """The canonical 4-bit layout of one GPTQ v1 module (``parts`` keyed by tensor suffix)."""
    qweight, qzeros, scales = parts["qweight"], parts["qzeros"], parts["scales"]
    if qweight.dtype != torch.int32 or qzeros.dtype != torch.int32:
        raise ValueError(f"GPTQ qweight/qzeros must be int32, got {qweight.dtype}/{qzeros.dtype}")
    k, n = qweight.shape[0] * 8, qweight.shape[1]
    zeros = unpack(qzeros, dim=1)[:, :n] + 1  # v1: stored minus one
    groups = scales.shape[0]
    if scales.shape[1] != n or zeros.shape != scales.shape:
        raise ValueError(
            f"GPTQ shapes do not agree: qweight {tuple(qweight.shape)}, qzeros {tuple(qzeros.shape)}, "
            f"scales {tuple(scales.shape)}"
        )
    size = group_size if group_size > 0 else -(-k // groups)
    g_idx = parts.get("g_idx")
    if g_idx is not None:
        g_idx = g_idx.to(torch.int32)
        if g_idx.shape != (k,) or int(g_idx.min()) < 0 or int(g_idx.max()) >= groups:
            raise ValueError(f"GPTQ g_idx of shape {tuple(g_idx.shape)} does not index {groups} groups of {k} rows")
        if torch.equal(g_idx, torch.arange(k, dtype=torch.int32) // size):
            g_idx = None  # no act-order: the groups are contiguous
    elif k % groups:
        raise ValueError(f"GPTQ scales have {groups} groups, which do not divide {k} input rows")
    return Int4Weight(
        qweight=qweight.contiguous(),
        scales=scales.to(dtype).contiguous(),
        zeros=zeros.to(torch.uint8),
        group_size=size,
        g_idx=g_idx,
    )
