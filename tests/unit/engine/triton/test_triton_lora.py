"""The Triton LoRA kernels (split-K shrink, expand over a fixed number of segments) against the
reference ops: unused segments, several adapters, a bucket's padding rows, and a row's result
whatever else is in the step."""

import numpy as np
import pytest
import torch

from lmiserve.rolling_batch.ops.metadata import LoraStep
from lmiserve.rolling_batch.ops.reference import ReferenceOps
from lmiserve.rolling_batch.ops.triton_kernels import lora as kernels
from lmiserve.rolling_batch.runner.lora_buffers import LoraBuffers
from lmiserve.rolling_batch.runner.step_inputs import StepArrays, lora_runs

DEVICE = "cuda:0" if torch.cuda.is_available() else "cpu"


def _step(q_lens, slots) -> StepArrays:
    t = sum(q_lens)
    cu = np.zeros(len(q_lens) + 1, dtype=np.int32)
    np.cumsum(q_lens, out=cu[1:])
    zeros = np.zeros(t, dtype=np.int64)
    return StepArrays(zeros, zeros, zeros, np.zeros((len(q_lens), 1), np.int32), cu,
                      np.ones(len(q_lens), np.int32), 0, np.array(slots, dtype=np.int32))  # fmt: skip


def _factors(rows, fan_in, fan_out, rank, slots, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, fan_in, generator=g).to(dtype)
    y = torch.randn(rows, fan_out, generator=g).to(dtype)
    a = (torch.randn(slots, rank, fan_in, generator=g) / fan_in**0.5).to(dtype)
    b = torch.randn(slots, rank, fan_out, generator=g).to(dtype)
    return x, y, a, b


def _close(got, want, dtype):
    if dtype == torch.float32:
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-4)
    else:  # u is rounded to bf16 between the products, as the reference does; sums in another order
        assert ((got.float() - want.float()).abs() <= want.float().abs() * 2**-5 + 0.1).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "q_lens,slots,fan_in,fan_out,rank",
    [
        ([1, 1, 1, 1, 1], [1, 0, -1, 1, 3], 64, 48, 16),  # decodes, slot 1 twice apart, a base row
        ([37, 3, 50], [2, -1, 0], 1100, 72, 24),  # prompt chunks; the shrink splits 1100 in three
    ],
)
def test_a_graphs_buffers_give_the_reference_products(dtype, q_lens, slots, fan_in, fan_out, rank):
    """The step in buffers of a larger bucket (4 segments, 2 of them or more unused; rows past
    the step's are padding that no segment names): its rows equal the reference, padding and
    base rows are untouched."""
    arrays = _step(q_lens, slots)
    t = arrays.num_tokens
    bucket = t + 5
    x, y, a, b = _factors(bucket, fan_in, fan_out, rank, 4, dtype, seed=t)
    want = y.clone()
    runs = lora_runs(arrays)
    ReferenceOps().lora_add(want, x, a, b, LoraStep(runs))
    buffers = LoraBuffers(4, bucket, rank, DEVICE)
    assert buffers.fill(arrays) == runs
    assert kernels.split_k(fan_in)[0] == (3 if fan_in == 1100 else 1)
    got = y.clone().to(DEVICE)
    kernels.lora_add(got, x.to(DEVICE), a.to(DEVICE), b.to(DEVICE), buffers.index(bucket))
    got = got.cpu()
    covered = torch.zeros(bucket, dtype=torch.bool)
    for _, first, end in runs:
        covered[first:end] = True
    assert torch.equal(got[~covered], y[~covered])  # base and padding rows are untouched
    _close(got, want, dtype)


def test_empty_segments_add_nothing():
    """A step without adapters in buffers a step with adapters filled before."""
    x, y, a, b = _factors(6, 32, 16, 8, 2, torch.float32, seed=3)
    buffers = LoraBuffers(2, 6, 8, DEVICE)
    buffers.fill(_step([1] * 6, [0, 1, 0, 1, 0, 1]))
    assert buffers.fill(None) == [] and buffers.fill(None) == []
    assert buffers.fills == 2  # the second step without adapters copies nothing
    got = y.clone().to(DEVICE)
    kernels.lora_add(got, x.to(DEVICE), a.to(DEVICE), b.to(DEVICE), buffers.index(6))
    assert torch.equal(got.cpu(), y)


