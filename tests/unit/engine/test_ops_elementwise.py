"""The ops that are not attention: K/V writes, the fused rotation and store, norms, activations,
sampling reductions, and the kernels' build."""

import pytest
import torch

from lmiserve.rolling_batch.ops.cpu import CpuOps
from lmiserve.rolling_batch.ops.reference import ReferenceOps

from .test_ops import BS, OPS


@pytest.mark.parametrize("ops", OPS, ids=lambda o: o.name)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_write_kv_uses_slot_formula_and_skips_minus_one(ops, dtype):
    k_cache = torch.zeros(4, BS, 2, 8, dtype=dtype)
    v_cache = torch.zeros(4, BS, 2, 8, dtype=dtype)
    k = torch.arange(3 * 16, dtype=torch.float32).view(3, 2, 8).to(dtype)
    v = -k
    table = [2, 0]
    positions = [0, 17, 5]
    slots = torch.tensor([table[p // BS] * BS + p % BS for p in positions[:2]] + [-1])
    ops.write_kv(k, v, k_cache, v_cache, slots)
    assert torch.equal(k_cache[2, 0], k[0]) and torch.equal(k_cache[0, 1], k[1])
    assert torch.equal(v_cache[0, 1], v[1])
    assert int((k_cache != 0).any(-1).any(-1).sum()) == 2  # the third token was not stored


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("dim", [16, 48, 80, 128])
def test_rotate_and_store_rotates_queries_and_keys_and_stores_keys_and_values(dtype, dim):
    """From the fused projection: the queries rotated out, the keys rotated and the values stored
    at their slots (slot -1: not stored); the CPU's one-pass kernel gives the bits of its own
    split, rotary and write_kv ops. Half a head of 48 or 80 ends in a part of a vector."""
    heads, kv_heads, tokens = 6, 2, 5
    g = torch.Generator().manual_seed(3)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim, generator=g).to(dtype)
    angles = torch.randn(tokens, dim // 2, generator=g)
    cos, sin = torch.cat([angles.cos()] * 2, -1).to(dtype), torch.cat([angles.sin()] * 2, -1).to(dtype)
    slots = torch.tensor([3, 17, -1, 0, 40])
    results = []
    cpu = CpuOps()
    fused = cpu.rotate_and_store
    unfused = lambda *args: ReferenceOps.rotate_and_store(cpu, *args)  # noqa: E731
    for run in (ReferenceOps().rotate_and_store, unfused, fused):
        k_cache = torch.zeros(4, BS, kv_heads, dim, dtype=dtype)
        v_cache = torch.zeros(4, BS, kv_heads, dim, dtype=dtype)
        q = run(qkv, heads, cos, sin, k_cache, v_cache, slots)
        results.append((q, k_cache, v_cache))
        assert q.shape == (tokens, heads, dim) and q.is_contiguous()
        q_ref, k_ref = ReferenceOps().rotary(
            qkv[:, : heads * dim].reshape(tokens, heads, dim),
            qkv[:, heads * dim : (heads + kv_heads) * dim].reshape(tokens, kv_heads, dim),
            cos,
            sin,
        )
        assert torch.allclose(q.float(), q_ref.float(), rtol=2**-6, atol=1e-2)
        flat_k, flat_v = k_cache.view(-1, kv_heads, dim), v_cache.view(-1, kv_heads, dim)
        for t, slot in enumerate(slots.tolist()):
            if slot >= 0:
                assert torch.allclose(flat_k[slot].float(), k_ref[t].float(), rtol=2**-6, atol=1e-2)
                assert torch.equal(flat_v[slot], qkv[t, (heads + kv_heads) * dim :].view(kv_heads, dim))
        assert int((flat_k != 0).any(-1).any(-1).sum()) == 4  # the token with slot -1 was not stored
    for a, b in zip(results[1], results[2]):
        assert torch.equal(a, b)


def test_rotate_and_store_contract_refuses_a_projection_of_the_wrong_width():
    from lmiserve.rolling_batch.ops.contract import CheckedOps, ContractError

    k_cache, v_cache = torch.zeros(4, BS, 2, 16), torch.zeros(4, BS, 2, 16)
    cos = sin = torch.ones(3, 16)
    with pytest.raises(ContractError, match="qkv must be"):
        CheckedOps(CpuOps()).rotate_and_store(torch.zeros(3, 7 * 16), 4, cos, sin, k_cache, v_cache, torch.arange(3))


def test_cpu_write_kv_refuses_a_slot_outside_the_cache():
    k_cache = torch.zeros(2, BS, 2, 8, dtype=torch.bfloat16)
    k = torch.ones(1, 2, 8, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="outside the cache"):
        CpuOps().write_kv(k, k, k_cache, k_cache.clone(), torch.tensor([2 * BS]))
    assert not k_cache.any()


def test_rms_norm_returns_rstd():
    x = torch.randn(5, 64)
    w = torch.rand(64)
    y, rstd = ReferenceOps().rms_norm(x, w, 1e-6)
    expected_rstd = 1 / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    assert torch.allclose(rstd, expected_rstd) and torch.allclose(y, w * x * expected_rstd, atol=1e-6)


def test_rotary_half_and_interleaved_agree_on_pairs():
    dim = 8
    pos = torch.arange(3).float().unsqueeze(1)
    inv = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
    freqs = pos * inv
    half_cos, half_sin = torch.cat([freqs, freqs], -1).cos(), torch.cat([freqs, freqs], -1).sin()
    inter_cos, inter_sin = freqs.repeat_interleave(2, -1).cos(), freqs.repeat_interleave(2, -1).sin()
    x = torch.randn(3, 1, dim)
    ops = ReferenceOps()
    half_q, _ = ops.rotary(x, x, half_cos, half_sin)
    # the same rotation expressed in the interleaved layout
    perm = torch.stack([torch.arange(dim // 2), torch.arange(dim // 2) + dim // 2], -1).flatten()
    inter_q, _ = ops.rotary(x[..., perm], x[..., perm], inter_cos, inter_sin, interleaved=True)
    assert torch.allclose(half_q[..., perm], inter_q, atol=1e-6)
    # rotation keeps the norm of each pair
    assert torch.allclose(half_q.norm(dim=-1), x.norm(dim=-1), atol=1e-5)


def test_swiglu():
    gu = torch.randn(4, 10)
    assert torch.allclose(ReferenceOps().swiglu(gu), torch.nn.functional.silu(gu[:, :5]) * gu[:, 5:])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fused_half_precision_ops_match_reference(dtype):
    ref, cpu = ReferenceOps(), CpuOps()
    assert cpu.kernels
    x = torch.randn(7, 96).to(dtype)
    w = (torch.rand(96) + 0.5).to(dtype)
    y_ref, rstd_ref = ref.rms_norm(x, w, 1e-5)
    y, rstd = cpu.rms_norm(x, w, 1e-5)
    assert torch.allclose(y.float(), y_ref.float(), atol=2e-2, rtol=1e-2)
    assert torch.allclose(rstd, rstd_ref, rtol=1e-3)

    residual = torch.randn(7, 96).to(dtype)
    y_ref, h_ref = ref.add_rms_norm(x, residual.clone(), w, 1e-5)
    y, h = cpu.add_rms_norm(x, residual.clone(), w, 1e-5)
    assert torch.equal(h, h_ref)
    assert torch.allclose(y.float(), y_ref.float(), atol=2e-2, rtol=1e-2)

    q = torch.randn(5, 4, 16).to(dtype)
    k = torch.randn(5, 2, 16).to(dtype)
    angles = torch.rand(5, 8) * 6
    cos = torch.cat([angles, angles], -1).cos().to(dtype)
    sin = torch.cat([angles, angles], -1).sin().to(dtype)
    q_ref, k_ref = ref.rotary(q.clone(), k.clone(), cos, sin)
    q_out, k_out = cpu.rotary(q.clone(), k.clone(), cos, sin)
    assert torch.allclose(q_out.float(), q_ref.float(), atol=3e-2)
    assert torch.allclose(k_out.float(), k_ref.float(), atol=3e-2)

    gu = torch.randn(3, 40).to(dtype)
    assert torch.allclose(cpu.swiglu(gu).float(), ref.swiglu(gu).float(), atol=2e-2, rtol=1e-2)


@pytest.mark.parametrize("rows,dim", [(1, 576), (3, 40), (33, 72), (190, 576)])
def test_bf16_norms_round_as_the_reference_in_every_lane(rows, dim):
    """The CPU kernels' bf16 norms, in whole vectors and in a row's last part of one: the residual
    sum is the reference's to the bit, and every output is the reference's or, where the two
    roundings of x rstd fall on either side of a bf16 step (rstd summed in another order), one
    step from it; the rstd agrees to fp32's rounding."""
    ref, cpu = ReferenceOps(), CpuOps()
    assert cpu.kernels
    g = torch.Generator().manual_seed(rows * dim)
    x = torch.randn(rows, dim, generator=g).bfloat16()
    residual = torch.randn(rows, dim, generator=g).bfloat16()
    w = (torch.rand(dim, generator=g) + 0.5).bfloat16()

    def within_a_step(got: torch.Tensor, want: torch.Tensor) -> None:
        step = want.float().abs() * 2**-7 + 1e-30
        diff = (got.float() - want.float()).abs()
        assert bool((diff <= 2 * step).all()), float((diff / step).max())
        assert float((diff > 0).float().mean()) < 0.02  # nearly all to the bit

    y, rstd = cpu.rms_norm(x, w, 1e-5)
    y_ref, rstd_ref = ref.rms_norm(x, w, 1e-5)
    within_a_step(y, y_ref)
    assert torch.allclose(rstd, rstd_ref, rtol=2**-20)
    y, h = cpu.add_rms_norm(x, residual.clone(), w, 1e-5)
    y_ref, h_ref = ref.add_rms_norm(x, residual.clone(), w, 1e-5)
    assert torch.equal(h, h_ref)
    within_a_step(y, y_ref)


def test_argmax_logsumexp_kernel():
    logits = torch.randn(4, 1000)
    logits[2, 17] = 50.0
    idx, lse = CpuOps().argmax_logsumexp(logits)
    assert torch.equal(idx, logits.argmax(-1)) and int(idx[2]) == 17
    assert torch.allclose(lse, torch.logsumexp(logits, -1), atol=1e-5)


def test_a_kernel_build_lock_left_by_a_killed_build_is_removed_once_no_builder_holds_the_guard(tmp_path):
    """A build killed mid-way leaves torch's lock file: the next loader removes it at once (its
    builder no longer holds the guard) instead of waiting on it. While a live process holds the
    guard, a loader waits for it to finish first."""
    import subprocess
    import sys

    from lmiserve.rolling_batch.ops.kernel_build import build_guard

    (tmp_path / "lock").touch()  # left by a killed build: no process holds the guard
    with build_guard(tmp_path):
        assert not (tmp_path / "lock").exists()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_GUARD, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )  # holds the guard, building (its lock file exists), until told to finish
    assert holder.stdout.readline().strip() == "building"
    done = tmp_path / "done"
    finisher = subprocess.Popen(
        [sys.executable, "-c", f"import time, pathlib; time.sleep(0.5); pathlib.Path({str(done)!r}).touch()"]
    )
    with build_guard(tmp_path):
        assert done.exists() and not (tmp_path / "lock").exists()  # it waited for the build to end
    finisher.wait()
    holder.wait()


HOLD_GUARD = """
import pathlib, sys, time
from lmiserve.rolling_batch.ops.kernel_build import build_guard
root = pathlib.Path(sys.argv[1])
with build_guard(root):
    (root / "lock").touch()
    print("building", flush=True)
    while not (root / "done").exists():
        time.sleep(0.05)
    (root / "lock").unlink()
"""
