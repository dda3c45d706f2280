"""GGUF blocks against activations quantized to int8 (``option.quantize_activations=int8``): the
CPU kernel (``csrc/quant_linear_int8.cpp``) against the definition in torch
(:mod:`lmiserve.rolling_batch.quant.int8_activations`), each row apart from the batch, the error
against the dequantized product within what the activations' rounding allows, and the ops that
run it (the C++ kernel in the CPU ops, the definition in the reference ops)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType as GT
from gguf.quants import quantize

from lmiserve.rolling_batch.ops import create_ops
from lmiserve.rolling_batch.ops.cpu_kernels import load_kernels
from lmiserve.rolling_batch.quant.int8_activations import linear_int8_activations, quantize_rows
from lmiserve.rolling_batch.quant.weights import BlockWeight

pytestmark = pytest.mark.skipif(not load_kernels(), reason="the CPU kernels do not build here")

KINDS = {"q4_0": (0, GT.Q4_0), "q4_1": (1, GT.Q4_1), "q8_0": (2, GT.Q8_0)}


def blocks(kind: str, n: int, k: int, seed: int = 0) -> BlockWeight:
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed)).numpy().astype(np.float32)
    return BlockWeight(kind, torch.from_numpy(np.ascontiguousarray(quantize(w, KINDS[kind][1]))), k)


def kernel(x, w: BlockWeight, bias=None):  # type: ignore[no-untyped-def]
    number = KINDS[w.kind][0]
    packed = torch.ops.lmiserve_cpu.pack_gguf_int8(w.blocks, number, w.in_features)
    return torch.ops.lmiserve_cpu.linear_gguf_int8(x, packed, number, w.shape[0], bias)


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("m", [1, 2, 5, 9, 17])
@pytest.mark.parametrize("n, k", [(13, 96), (8, 576), (37, 1536)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_matches_the_definition(kind: str, m: int, n: int, k: int, dtype: torch.dtype) -> None:
    """The integer sums are exact in both; only the fp32 sums of the blocks' products differ in
    order. 96 inputs: three blocks (a group of two half empty); 13 and 37 rows: sets of 8 half
    full."""
    w = blocks(kind, n, k)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(1)).to(dtype)
    bias = torch.randn(n)
    got = kernel(x, w, bias)
    assert got.dtype == dtype and got.shape == (m, n)
    want = linear_int8_activations(x, w, bias, torch.float64)
    tolerance = dict(rtol=1e-5, atol=1e-4) if dtype == torch.float32 else dict(rtol=2**-8, atol=1e-3)
    torch.testing.assert_close(got.double(), want, **tolerance)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_row_does_not_depend_on_the_batch(kind: str) -> None:
    w = blocks(kind, 21, 576)
    x = torch.randn(19, 576, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    batch = kernel(x, w)
    for i in range(19):
        assert torch.equal(kernel(x[i : i + 1], w), batch[i : i + 1]), i
    assert torch.equal(kernel(x[4:13], w), batch[4:13])


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_error_is_the_activations_rounding(kind: str) -> None:
    """Against the dequantized weights times x itself: off by sum(|w| |x - d q|), at most
    sum(|w|) d / 2 per block, and no closer to exact than that allows (it does quantize)."""
    w = blocks(kind, 16, 1536)
    x = torch.randn(6, 1536, generator=torch.Generator().manual_seed(5))
    got = kernel(x, w).double()
    dense = w.dequantize(torch.float64)
    q, d = quantize_rows(x)
    rounding = (x.double() - (q * d[..., None]).reshape(6, -1).double()).abs()
    assert (rounding <= d.repeat_interleave(32, dim=1).double() / 2 + 1e-7).all()
    bound = rounding @ dense.abs().t()
    error = (got - F.linear(x.double(), dense)).abs()
    assert (error <= bound + 1e-4).all()
    assert error.max() > 1e-4


def test_rows_of_zeros_give_the_bias() -> None:
    w = blocks("q4_1", 9, 96)
    bias = torch.randn(9)
    assert torch.equal(kernel(torch.zeros(3, 96), w, bias), bias.expand(3, 9))


@pytest.mark.parametrize("name", ["cpu", "reference"])
def test_ops_run_it(name: str) -> None:
    """The CPU ops through the kernel (their packing says so), the reference ops by the
    definition; without the setting both multiply the dequantized weights."""
    w = blocks("q4_0", 24, 128)
    x = torch.randn(3, 128, generator=torch.Generator().manual_seed(2))
    ops = create_ops("cpu", name, int8_activations=True)
    prepared = ops.prepare_linear(w)
    if name == "cpu":
        assert prepared.packing == "gguf-q4_0+int8"
    want = linear_int8_activations(x, w, None, torch.float64)
    torch.testing.assert_close(ops.linear(x, prepared).double(), want, rtol=1e-5, atol=1e-4)
    plain = create_ops("cpu", name)
    dense = F.linear(x.double(), w.dequantize(torch.float64))
    torch.testing.assert_close(plain.linear(x, plain.prepare_linear(w)).double(), dense, rtol=1e-5, atol=1e-4)


def test_other_devices_refuse_it() -> None:
    with pytest.raises(ValueError, match="runs on CPUs"):
        create_ops("npu:0", "npu", int8_activations=True)
