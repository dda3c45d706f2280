"""The packed bf16 linear kernel built for CPUs without AVX512_BF16: AVX2 + FMA only, and AVX-512F
without BF16, each in a build of its own (its ops under a namespace of their own), against the
same bf16 weights. (The kernels are compiled for the CPU they run on; these builds run the other
classes' code here.) Both paths sum each row's products over the pairs of k in order, the odd k's
first, one FMA each (vdpbf16ps's order), so they equal, bit for bit, fp32 sums formed in that
order and rounded once to bf16."""

from __future__ import annotations

import functools
import importlib.util

import pytest
import torch
import torch.nn.functional as F

from lmiserve.devices import cpu_flags
from lmiserve.rolling_batch.ops.cpu_kernels import load_kernels

pytestmark = pytest.mark.skipif(
    not load_kernels() or importlib.util.find_spec("ninja") is None, reason="the CPU kernels do not build here"
)
BUILDS = {
    "avx2": (["-mavx2", "-mfma", "-mf16c"], "avx2"),
    "avx512": (["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma", "-mf16c"], "avx512f"),
}
KERNEL_SOURCES = ("linear.cpp", "linear_fma.cpp", "linear_amx.cpp", "fused.cpp")
PLAIN, GATE_UP, SWIGLU = 0, 1, 2


@functools.cache
def build(isa: str):  # type: ignore[no-untyped-def]
    from lmiserve.rolling_batch.ops.kernel_build import CSRC, build_library

    namespace = f"lmiserve_linear_{isa}"
    build_library(
        f"lmiserve_linear_kernels_{isa}",
        [CSRC / name for name in KERNEL_SOURCES],
        ["-O3", f"-DLMISERVE_OPS_NS={namespace}", *BUILDS[isa][0]],
        precompiled=False,
    )
    return getattr(torch.ops, namespace)


@pytest.fixture(scope="module", params=sorted(BUILDS))
def ops(request):  # type: ignore[no-untyped-def]
    if BUILDS[request.param][1] not in cpu_flags():
        pytest.skip(f"this CPU has no {BUILDS[request.param][1]}")
    built = build(request.param)
    assert built.linear_bf16_isa() == request.param
    assert built.linear_bf16_supported()
    return built


def in_order(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x W^T (+ bias) for bf16 x and W: fp32 sums over the pairs of k in order, the odd k's product
    before the even one's (each product of two bf16 values is exact in fp32, so one rounding a
    step, as an FMA makes), the bias added, rounded to bf16."""
    xf, wf = x.float(), w.float()
    acc = torch.zeros(x.shape[0], w.shape[0])
    for p in range(0, x.shape[1], 2):
        for i in (p + 1, p):
            acc += xf[:, i : i + 1] * wf[:, i]
    if bias is not None:
        acc += bias.float()
    return acc.bfloat16()


def assert_near_fp32_linear(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> None:
    """Within test_ops_linear's bound of F.linear in fp32 on the same bf16 weights (other order)."""
    expected = F.linear(x.float(), w.float(), None if bias is None else bias.float()).double()
    bound = 2**-8 * expected.abs() + 1e-3 * x.shape[1] ** 0.5
    assert ((y.double() - expected).abs() <= bound).all()


MS = [1, 3, 8, 17, 70]
# K: one stretch, and 1600 (800 pairs: two stretches of 400); N: inside a 16- or 8-wide vector,
# not a multiple of 48
SHAPES = [(64, 50), (576, 100), (1600, 200)]


@pytest.mark.parametrize("m", MS)
@pytest.mark.parametrize("k,n", SHAPES)
@pytest.mark.parametrize("with_bias", [False, True])
def test_plain_product_equals_fp32_sums_in_order(ops, m: int, k: int, n: int, with_bias: bool) -> None:  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(m * 1000 + k + n)
    w = torch.randn(n, k, generator=g).bfloat16()
    x = torch.randn(m, k, generator=g).bfloat16()
    bias = torch.randn(n, generator=g).bfloat16() if with_bias else None
    y = ops.linear_bf16(x, ops.pack_linear_bf16(w), bias, n, PLAIN)
    assert y.dtype == torch.bfloat16 and y.shape == (m, n)
    assert torch.equal(y, in_order(x, w, bias))
    assert_near_fp32_linear(y, x, w, bias)


