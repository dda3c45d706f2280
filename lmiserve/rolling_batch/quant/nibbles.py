"""4-bit quants packed eight to an int32, the way the checkpoint formats and the canonical
:class:`~.weights.Int4Weight` store them: nibble ``i`` is bits ``4 i .. 4 i + 3`` of the word
(little-endian nibbles), read as an unsigned value 0..15."""

from __future__ import annotations

import torch

from .weights import Int4Weight

NIBBLES = 8


def unpack(words: torch.Tensor, dim: int, order: tuple[int, ...] | None = None) -> torch.Tensor:
    """The int32 quants (0..15) of int32 ``words``, eight per word along ``dim``.

    ``order[i]`` is which of a word's eight quants nibble ``i`` holds (None: quant ``i``).
    """
    dim = dim % words.dim()
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=words.device)
    shape = [1] * (words.dim() + 1)
    shape[dim + 1] = NIBBLES
    nibbles = (words.unsqueeze(dim + 1) >> shifts.view(shape)) & 0xF  # nibble i at index i
    if order is not None:
        where = torch.tensor([order.index(j) for j in range(NIBBLES)], device=words.device)
        nibbles = nibbles.index_select(dim + 1, where)  # quant j at index j
    return nibbles.flatten(dim, dim + 1)


def pack_input_rows(q: torch.Tensor) -> torch.Tensor:
    """Quants ``(in, out)`` (0..15) as the canonical int32 ``(in / 8, out)``: quant ``k`` of
    column ``n`` in nibble ``k % 8`` of word ``[k // 8, n]``."""
    k, n = q.shape
    if k % NIBBLES:
        raise ValueError(f"{k} input features are not a multiple of {NIBBLES}")
    parts = q.to(torch.int64).reshape(k // NIBBLES, NIBBLES, n)
    shifts = torch.arange(0, 32, 4, dtype=torch.int64, device=q.device).view(1, NIBBLES, 1)
    words = (parts << shifts).sum(dim=1)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def int4_weight(
    quants: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    group_size: int,
    dtype: torch.dtype,
    g_idx: torch.Tensor | None = None,
    scheme: str = "int4",
) -> Int4Weight:
    """The canonical layout of quants ``(in, out)``, ``scales`` and ``zeros`` ``(groups, out)``."""
    return Int4Weight(
        qweight=pack_input_rows(quants),
        scales=scales.to(dtype).contiguous(),
        zeros=zeros.to(torch.uint8).contiguous(),
        group_size=group_size,
        g_idx=None if g_idx is None else g_idx.to(torch.int32).contiguous(),
        scheme=scheme,
    )
