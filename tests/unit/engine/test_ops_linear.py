"""The CPU linear layers: oneDNN-packed and the C++ bf16 kernel (plain and gated gate_up)."""

import pytest
import torch

from lmiserve.rolling_batch.ops.cpu import CpuOps
from lmiserve.rolling_batch.ops.cpu_kernels import amx_tiles, bf16_linear_kernel, can_pack
from lmiserve.rolling_batch.ops.reference import ReferenceOps

from .thread_shares import assert_same_however_shared


@pytest.mark.parametrize("packing", ["onednn", "default"])
def test_packed_bf16_linear_matches_plain(packing):
    """oneDNN's packed layout (where this CPU's oneDNN runs bf16), and whatever this CPU runs by default."""
    ops = CpuOps()
    if packing == "onednn":
        ops.own_linear = False
        if not can_pack(torch.zeros(1, 2, dtype=torch.bfloat16)):
            pytest.skip("oneDNN runs no bf16 products on this CPU")
    w = torch.randn(96, 64).bfloat16()
    b = torch.randn(96).bfloat16()
    lw = ops.prepare_linear(w, b)
    assert packing != "onednn" or lw.packing == "onednn"
    for m in (1, 7, 33):
        x = torch.randn(m, 64).bfloat16()
        assert torch.allclose(ops.linear(x, lw).float(), torch.nn.functional.linear(x, w, b).float(), atol=1e-2)


own_linear = pytest.mark.skipif(
    not bf16_linear_kernel(), reason="the bf16 linear kernel needs AVX2+FMA or AVX-512 (a build for this class)"
)


@pytest.fixture(params=["vector", "tiles"])
def kernel(request) -> str:
    if request.param == "tiles" and not amx_tiles():
        pytest.skip("AMX tiles: not on this CPU")
    return request.param


def _own(kernel: str = "vector") -> CpuOps:
    """CPU ops that run bf16 weights in the C++ kernel on its vector code, or on its AMX tiles."""
    ops = CpuOps()
    ops.tiles = kernel == "tiles"
    return ops


@own_linear
@pytest.mark.parametrize(
    "rows,k,n,bias",
    [
        (1, 576, 960, False),  # a decode of one sequence: one tile, the next group requested ahead
        (3, 64, 100, True),  # columns that end inside a 16-wide vector
        (8, 576, 48, False),  # one group: nothing ahead to request
        (33, 1536, 576, True),  # five tiles, the last of one row
        (65, 2048, 200, False),  # vector: past 64 rows, nothing ahead, 2 stretches of K; tiles: 8 stretches
        (190, 576, 150, True),  # a prompt; tiles: 2 stretches of K, the next asked ahead, the last tile partial
        (700, 576, 97, True),  # two chunks of rows
        (19, 40, 50, True),  # K not whole AMX tiles: the vector code runs it
    ],
)
def test_cpu_linear_kernel_bf16_matches_fp64(rows, k, n, bias, kernel):
    """The packed bf16 linear kernel: fp32 sums of exact bf16 products, rounded once to bf16."""
    g = torch.Generator().manual_seed(rows)
    w = torch.randn(n, k, generator=g).bfloat16()
    x = torch.randn(rows, k, generator=g).bfloat16()
    b = torch.randn(n, generator=g).bfloat16() if bias else None
    lw = _own(kernel).prepare_linear(w, b)
    assert lw.packing == "lmiserve"
    y = _own(kernel).linear(x, lw)
    expected = x.double() @ w.double().T + (b.double() if bias else 0)
    assert y.dtype == torch.bfloat16 and y.shape == (rows, n)
    # one bf16 rounding (2**-9 relative) over fp32 sums of up to 2048 products
    assert ((y.double() - expected).abs() <= 2**-8 * expected.abs() + 1e-3 * k**0.5).all()
    # a row's result does not depend on the other rows of the product
    for r in (0, rows - 1):
        assert torch.equal(_own(kernel).linear(x[r : r + 1], lw), y[r : r + 1])


@own_linear
@pytest.mark.parametrize("rows,n", [(33, 960), (700, 97)])
def test_the_product_does_not_depend_on_how_threads_share_it(rows, n, kernel):
    """More threads than cores: a thread the system stops has its share finished by the others,
    and every output is still the one a single thread computes."""
    g = torch.Generator().manual_seed(n)
    w = torch.randn(n, 576, generator=g).bfloat16()
    x = torch.randn(rows, 576, generator=g).bfloat16()
    lw = _own(kernel).prepare_linear(w, None)
    assert_same_however_shared(lambda: _own(kernel).linear(x, lw))


@own_linear
@pytest.mark.parametrize("rows,k,units", [(1, 576, 1536), (9, 64, 50), (17, 576, 44), (70, 2048, 100)])
def test_cpu_gated_gate_up_gives_the_plain_product_and_its_swiglu(rows, k, units, kernel):
    """A gate_up weight packed gated (24 units' gate and up columns a group): linear() still gives
    gate_up in its own column order, equal to the plain packing's, and gate_up_swiglu() gives the
    SwiGLU kernel's answer on it, without gate_up written out; 50 and 44 units end inside a group
    (2 and 20 units in the last), and odd row counts leave a row without a partner."""
    g = torch.Generator().manual_seed(units)
    w = torch.randn(2 * units, k, generator=g).bfloat16()
    x = torch.randn(rows, k, generator=g).bfloat16()
    ops = _own(kernel)
    plain, gated = ops.prepare_linear(w), ops.prepare_gate_up(w)
    assert (plain.packing, gated.packing) == ("lmiserve", "lmiserve-gated")
    gate_up = ops.linear(x, plain)
    assert torch.equal(ops.linear(x, gated), gate_up)
    act = ops.gate_up_swiglu(x, gated)
    assert act.shape == (rows, units) and torch.equal(act, ops.swiglu(gate_up))
    # and within a bf16 step of torch's silu(gate) * up on the same gate_up
    assert torch.allclose(act.float(), ReferenceOps().swiglu(gate_up).float(), rtol=2**-7, atol=1e-3)


@own_linear
def test_cpu_linear_kernel_refuses_a_mismatched_input():
    lw = _own().prepare_linear(torch.randn(96, 64).bfloat16())
    with pytest.raises(RuntimeError, match="features"):
        torch.ops.lmiserve_cpu.linear_bf16(torch.randn(2, 62).bfloat16(), lw.packed, None, 96)
    with pytest.raises(RuntimeError, match="even K"):
        torch.ops.lmiserve_cpu.pack_linear_bf16(torch.randn(8, 7).bfloat16())
