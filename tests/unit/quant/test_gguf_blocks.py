"""GGUF blocks dequantized by :class:`BlockWeight` against gguf-py's own implementation of the
format, and the int8 (Q8_0) quantizer against gguf-py's quantizer, byte for byte."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as GT
from gguf.quants import dequantize, quantize

from lmiserve.rolling_batch.quant.blocks import quantize_q8_0
from lmiserve.rolling_batch.quant.weights import BlockWeight, cat_rows

TYPES = {"q4_0": GT.Q4_0, "q4_1": GT.Q4_1, "q8_0": GT.Q8_0}


@pytest.mark.parametrize("kind", sorted(TYPES))
def test_dequantize_matches_gguf_py(kind: str) -> None:
    w = np.random.default_rng(0).standard_normal((5, 64)).astype(np.float32)
    raw = quantize(w, TYPES[kind])
    ours = BlockWeight(kind, torch.from_numpy(raw.copy()), 64).dequantize()
    theirs = torch.from_numpy(dequantize(raw, TYPES[kind]).astype(np.float32))
    assert torch.equal(ours, theirs)


def test_q4_1_layout_by_hand() -> None:
    """d = 0.5, m = -1, byte j: quant j in the low nibble, quant j + 16 in the high one."""
    qs = bytes((j & 0xF) | ((15 - j) << 4) for j in range(16))
    block = np.frombuffer(np.float16(0.5).tobytes() + np.float16(-1).tobytes() + qs, dtype=np.uint8)
    w = BlockWeight("q4_1", torch.from_numpy(block.copy()).view(1, 20), 32).dequantize()
    quants = list(range(16)) + [15 - j for j in range(16)]
    assert w[0].tolist() == [0.5 * q - 1 for q in quants]


def test_q8_0_quantizer_is_ggmls_byte_for_byte() -> None:
    w = torch.randn(7, 96, generator=torch.Generator().manual_seed(3))
    w[0, :32] = 0  # an all-zero block
    ours = quantize_q8_0(w)
    theirs = quantize(w.numpy(), GT.Q8_0)
    assert ours.blocks.numpy().tobytes() == theirs.tobytes()
    assert ours.shape == (7, 96)


def test_rows_stack_for_the_fused_projections() -> None:
    a, b = quantize_q8_0(torch.randn(3, 32)), quantize_q8_0(torch.randn(2, 32))
    both = cat_rows([a, b])
    assert both.shape == (5, 32)
    assert torch.equal(both.dequantize(), torch.cat([a.dequantize(), b.dequantize()]))
    with pytest.raises(ValueError, match="GGUF types"):
        cat_rows([a, BlockWeight("q4_0", torch.zeros(1, 18, dtype=torch.uint8), 32)])
