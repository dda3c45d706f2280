"""Linear-layer weights stored quantized, in the engine's own canonical layouts.

Every checkpoint format is read into one of these (:mod:`.gguf_weights` for GGUF files, the
checkpoint readers for AWQ, GPTQ, compressed-tensors and FP8), and every ops implementation
either runs one in a kernel of its own or dequantizes it (:meth:`dequantize`, the executable
definition of each format: the reference ops multiply by exactly this).

- :class:`BlockWeight`: GGUF's blocks of 32 weights along the input dimension, the blocks of each
  output row in order, each block as the file stores it (``Q4_0``, ``Q4_1``, ``Q8_0``). Also the
  layout of ``option.quantize=int8`` (``Q8_0``: one fp16 scale per 32 weights).
- :class:`Int4Weight`: AWQ's and GPTQ's 4-bit weights with a scale and a zero point per group of
  input rows, packed 8 to an int32 along the input dimension (GPTQ's own ``qweight`` order).
- :class:`Fp8Weight`: e4m3 weights with one fp32 scale per output channel.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

BLOCK = 32
"""Weights per GGUF block (Q4_0, Q4_1, Q8_0)."""
BLOCK_BYTES = {"q4_0": 18, "q4_1": 20, "q8_0": 34}
"""Bytes per block: an fp16 scale (and, Q4_1, an fp16 minimum), then the 32 quants."""


@dataclass
class BlockWeight:
    """GGUF blocks: ``blocks`` is uint8 ``(out, in / 32 * BLOCK_BYTES[kind])``.

    Q4_0: ``w = d * (q - 8)``, Q4_1: ``w = d * q + m``, Q8_0: ``w = d * q`` (q int8). In Q4 blocks
    byte ``j`` holds quant ``j`` in its low nibble and quant ``j + 16`` in its high one.
    """

    kind: str
    blocks: torch.Tensor
    in_features: int

    @property
    def shape(self) -> tuple[int, int]:
        return (self.blocks.shape[0], self.in_features)

    @property
    def scheme(self) -> str:
        return self.kind

    def rows(self, index: torch.Tensor | slice) -> BlockWeight:
        return replace(self, blocks=self.blocks[index].contiguous())

    def to(self, device: str | torch.device) -> BlockWeight:
        return replace(self, blocks=self.blocks.to(device))

    def parts(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(q, d, m)`` in fp32: the quants ``(out, in / 32, 32)`` in input order (Q4's 0 to 15,
        Q8_0's signed), and per block ``(out, in / 32, 1)`` the scale and the minimum (Q4_1's own,
        Q4_0's ``-8 d``, Q8_0's zero), so that ``w = d q + m``."""
        n, k = self.shape
        raw = self.blocks.reshape(n, k // BLOCK, BLOCK_BYTES[self.kind])
        d = raw[..., 0:2].contiguous().view(torch.float16).float()
        if self.kind == "q8_0":
            return raw[..., 2:].contiguous().view(torch.int8).float(), d, torch.zeros_like(d)
        packed = raw[..., 4:] if self.kind == "q4_1" else raw[..., 2:]
        q = torch.cat([packed & 0xF, packed >> 4], dim=-1).float()
        m = raw[..., 2:4].contiguous().view(torch.float16).float() if self.kind == "q4_1" else -8 * d
        return q, d, m

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        n, k = self.shape
        q, d, m = self.parts()
        if self.kind == "q8_0":
            w = d * q
        elif self.kind == "q4_1":
            w = torch.addcmul(m, d, q)  # one rounding, as the kernels' fused multiply-add
        else:
            w = d * (q - 8)
        return w.reshape(n, k).to(dtype)


@dataclass
class Int4Weight:
    """4-bit weights, ``w[k, n] = (q[k, n] - zeros[g, n]) * scales[g, n]`` with ``g = g_idx[k]``
    (``k // group_size`` when ``g_idx`` is None).

    ``qweight`` int32 ``(in / 8, out)``: quant ``k`` of column ``n`` is nibble ``k % 8`` (bits
    ``4 (k % 8)`` up) of ``qweight[k // 8, n]``. ``scales`` ``(groups, out)`` in the model dtype,
    ``zeros`` uint8 ``(groups, out)`` (8 for symmetric checkpoints), ``g_idx`` int32 ``(in,)``
    for GPTQ's act-order checkpoints.
    """

    qweight: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor
    group_size: int
    g_idx: torch.Tensor | None = None
    scheme: str = "int4"

    @property
    def shape(self) -> tuple[int, int]:
        return (self.qweight.shape[1], self.qweight.shape[0] * 8)

    def groups(self) -> torch.Tensor:
        if self.g_idx is not None:
            return self.g_idx.long()
        return torch.arange(self.shape[1], device=self.qweight.device) // self.group_size

    def unpacked(self) -> torch.Tensor:
        """The quants as int32 ``(in, out)``."""
        shifts = torch.arange(0, 32, 4, device=self.qweight.device, dtype=torch.int32)
        q = (self.qweight.unsqueeze(1) >> shifts.view(1, 8, 1)) & 0xF
        return q.reshape(-1, self.qweight.shape[1])

    def rows(self, index: torch.Tensor | slice) -> Int4Weight:
        """Output rows (the columns of this layout)."""
        return replace(
            self,
            qweight=self.qweight[:, index].contiguous(),
            scales=self.scales[:, index].contiguous(),
            zeros=self.zeros[:, index].contiguous(),
        )

    def to(self, device: str | torch.device) -> Int4Weight:
        g_idx = None if self.g_idx is None else self.g_idx.to(device)
        return replace(
            self,
            qweight=self.qweight.to(device),
            scales=self.scales.to(device),
            zeros=self.zeros.to(device),
            g_idx=g_idx,
        )

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """``(out, in)``, computed in fp32."""
        g = self.groups()
        q = self.unpacked().float()
        w = (q - self.zeros.float()[g]) * self.scales.float()[g]
        return w.t().contiguous().to(dtype)


@dataclass
class Fp8Weight:
    """e4m3 ``weight`` ``(out, in)`` and fp32 ``scale`` ``(out,)``: ``w = weight * scale[:, None]``."""

    weight: torch.Tensor
    scale: torch.Tensor
    scheme: str = "fp8"

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.weight.shape)  # type: ignore[return-value]

    def rows(self, index: torch.Tensor | slice) -> Fp8Weight:
        return replace(self, weight=self.weight[index].contiguous(), scale=self.scale[index].contiguous())

    def to(self, device: str | torch.device) -> Fp8Weight:
        return replace(self, weight=self.weight.to(device), scale=self.scale.to(device))

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return (self.weight.float() * self.scale.float().unsqueeze(1)).to(dtype)


