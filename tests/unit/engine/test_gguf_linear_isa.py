"""The GGUF-block kernel built for other CPU classes than this one's: AVX2 only (no AVX-512) and
plain C++, each in a build of its own, against the weights dequantized in fp32. (The kernels are
compiled for the CPU they run on; these builds run the other classes' code here.)"""

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
BUILDS = {"avx2": ["-mavx2", "-mfma", "-mf16c"], "portable": []}


def build(isa: str):  # type: ignore[no-untyped-def]
    from torch.utils.cpp_extension import load

    from lmiserve.rolling_batch.ops.cpu_kernels import _CSRC

    namespace = f"lmiserve_quant_{isa}"
    load(
        name=f"lmiserve_quant_kernels_{isa}",
        sources=[str(_CSRC / "quant_linear.cpp"), str(_CSRC / "quant_linear_amx.cpp")],
        extra_cflags=["-O3", f"-DLMISERVE_OPS_NS={namespace}", *BUILDS[isa]],
        is_python_module=False,
        verbose=False,
    )
    return getattr(torch.ops, namespace)


@pytest.fixture(scope="module", params=sorted(BUILDS))
def ops(request):  # type: ignore[no-untyped-def]
    if request.param == "avx2" and "avx2" not in cpu_flags():
        pytest.skip("this CPU has no AVX2")
    built = build(request.param)
    assert built.quant_linear_isa() == request.param
    return built


@pytest.mark.parametrize("kind, qtype", [(0, GT.Q4_0), (1, GT.Q4_1), (2, GT.Q8_0)])
@pytest.mark.parametrize("m", [1, 3, 6])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_match_dequantized_weights(ops, kind: int, qtype, m: int, dtype: torch.dtype) -> None:  # type: ignore[no-untyped-def]
    from lmiserve.rolling_batch.quant.weights import BlockWeight

    names = {0: "q4_0", 1: "q4_1", 2: "q8_0"}
    w = torch.randn(11, 96, generator=torch.Generator().manual_seed(kind)).numpy().astype(np.float32)
    weight = BlockWeight(names[kind], torch.from_numpy(np.ascontiguousarray(quantize(w, qtype))), 96)
    packed = ops.pack_gguf(weight.blocks, kind, 96)
    x = torch.randn(m, 96, generator=torch.Generator().manual_seed(7)).to(dtype)
    bias = torch.randn(11)
    got = ops.linear_gguf(x, packed, kind, bias, 4)
    assert got.dtype == dtype
    want = F.linear(x.double(), weight.dequantize(torch.float64), bias.double())
    tolerance = dict(rtol=1e-5, atol=1e-4) if dtype == torch.float32 else dict(rtol=2e-2, atol=5e-2)
    torch.testing.assert_close(got.double(), want, **tolerance)
