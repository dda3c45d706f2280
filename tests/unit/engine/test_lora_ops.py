"""``lora_add``, the ops' LoRA product, on every ops implementation the CPU can run: each run of
rows gets its slot's ``B @ A`` update and nothing else changes."""

import pytest
import torch

from lmiserve.rolling_batch.ops import ContractError, select_ops
from lmiserve.rolling_batch.ops.batch_invariant import BatchInvariantOps
from lmiserve.rolling_batch.ops.cpu import CpuOps
from lmiserve.rolling_batch.ops.cpu_kernels import amx_tiles
from lmiserve.rolling_batch.ops.metadata import LoraStep
from lmiserve.rolling_batch.ops.reference import ReferenceOps

RUNS = [(2, 0, 3), (0, 3, 4), (2, 6, 11)]  # rows 4..5 and 11 have no adapter


def _inputs(dtype=torch.float32, rows=12, fan_in=40, fan_out=24, slots=3, rank=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, fan_in, generator=g).to(dtype)
    y = torch.randn(rows, fan_out, generator=g).to(dtype)
    a = torch.randn(slots, rank, fan_in, generator=g).to(dtype)
    b = torch.randn(slots, rank, fan_out, generator=g).to(dtype)
    return y, x, a, b


def _dense(y, x, a, b, runs):
    want = y.clone().double()
    for slot, first, end in runs:
        want[first:end] += x[first:end].double() @ a[slot].double().t() @ b[slot].double()
    return want


@pytest.mark.parametrize("name", ["reference", "cpu"])
def test_each_run_gets_its_slots_update(name):
    y, x, a, b = _inputs()
    out = y.clone()
    select_ops("cpu", name).lora_add(out, x, a, b, LoraStep(RUNS))
    assert torch.allclose(out.double(), _dense(y, x, a, b, RUNS), atol=1e-4)
    assert torch.equal(out[4:6], y[4:6]) and torch.equal(out[11], y[11])


@pytest.mark.parametrize("fan_in", [40, 64])  # 64: whole AMX tiles, which the CPU ops use where they can
@pytest.mark.parametrize("name", ["reference", "cpu"])
def test_bf16_rounds_like_the_two_products_in_bf16(name, fan_in):
    """As peft in bf16: ``A @ x`` rounded to bf16, then ``B @`` that added to the output, which
    is rounded once more; within one bf16 rounding of that (the reference ops and the C++ kernels)."""
    y, x, a, b = _inputs(torch.bfloat16, fan_in=fan_in)
    out = y.clone()
    select_ops("cpu", name).lora_add(out, x, a, b, LoraStep(RUNS))
    want = y.float().clone()
    for slot, first, end in RUNS:
        u = (x[first:end].float() @ a[slot].float().t()).bfloat16().float()
        want[first:end] += u @ b[slot].float()
    assert ((out.float() - want).abs() <= want.abs() * 2**-7 + 2e-2).all()


def test_a_run_of_no_adapter_slots_adds_nothing():
    y, x, a, b = _inputs()
    a[1].zero_()
    b[1].zero_()
    out = y.clone()
    ReferenceOps().lora_add(out, x, a, b, LoraStep([(1, 0, 12)]))
    assert torch.equal(out, y)


def test_the_deterministic_ops_give_a_row_the_same_bits_in_any_batch():
    ops = BatchInvariantOps(ReferenceOps())
    y, x, a, b = _inputs(torch.bfloat16, rows=40, fan_in=96, fan_out=64)
    alone = y[7:8].clone()
    ops.lora_add(alone, x[7:8], a, b, LoraStep([(1, 0, 1)]))
    batched = y.clone()
    ops.lora_add(batched, x, a, b, LoraStep([(1, 0, 40)]))
    assert torch.equal(batched[7:8], alone)


def test_the_contract_refuses_runs_out_of_order_or_out_of_range():
    ops = select_ops("cpu", "reference")
    y, x, a, b = _inputs()
    for runs in ([(0, 3, 4), (1, 0, 2)], [(3, 0, 2)], [(0, 10, 13)], [(0, 2, 2)]):
        with pytest.raises(ContractError):
            ops.lora_add(y.clone(), x, a, b, LoraStep(runs))
    with pytest.raises(ContractError, match="shapes"):
        ops.lora_add(y.clone(), x[:, :30], a, b, LoraStep(RUNS))