QuantizedWeight = BlockWeight | Int4Weight | Fp8Weight


def is_quantized(weight: object) -> bool:
    return isinstance(weight, (BlockWeight, Int4Weight, Fp8Weight))


def cat_rows(parts: list) -> torch.Tensor | QuantizedWeight:  # type: ignore[type-arg]
    """Weights stacked along the output dimension (the fused QKV and gate/up projections), dense
    or quantized alike; every part must be stored the same way."""
    first = parts[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(parts, dim=0)
    if any(type(p) is not type(first) for p in parts):
        raise ValueError("a fused projection's parts are stored in different formats")
    if isinstance(first, BlockWeight):
        if any(p.kind != first.kind for p in parts):
            kinds = sorted({p.kind for p in parts})
            raise ValueError(f"a fused projection's parts are in different GGUF types {kinds}")
        return replace(first, blocks=torch.cat([p.blocks for p in parts], dim=0))
    if isinstance(first, Int4Weight):
        if any(p.group_size != first.group_size for p in parts):
            raise ValueError("a fused projection's parts have different group sizes")
        if any(
            (p.g_idx is None) != (first.g_idx is None)
            or (p.g_idx is not None and not torch.equal(p.g_idx, first.g_idx))
            for p in parts
        ):
            raise ValueError("a fused projection's parts have different act-order group indices (g_idx)")
        return replace(
            first,
            qweight=torch.cat([p.qweight for p in parts], dim=1),
            scales=torch.cat([p.scales for p in parts], dim=1),
            zeros=torch.cat([p.zeros for p in parts], dim=1),
        )
    return replace(first, weight=torch.cat([p.weight for p in parts]), scale=torch.cat([p.scale for p in parts]))


def dense(weight: torch.Tensor | QuantizedWeight, dtype: torch.dtype) -> torch.Tensor:
    """``weight`` as a dense tensor of ``dtype`` (dequantized where it is quantized)."""
    if isinstance(weight, torch.Tensor):
        return weight.to(dtype)
    return weight.dequantize(dtype)
