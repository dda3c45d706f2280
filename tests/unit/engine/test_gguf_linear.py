"""The CPU kernel for GGUF blocks (``csrc/quant_linear.cpp``) against the weights dequantized in fp32."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType as GT
from gguf.quants import quantize

from lmiserve.rolling_batch.ops.cpu_kernels import load_kernels
from lmiserve.rolling_batch.quant.weights import BlockWeight

pytestmark = pytest.mark.skipif(not load_kernels(), reason="the CPU kernels do not build here")

KINDS = {"q4_0": (0, GT.Q4_0), "q4_1": (1, GT.Q4_1), "q8_0": (2, GT.Q8_0)}


def blocks(kind: str, n: int, k: int, seed: int = 0) -> BlockWeight:
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed)).numpy().astype(np.float32)
    raw = quantize(w, KINDS[kind][1])
    return BlockWeight(kind, torch.from_numpy(np.ascontiguousarray(raw)), k)


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 9])
@pytest.mark.parametrize("n", [8, 13])
def test_fp32_rows_match_dequantized_weights(kind: str, m: int, n: int) -> None:
    w = blocks(kind, n, 96)
    x = torch.randn(m, 96, generator=torch.Generator().manual_seed(1))
    bias = torch.randn(n)
    got = torch.ops.lmiserve_cpu.linear_gguf(x, w.blocks, KINDS[kind][0], bias)
    want = F.linear(x.double(), w.dequantize(torch.float64), bias.double())
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("m", [1, 4, 7])
def test_bf16_rows_match_the_bf16_weights(kind: str, m: int) -> None:
    """bf16 x: the product of the weights rounded to bf16 (what a bf16 model holds), summed in fp32."""
    w = blocks(kind, 12, 128)
    x = torch.randn(m, 128, generator=torch.Generator().manual_seed(2)).bfloat16()
    got = torch.ops.lmiserve_cpu.linear_gguf(x, w.blocks, KINDS[kind][0], None)
    assert got.dtype == torch.bfloat16 and got.shape == (m, 12)
    want = F.linear(x.double(), w.dequantize(torch.bfloat16).double())
    torch.testing.assert_close(got.double(), want, rtol=1e-2, atol=2e-2)


def test_a_row_does_not_depend_on_the_others() -> None:
    w = blocks("q4_1", 20, 64)
    x = torch.randn(11, 64).bfloat16()
    whole = torch.ops.lmiserve_cpu.linear_gguf(x, w.blocks, 1, None)
    for i in range(11):
        alone = torch.ops.lmiserve_cpu.linear_gguf(x[i : i + 1], w.blocks, 1, None)
        assert torch.equal(alone[0], whole[i])


def test_batched_leading_dimensions_and_wrong_shapes() -> None:
    w = blocks("q8_0", 6, 64)
    x = torch.randn(2, 3, 64)
    y = torch.ops.lmiserve_cpu.linear_gguf(x, w.blocks, 2, None)
    assert y.shape == (2, 3, 6)
    torch.testing.assert_close(y, F.linear(x, w.dequantize()), rtol=1e-5, atol=1e-4)
    with pytest.raises(RuntimeError, match="features"):
        torch.ops.lmiserve_cpu.linear_gguf(torch.randn(1, 96), w.blocks, 2, None)