def test_npu_ops_use_one_grouped_matmul_per_factor(fake_npu):
    from lmiserve.rolling_batch.ops.npu import NpuOps

    y, x, a, b = _inputs(torch.bfloat16)
    out = y.clone()
    NpuOps().lora_add(out, x, a, b, LoraStep(RUNS))
    calls = [kwargs for name, kwargs in fake_npu.CALLS if name == "npu_grouped_matmul"]
    assert len(calls) == 2 and all(c["group_type"] == 0 and c["split_item"] == 3 for c in calls)
    assert calls[0]["group_list"] == [3, 4, 9]
    want = y.clone()
    ReferenceOps().lora_add(want, x, a, b, LoraStep(RUNS))
    assert ((out.float() - want.float()).abs() <= want.float().abs() * 2**-6 + 0.05).all()
    assert torch.equal(out[4:6], y[4:6])


@pytest.mark.parametrize("fan_in", [40, 64])  # 64 in bf16: on AMX tiles, B part by part
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_cpu_kernel_skips_the_zeros_between_a_fused_projections_parts(dtype, fan_in):
    """q, k and v in one B, each part nonzero only in its own rows and columns: the kernel told
    the parts gives what the plain products give."""
    y, x, a, b = _inputs(dtype, fan_in=fan_in, fan_out=24, rank=12)
    parts = (0, 12, 18, 24)
    mask = torch.zeros_like(b)
    for p in range(3):
        mask[:, p * 4 : (p + 1) * 4, parts[p] : parts[p + 1]] = 1
    b = b * mask
    want, got = y.clone(), y.clone()
    ReferenceOps().lora_add(want, x, a, b, LoraStep(RUNS))
    select_ops("cpu", "cpu").lora_add(got, x, a, b, LoraStep(RUNS), parts)
    tolerance = 1e-4 if dtype == torch.float32 else 2e-2
    assert ((got.float() - want.float()).abs() <= want.float().abs() * 2**-7 + tolerance).all()


@pytest.mark.skipif(not amx_tiles(), reason="AMX tiles: not on this CPU")
@pytest.mark.parametrize("row_invariant", [False, True], ids=["default", "deterministic"])
def test_the_amx_kernel_adds_each_runs_update_and_nothing_else(row_invariant):
    """Runs of 1 (the row-by-row kernel's, by default), 20 (two tiles of rows) and 5 rows, three
    slots of width 8 (padded to a tile): within one bf16 rounding of the two bf16 products; rows in
    no run keep their bits; an adapter loaded into a slot is packed again. Deterministic mode puts
    every run on the tiles, and a row alone gets the bits it gets among the others."""
    ops = CpuOps(row_invariant=row_invariant)
    assert ops.tiles
    y, x, a, b = _inputs(torch.bfloat16, rows=30, fan_in=96, fan_out=100)
    runs = [(1, 0, 1), (0, 2, 22), (2, 25, 30)]
    out = y.clone()
    ops.lora_add(out, x, a, b, LoraStep(runs))
    want = y.float().clone()
    for slot, first, end in runs:
        u = (x[first:end].float() @ a[slot].float().t()).bfloat16().float()
        want[first:end] += (u @ b[slot].float()).bfloat16().float()
    assert ((out.float() - want).abs() <= want.abs() * 2**-7 + 2e-2).all()
    assert torch.equal(out[1], y[1]) and torch.equal(out[22:25], y[22:25])
    alone = y[9:10].clone()
    ops.lora_add(alone, x[9:10].clone(), a, b, LoraStep([(0, 0, 1)]))
    assert torch.equal(alone, out[9:10]) or not row_invariant
    a[0].mul_(2)  # a new adapter in slot 0
    again = y.clone()
    ops.lora_add(again, x, a, b, LoraStep(runs))
    assert torch.equal(again[0], out[0]) and not torch.equal(again[2:22], out[2:22])
