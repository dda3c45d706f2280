"""AutoAWQ GEMM checkpoints: one linear module's ``qweight``, ``qzeros`` and ``scales``.

The layout (AutoAWQ's ``WQLinear_GEMM``, also what vLLM's and transformers' AWQ kernels read):

- ``qweight`` int32 ``(in, out / 8)``: packed along the *output* dimension. Word ``[k, c]``
  holds the quants of columns ``8 c .. 8 c + 7`` of input row ``k``, interleaved: nibble ``i``
  (bits ``4 i`` up) holds column ``8 c + AWQ_ORDER[i]``, ``AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)``.
- ``qzeros`` int32 ``(in / group_size, out / 8)``: the zero points (0..15), packed the same way.
- ``scales`` ``(in / group_size, out)``, fp16.
- ``w[n, k] = (q[k, n] - z[k // group_size, n]) * s[k // group_size, n]`` (asymmetric; no
  offset on the stored zero points).
"""

from __future__ import annotations

import torch

from .nibbles import int4_weight, unpack
from .weights import Int4Weight

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
"""Which of a word's eight output columns nibble ``i`` holds."""
MARKER = "qweight"
TENSORS = ("qweight", "qzeros", "scales")


def read(parts: dict[str, torch.Tensor], dtype: torch.dtype, group_size: int = -1) -> Int4Weight:
    """The canonical 4-bit layout of one AWQ module (``parts`` keyed by tensor suffix)."""
    qweight, qzeros, scales = (parts[name] for name in TENSORS)
    if qweight.dtype != torch.int32 or qzeros.dtype != torch.int32:
        raise ValueError(f"AWQ qweight/qzeros must be int32, got {qweight.dtype}/{qzeros.dtype}")
    quants = unpack(qweight, dim=1, order=AWQ_ORDER)  # (in, out)
    zeros = unpack(qzeros, dim=1, order=AWQ_ORDER)  # (groups, out)
    k, n = quants.shape
    groups = scales.shape[0]
    if scales.shape[1] != n or zeros.shape != scales.shape or k % groups:
        raise ValueError(
            f"AWQ shapes do not agree: qweight {tuple(qweight.shape)}, qzeros {tuple(qzeros.shape)}, "
            f"scales {tuple(scales.shape)}"
        )
    size = k // groups
    if group_size > 0 and size != group_size and groups > 1:
        raise ValueError(f"AWQ scales have groups of {size} rows, the config says {group_size}")
    return int4_weight(quants, scales, zeros, size, dtype)
