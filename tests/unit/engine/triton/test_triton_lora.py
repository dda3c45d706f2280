"""The Triton LoRA kernel (segmented, slot-gathered matrix multiplies) against the reference ops."""

import pytest
import torch

from lmiserve.rolling_batch.ops.metadata import LoraStep
from lmiserve.rolling_batch.ops.reference import ReferenceOps
from lmiserve.rolling_batch.ops.triton_kernels import lora_add

DEVICE = "cuda:0" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "runs,rows,fan_in,fan_out,rank",
    [
        ([(1, 0, 1), (0, 1, 2), (1, 3, 4)], 5, 64, 48, 16),  # decodes: one row per run
        ([(2, 0, 37), (0, 40, 90)], 93, 40, 72, 24),  # prompt chunks, sizes that fit no tile
    ],
)
def test_lora_add_matches_the_reference(dtype, runs, rows, fan_in, fan_out, rank):
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, fan_in, generator=g).to(dtype)
    y = torch.randn(rows, fan_out, generator=g).to(dtype)
    a = torch.randn(3, rank, fan_in, generator=g).to(dtype)
    b = torch.randn(3, rank, fan_out, generator=g).to(dtype)
    want = y.clone()
    ReferenceOps().lora_add(want, x, a, b, LoraStep(runs))
    step = LoraStep(runs, DEVICE)
    got = y.to(DEVICE)
    lora_add(got, x.to(DEVICE), a.to(DEVICE), b.to(DEVICE), step.tensors(), step.max_rows)
    got = got.cpu()
    covered = torch.zeros(rows, dtype=torch.bool)
    for _, first, end in runs:
        covered[first:end] = True
    assert torch.equal(got[~covered], y[~covered])  # rows in no run are untouched
    if dtype == torch.float32:
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-4)
    else:  # u is rounded to bf16 between the products, as the reference does; sums in another order
        assert ((got.float() - want.float()).abs() <= want.float().abs() * 2**-5 + 0.1).all()