@pytest.mark.parametrize("m", MS)
@pytest.mark.parametrize("k,units", [(64, 50), (1600, 100)])
def test_gated_gate_up_and_swiglu(ops, m: int, k: int, units: int) -> None:  # type: ignore[no-untyped-def]
    """A gate_up weight packed gated: gate and up in their places equal the fp32 sums in order;
    the SwiGLU (silu(gate) rounded to bf16, times up, rounded) equals the same build's SwiGLU
    kernel on that gate_up, is the same on both builds (AVX2's 8-lane exp is AVX-512's polynomial,
    operation for operation) and is within a bf16 step of torch's. (Not compared with the native
    build's: built with -ffast-math, its exp may end a unit in the last place away, which moves a
    silu lying next to a bf16 rounding boundary.)"""
    g = torch.Generator().manual_seed(m + units)
    w = torch.randn(2 * units, k, generator=g).bfloat16()
    x = torch.randn(m, k, generator=g).bfloat16()
    packed = ops.pack_linear_bf16(w, True)
    gate_up = ops.linear_bf16(x, packed, None, 2 * units, GATE_UP)
    assert torch.equal(gate_up, in_order(x, w))
    act = ops.linear_bf16(x, packed, None, units, SWIGLU)
    assert act.shape == (m, units)
    assert torch.equal(act, ops.swiglu(gate_up))
    if all(flag in cpu_flags() for _, flag in BUILDS.values()):
        other = build("avx2" if ops.linear_bf16_isa() == "avx512" else "avx512")
        assert torch.equal(act, other.linear_bf16(x, other.pack_linear_bf16(w, True), None, units, SWIGLU))
    gate, up = gate_up.float().chunk(2, dim=-1)
    reference = (F.silu(gate).bfloat16().float() * up).bfloat16()
    assert torch.allclose(act.float(), reference.float(), rtol=2**-7, atol=1e-3)


@pytest.mark.parametrize("k", [576, 1600])
def test_a_row_does_not_depend_on_the_batch(ops, k: int) -> None:  # type: ignore[no-untyped-def]
    """Each row of a 17-row product equals the same row multiplied alone, bit for bit."""
    g = torch.Generator().manual_seed(k)
    w = torch.randn(200, k, generator=g).bfloat16()
    x = torch.randn(17, k, generator=g).bfloat16()
    bias = torch.randn(200, generator=g).bfloat16()
    plain, gated = ops.pack_linear_bf16(w), ops.pack_linear_bf16(w, True)
    y = ops.linear_bf16(x, plain, bias, 200, PLAIN)
    act = ops.linear_bf16(x, gated, None, 100, SWIGLU)
    for r in range(17):
        assert torch.equal(ops.linear_bf16(x[r : r + 1], plain, bias, 200, PLAIN), y[r : r + 1])
        assert torch.equal(ops.linear_bf16(x[r : r + 1], gated, None, 100, SWIGLU), act[r : r + 1])


def test_an_fma_only_build_runs_its_fma_tiles_for_every_row_count(ops) -> None:  # type: ignore[no-untyped-def]
    assert ops.linear_bf16_fma_rows() == 1
    ops.set_linear_bf16_fma_rows(1)
    with pytest.raises(RuntimeError, match="one kind of tiles"):
        ops.set_linear_bf16_fma_rows(0)


def test_native_build_names_its_path() -> None:
    isa = torch.ops.lmiserve_cpu.linear_bf16_isa()
    if "avx512_bf16" in cpu_flags():
        assert isa == "avx512_bf16"
    assert torch.ops.lmiserve_cpu.linear_bf16_supported() == (isa != "none")


@pytest.mark.parametrize("build_name", ["native", *sorted(BUILDS)])
@pytest.mark.parametrize("m,k,n", [(1, 576, 100), (17, 1600, 200), (70, 64, 50)])
def test_product_added_to_y(build_name: str, m: int, k: int, n: int) -> None:
    """kAdd: y += x W^T, the product rounded to bf16, then the sum rounded (a bf16 product added)."""
    if build_name == "native":
        ops = torch.ops.lmiserve_cpu
        if not ops.linear_bf16_supported():
            pytest.skip("the native build has no bf16 linear kernel")
    else:
        if BUILDS[build_name][1] not in cpu_flags():
            pytest.skip(f"this CPU has no {BUILDS[build_name][1]}")
        ops = build(build_name)
    g = torch.Generator().manual_seed(m + k)
    w = torch.randn(n, k, generator=g).bfloat16()
    x = torch.randn(m, k, generator=g).bfloat16()
    y = torch.randn(m, n, generator=g).bfloat16()
    packed = ops.pack_linear_bf16(w)
    expected = (ops.linear_bf16(x, packed, None, n, PLAIN).float() + y.float()).bfloat16()
    ops.linear_bf16_add_(y, x, packed)
    assert torch.equal(y, expected)
