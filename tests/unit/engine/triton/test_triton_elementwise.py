"""The Triton cache write and element-wise kernels against the reference ops."""

import pytest
import torch

from lmiserve.rolling_batch.ops.reference import ReferenceOps
from lmiserve.rolling_batch.ops.triton_kernels import add_rms_norm, rms_norm, rotary_, swiglu, write_kv

REF = ReferenceOps()
DEVICE = "cuda:0" if torch.cuda.is_available() else "cpu"


def on_device(fn, *tensors, **kwargs):
    """``fn`` on the test device; tensors (or tuples of them) back on the CPU."""
    out = fn(*(t.to(DEVICE) if isinstance(t, torch.Tensor) else t for t in tensors), **kwargs)
    if isinstance(out, tuple):
        return tuple(o.cpu() for o in out)
    return None if out is None else out.cpu()


HALF = [torch.bfloat16, torch.float16]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_write_kv_stores_each_token_at_its_slot_and_skips_minus_one(dtype):
    g = torch.Generator().manual_seed(0)
    k = torch.randn(6, 3, 40, generator=g).to(dtype)
    v = torch.randn(6, 3, 40, generator=g).to(dtype)
    slots = torch.tensor([5, -1, 17, 0, -1, 63])
    caches = [torch.zeros(4, 16, 3, 40, dtype=dtype) for _ in range(4)]
    dev = [t.to(DEVICE) for t in (k, v, caches[0], caches[1], slots)]
    write_kv(*dev)
    caches[0], caches[1] = dev[2].cpu(), dev[3].cpu()
    REF.write_kv(k, v, caches[2], caches[3], slots)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])
    assert caches[0].count_nonzero() == 4 * 3 * 40


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("width", [64, 576, 100])
def test_rms_norm_rounds_as_the_reference(dtype, width):
    g = torch.Generator().manual_seed(width)
    x = (torch.randn(5, width, generator=g) * 3).to(dtype)
    w = torch.randn(width, generator=g).to(dtype)
    y, rstd = on_device(rms_norm, x, w, 1e-5)
    ry, rrstd = REF.rms_norm(x, w, 1e-5)
    assert torch.allclose(rstd, rrstd, rtol=1e-5)
    # the same rounding steps; the fp32 sum of squares may round its last bit differently
    assert (y.float() - ry.float()).abs().max() <= ry.float().abs().max() * 2**-7


@pytest.mark.parametrize("dtype", HALF)
def test_add_rms_norm_writes_the_sum_over_the_residual(dtype):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(4, 96, generator=g).to(dtype)
    residual = torch.randn(4, 96, generator=g).to(dtype)
    w = torch.randn(96, generator=g).to(dtype)
    want_y, want_h = REF.add_rms_norm(x, residual.clone(), w, 1e-6)
    residual = residual.to(DEVICE)
    y, h = add_rms_norm(x.to(DEVICE), residual, w.to(DEVICE), 1e-6)
    assert h is residual and torch.equal(h.cpu(), want_h)
    y = y.cpu()
    assert (y.float() - want_y.float()).abs().max() <= want_y.float().abs().max() * 2**-7


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("heads,kv_heads,dim", [(9, 3, 64), (4, 1, 128), (6, 2, 48)])
def test_rotary_equals_the_reference(dtype, heads, kv_heads, dim):
    g = torch.Generator().manual_seed(dim)
    q = torch.randn(7, heads, dim, generator=g).to(dtype)
    k = torch.randn(7, kv_heads, dim, generator=g).to(dtype)
    angles = torch.rand(7, dim // 2, generator=g) * 6
    cos = torch.cat([angles.cos(), angles.cos()], -1).to(dtype)
    sin = torch.cat([angles.sin(), angles.sin()], -1).to(dtype)
    want_q, want_k = REF.rotary(q, k, cos, sin)
    got_q, got_k = on_device(rotary_, q, k, cos, sin)
    assert torch.equal(got_q, want_q) and torch.equal(got_k, want_k)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("width", [1536, 100])
def test_swiglu_equals_the_reference(dtype, width):
    g = torch.Generator().manual_seed(width)
    gate_up = (torch.randn(3, 2 * width, generator=g) * 4).to(dtype)
    got, want = on_device(swiglu, gate_up), REF.swiglu(gate_up)
    assert got.shape == want.shape
    # silu rounds once in both; exp may differ in its last fp32 bit
    assert (got.float() - want.float()).abs().max() <= want.float().abs().max() * 2**-7