def test_a_rows_result_does_not_depend_on_the_step():
    """bf16: row 0 (slot 1) alone in a bucket of 1, then among 20 rows of three adapters in a
    bucket of 24: the same bits."""
    x, y, a, b = _factors(24, 700, 40, 16, 3, torch.bfloat16, seed=5)
    dev = [t.clone().to(DEVICE) for t in (x, y, a, b)]
    alone = LoraBuffers(3, 1, 16, DEVICE)
    alone.fill(_step([1], [1]))
    one = dev[1][:1].clone()
    kernels.lora_add(one, dev[0][:1], dev[2], dev[3], alone.index(1))
    batch = LoraBuffers(3, 24, 16, DEVICE)
    batch.fill(_step([1, 1, 1, 17], [1, 0, 2, 1]))
    many = dev[1].clone()
    kernels.lora_add(many, dev[0], dev[2], dev[3], batch.index(24))
    assert torch.equal(many[:1].cpu(), one.cpu())


def test_the_eager_index_and_the_runs_fallback():
    """A step's own index (its slots only, sized by its longest segment) and the index made from
    bare runs give the reference products."""
    from lmiserve.rolling_batch.runner.step_inputs import step_tensors

    arrays = _step([1, 1, 9], [0, -1, 0])
    _, _, meta = step_tensors(arrays, DEVICE)
    index = meta.lora.index
    assert index.slots.tolist() == [0] and index.rows.tolist() == [0] + list(range(2, 11)) and index.max_rows == 10
    x, y, a, b = _factors(11, 48, 24, 8, 1, torch.float32, seed=9)
    want = y.clone()
    ReferenceOps().lora_add(want, x, a, b, LoraStep(lora_runs(arrays)))
    for step in (meta.lora, LoraStep(lora_runs(arrays), DEVICE)):
        got = y.clone().to(DEVICE)
        kernels.lora_add(got, x.to(DEVICE), a.to(DEVICE), b.to(DEVICE), step.device_index())
        _close(got.cpu(), want, torch.float32)


def test_the_tiles_are_fixed():
    """No launch constant depends on the step: only the grid's row programs do (bounded)."""
    assert kernels.row_programs(1) == 1 and kernels.row_programs(10_000) == kernels.MAX_ROW_PROGRAMS
    assert kernels.split_k(4096) == (8, 512) and kernels.split_k(64) == (1, 64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_fused_projections_parts_read_only_their_own_rows(dtype):
    """q, k and v parts of rank 4 laid out as the pool does (part p nonzero only in its rows and
    columns, the k part's columns not on a tile bound): with the parts hint the expand skips the
    other parts' rows and gives the same bits as without it, and the reference's products."""
    rank, bounds = 4, (0, 80, 104, 128)
    x, y, a, b = _factors(6, 48, 128, 3 * rank, 2, dtype, seed=11)
    for p in range(3):  # zeros outside each part's own block of B
        b[:, p * rank : (p + 1) * rank, : bounds[p]] = 0
        b[:, p * rank : (p + 1) * rank, bounds[p + 1] :] = 0
    arrays = _step([2, 1, 3], [1, -1, 0])
    want = y.clone()
    ReferenceOps().lora_add(want, x, a, b, LoraStep(lora_runs(arrays)))
    buffers = LoraBuffers(2, 6, 3 * rank, DEVICE)
    buffers.fill(arrays)
    outs = []
    for parts in (None, bounds):
        got = y.clone().to(DEVICE)
        kernels.lora_add(got, x.to(DEVICE), a.to(DEVICE), b.to(DEVICE), buffers.index(6), parts)
        outs.append(got.cpu())
    assert torch.equal(outs[0], outs[1])
    _close(outs[1], want, dtype)
    assert kernels._part_bounds(bounds, 3 * rank, 128) == (rank, 80, 104)
    assert kernels._part_bounds((0, 64, 128), 2 * rank, 128) == (rank, 64, 128)
    assert kernels._part_bounds(None, rank, 128) == (rank, 128, 128)
