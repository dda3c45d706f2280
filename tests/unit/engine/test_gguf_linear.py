"""The CPU kernel for GGUF blocks (``csrc/quant_linear.cpp``, on AMX tiles
``csrc/quant_linear_amx.cpp``) against the weights dequantized in fp32; bf16 rows, in every CPU
class's build (on fp32 FMAs without AVX512_BF16), against the weights dequantized to bf16."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType as GT
from gguf.quants import quantize

from lmiserve.rolling_batch.ops.cpu_kernels import amx_tiles, load_kernels
from lmiserve.rolling_batch.quant.weights import BlockWeight

from .thread_shares import assert_same_however_shared

pytestmark = pytest.mark.skipif(not load_kernels(), reason="the CPU kernels do not build here")

KINDS = {"q4_0": (0, GT.Q4_0), "q4_1": (1, GT.Q4_1), "q8_0": (2, GT.Q8_0)}
TILES = [0] + ([1] if amx_tiles() else [])
"""Rows from which the tiles run: never, and (with AMX) always."""


def blocks(kind: str, n: int, k: int, seed: int = 0) -> BlockWeight:
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed)).numpy().astype(np.float32)
    raw = quantize(w, KINDS[kind][1])
    return BlockWeight(kind, torch.from_numpy(np.ascontiguousarray(raw)), k)


def packed(w: BlockWeight) -> torch.Tensor:
    return torch.ops.lmiserve_cpu.pack_gguf(w.blocks, KINDS[w.kind][0], w.in_features)


def linear(x, w: BlockWeight, bias=None, tile_rows=0):  # type: ignore[no-untyped-def]
    return torch.ops.lmiserve_cpu.linear_gguf(x, packed(w), KINDS[w.kind][0], bias, tile_rows)


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 9])
@pytest.mark.parametrize("k", [96, 128])
def test_fp32_rows_match_dequantized_weights(kind: str, m: int, k: int) -> None:
    """96 inputs: three blocks, an odd number (Q4's last pair half empty)."""
    w = blocks(kind, 13, k)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(1))
    bias = torch.randn(13)
    got = linear(x, w, bias)
    want = F.linear(x.double(), w.dequantize(torch.float64), bias.double())
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("m", [1, 4, 7, 40])
@pytest.mark.parametrize("tile_rows", TILES)
def test_bf16_rows_match_the_dequantized_weights(kind: str, m: int, tile_rows: int) -> None:
    """Products in fp32 of bf16 x; within bf16 rounding of the exact product."""
    w = blocks(kind, 37, 96)
    x = torch.randn(m, 96, generator=torch.Generator().manual_seed(2)).bfloat16()
    bias = torch.randn(37, generator=torch.Generator().manual_seed(3))  # the same sums every run
    got = linear(x, w, bias, tile_rows)
    assert got.dtype == torch.bfloat16 and got.shape == (m, 37)
    want = F.linear(x.double(), w.dequantize(torch.float64), bias.double())
    torch.testing.assert_close(got.double(), want, rtol=2e-2, atol=5e-2)


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("m", [1, 4, 7, 20, 40])
@pytest.mark.parametrize("k", [96, 352])
@pytest.mark.parametrize("tile_rows", TILES)
def test_bf16_rows_multiply_the_weights_rounded_to_bf16(kind: str, m: int, k: int, tile_rows: int) -> None:
    """Each x row is the sum of two unit rows, so each output is two weights added, once rounded:
    exactly that sum of the weights as the model's bf16 tensor holds them (a Q8_0 block's sums
    scaled by d afterwards would round d (q1 + q2) instead, which differs for some pairs). On the
    tiles, 352 inputs are more steps of dequantized weights than the two that a call of one or
    two chunks of x keeps in turn, and 40 rows are three chunks, which keep every step."""
    w = blocks(kind, 37, k, seed=5)
    pairs = torch.randint(0, k, (m, 2), generator=torch.Generator().manual_seed(6))
    x = torch.zeros(m, k, dtype=torch.bfloat16)
    x[torch.arange(m), pairs[:, 0]] = 1
    x[torch.arange(m), pairs[:, 1]] += 1
    wb = w.dequantize(torch.bfloat16).double()
    want = (x.double() @ wb.T).bfloat16()
    assert torch.equal(linear(x, w, None, tile_rows), want)


@pytest.mark.parametrize("tile_rows", TILES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_row_does_not_depend_on_the_others(tile_rows: int, dtype: torch.dtype) -> None:
    w = blocks("q4_1", 20, 64)
    x = torch.randn(35, 64).to(dtype)
    whole = linear(x, w, None, tile_rows)
    for i in (0, 16, 34):
        assert torch.equal(linear(x[i : i + 1], w, None, tile_rows)[0], whole[i])


@pytest.mark.parametrize("tile_rows", TILES)
def test_the_product_does_not_depend_on_how_threads_share_it(tile_rows: int) -> None:
    """More threads than cores: a thread the system stops has its strips finished by the others,
    and every output is still the one a single thread computes."""
    w = blocks("q4_1", 200, 576)
    x = torch.randn(40, 576, generator=torch.Generator().manual_seed(4)).bfloat16()
    assert_same_however_shared(lambda: linear(x, w, None, tile_rows))


def test_fp16_rows_leading_dimensions_and_wrong_shapes() -> None:
    w = blocks("q8_0", 6, 64)
    x = torch.randn(2, 3, 64)
    y = linear(x, w)
    assert y.shape == (2, 3, 6)
    torch.testing.assert_close(y, F.linear(x, w.dequantize()), rtol=1e-5, atol=1e-4)
    half = linear(x.half(), w)
    assert half.dtype == torch.float16
    with pytest.raises(RuntimeError, match="features"):
        torch.ops.lmiserve_cpu.linear_gguf(torch.randn(1, 96), packed(w), 2, None, 0)
