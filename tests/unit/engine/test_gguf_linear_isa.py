"""The GGUF-block kernel built for other CPU classes than this one's: AVX2 only (no AVX-512),
AVX-512F without AVX512_BF16 (nor AVX512_VNNI) and plain C++, each in a build of its own (with
load_kernels' flags), against the weights dequantized in fp32 (bf16 rows: to bf16); and the AVX2
build's rows, which do not depend on the rest of the batch. The int8-activation kernel likewise,
against its definition, its rows apart from the batch in every build. (The kernels are compiled for the CPU they run on;
these builds run the other classes' code here.)"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType as GT
from gguf.quants import quantize

from lmiserve.devices import cpu_flags
from lmiserve.rolling_batch.ops.cpu_kernels import load_kernels

pytestmark = pytest.mark.skipif(
    not load_kernels() or importlib.util.find_spec("ninja") is None, reason="the CPU kernels do not build here"
)
BUILDS = {
    "avx2": (["-mavx2", "-mfma", "-mf16c"], "avx2"),
    "avx512": (["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx2", "-mfma", "-mf16c"], "avx512f"),
    "portable": ([], None),
}
"""Per build: its flags, and the CPU flag it needs."""


def build(isa: str):  # type: ignore[no-untyped-def]
    from lmiserve.rolling_batch.ops.kernel_build import CSRC, build_library

    namespace = f"lmiserve_quant_{isa}"
    build_library(
        f"lmiserve_quant_kernels_{isa}",
        [
            CSRC / name
            for name in (
                "gguf_pack.cpp",
                "quant_linear.cpp",
                "quant_linear_avx2.cpp",
                "quant_linear_amx.cpp",
                "quant_linear_int8.cpp",
            )
        ],
        ["-O3", "-ffast-math", f"-DLMISERVE_OPS_NS={namespace}", *BUILDS[isa][0]],  # load_kernels' flags
        precompiled=False,
    )
    return getattr(torch.ops, namespace)


@pytest.fixture(scope="module", params=sorted(BUILDS))
def ops(request):  # type: ignore[no-untyped-def]
    needs = BUILDS[request.param][1]
    if needs is not None and needs not in cpu_flags():
        pytest.skip(f"this CPU has no {needs}")
    built = build(request.param)
    assert built.quant_linear_isa() == request.param
    return built


NAMES = {0: "q4_0", 1: "q4_1", 2: "q8_0"}
QTYPES = {0: GT.Q4_0, 1: GT.Q4_1, 2: GT.Q8_0}


def weight(kind: int, n: int, k: int):  # type: ignore[no-untyped-def]
    from lmiserve.rolling_batch.quant.weights import BlockWeight

    w = torch.randn(n, k, generator=torch.Generator().manual_seed(kind)).numpy().astype(np.float32)
    return BlockWeight(NAMES[kind], torch.from_numpy(np.ascontiguousarray(quantize(w, QTYPES[kind]))), k)


@pytest.mark.parametrize("kind", sorted(NAMES))
@pytest.mark.parametrize("m", [1, 2, 3, 6, 17, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("n, k", [(11, 96), (37, 1536)])
def test_rows_match_dequantized_weights(  # type: ignore[no-untyped-def]
    ops, kind: int, m: int, dtype: torch.dtype, with_bias: bool, n: int, k: int
) -> None:
    """96 inputs: three blocks (Q4's last pair half empty); N not a whole number of row groups.
    bf16 rows multiply the weights rounded to bf16 (the model's bf16 tensor), as the AVX512_BF16
    build does: within fp32 sums and one bf16 rounding of that product."""
    w = weight(kind, n, k)
    packed = ops.pack_gguf(w.blocks, kind, k)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(7)).to(dtype)
    bias = torch.randn(n) if with_bias else None
    got = ops.linear_gguf(x, packed, kind, bias, 4)
    assert got.dtype == dtype and got.shape == (m, n)
    dense = w.dequantize(torch.float64) if dtype == torch.float32 else w.dequantize(torch.bfloat16).double()
    want = F.linear(x.double(), dense, None if bias is None else bias.double())
    tolerance = dict(rtol=1e-5, atol=1e-4) if dtype == torch.float32 else dict(rtol=2**-8, atol=1e-3)
    torch.testing.assert_close(got.double(), want, **tolerance)


@pytest.mark.parametrize("kind", sorted(NAMES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n, k", [(11, 96), (37, 1536)])
def test_avx2_rows_do_not_depend_on_the_batch(ops, kind: int, dtype: torch.dtype, n: int, k: int) -> None:  # type: ignore[no-untyped-def]
    """Each row of a 17-row product is that row's product alone, bit for bit (the AVX2 build's
    property; the plain C++ one's fp32 rows, under -ffast-math, do not keep it)."""
    if ops.quant_linear_isa() != "avx2":
        pytest.skip("the AVX2 build's property")
    w = weight(kind, n, k)
    packed = ops.pack_gguf(w.blocks, kind, k)
    x = torch.randn(17, k, generator=torch.Generator().manual_seed(3)).to(dtype)
    bias = torch.randn(n)
    batch = ops.linear_gguf(x, packed, kind, bias, 4)
    for i in range(17):
        assert torch.equal(ops.linear_gguf(x[i : i + 1], packed, kind, bias, 4), batch[i : i + 1]), i
    assert torch.equal(ops.linear_gguf(x[5:11], packed, kind, bias, 4), batch[5:11])


@pytest.mark.parametrize("kind", sorted(NAMES))
@pytest.mark.parametrize("n, k", [(13, 96), (37, 576)])
def test_int8_activations_match_the_definition(ops, kind: int, n: int, k: int) -> None:  # type: ignore[no-untyped-def]
    from lmiserve.rolling_batch.quant.int8_activations import linear_int8_activations

    w = weight(kind, n, k)
    packed = ops.pack_gguf_int8(w.blocks, kind, k)
    x = torch.randn(11, k, generator=torch.Generator().manual_seed(9)).to(torch.bfloat16)
    bias = torch.randn(n)
    got = ops.linear_gguf_int8(x, packed, kind, n, bias)
    torch.testing.assert_close(got.double(), linear_int8_activations(x, w, bias, torch.float64), rtol=2**-8, atol=1e-3)
    for i in range(11):
        assert torch.equal(ops.linear_gguf_int8(x[i : i + 1], packed, kind, n, bias), got[i : i + 1]), i
