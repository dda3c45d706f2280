"""The CPU's fused mixture-of-experts op against the reference (loop over experts)."""

import pytest
import torch

from lmiserve.rolling_batch.ops.cpu import CpuOps
from lmiserve.rolling_batch.ops.reference import ReferenceOps


def _case(tokens, hidden, inter, experts, k, dtype, seed=0, skip_experts=()):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=g).to(dtype)
    w13 = (torch.randn(experts, 2 * inter, hidden, generator=g) * hidden**-0.5).to(dtype)
    w2 = (torch.randn(experts, hidden, inter, generator=g) * inter**-0.5).to(dtype)
    allowed = torch.tensor([e for e in range(experts) if e not in skip_experts])
    scores = torch.rand(tokens, len(allowed), generator=g)
    ids = allowed[scores.topk(k, dim=-1).indices].to(torch.int32)
    weights = torch.softmax(torch.randn(tokens, k, generator=g), dim=-1)
    return x, weights, ids, w13, w2


@pytest.mark.parametrize(
    "dtype,atol,rtol", [(torch.float32, 1e-5, 1e-5), (torch.bfloat16, 3e-2, 3e-2)], ids=["fp32", "bf16"]
)
@pytest.mark.parametrize(
    "tokens,hidden,inter,experts,k",
    [(1, 64, 32, 4, 2), (7, 64, 48, 4, 2), (33, 96, 40, 8, 3), (5, 70, 18, 6, 1), (64, 128, 64, 16, 2)],
)
def test_fused_moe_matches_reference(dtype, atol, rtol, tokens, hidden, inter, experts, k):
    cpu = CpuOps()
    if not cpu.kernels:
        pytest.skip("no C++ compiler here")
    ref = ReferenceOps()
    x, weights, ids, w13, w2 = _case(tokens, hidden, inter, experts, k, dtype, skip_experts=(1,))
    expected = ref.fused_moe(x, weights, ids, ref.prepare_experts(w13, w2))
    got = cpu.fused_moe(x, weights, ids, cpu.prepare_experts(w13, w2))
    assert got.dtype == dtype and got.shape == x.shape
    torch.testing.assert_close(got.float(), expected.float(), atol=atol, rtol=rtol)


def test_fused_moe_rows_do_not_depend_on_the_batch():
    cpu = CpuOps()
    if not cpu.kernels:
        pytest.skip("no C++ compiler here")
    x, weights, ids, w13, w2 = _case(24, 64, 32, 4, 2, torch.bfloat16, seed=3)
    experts = cpu.prepare_experts(w13, w2)
    whole = cpu.fused_moe(x, weights, ids, experts)
    for t in (0, 5, 23):
        alone = cpu.fused_moe(x[t : t + 1], weights[t : t + 1], ids[t : t + 1], experts)
        assert torch.equal(alone[0], whole[t])


def test_reference_matches_a_dense_loop():
    x, weights, ids, w13, w2 = _case(9, 32, 16, 4, 2, torch.float32, seed=5)
    ref = ReferenceOps()
    got = ref.fused_moe(x, weights, ids, ref.prepare_experts(w13, w2))
    expected = torch.zeros_like(x)
    for t in range(9):
        for j in range(2):
            e = int(ids[t, j])
            gate, up = (w13[e] @ x[t]).chunk(2)
            expected[t] += weights[t, j] * (w2[e] @ (torch.nn.functional.silu(gate) * up))
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_wrappers_pass_the_op_through():
    from lmiserve.rolling_batch.ops.batch_invariant import BatchInvariantOps
    from lmiserve.rolling_batch.ops.contract import CheckedOps
    from lmiserve.rolling_batch.ops.interface import OP_NAMES

    assert {"prepare_experts", "fused_moe"} <= set(OP_NAMES)
    ref = ReferenceOps()
    for wrapper in (CheckedOps(ref), BatchInvariantOps(ref)):
        x, weights, ids, w13, w2 = _case(5, 32, 16, 4, 2, torch.float32)
        experts = wrapper.prepare_experts(w13, w2)
        torch.testing.assert_close(wrapper.fused_moe(x, weights, ids, experts), ref.fused_moe(x, weights, ids, experts))
