"""The batch-invariant matrix multiply: the fp32 product's value, and a row's bits in a product
of any number of rows. Shapes are no multiples of the tiles, so edge tiles are masked."""

import pytest
import torch

from lmiserve.rolling_batch.ops.triton_kernels import invariant_matmul
from lmiserve.rolling_batch.ops.triton_kernels.invariant_matmul import invariant_linear

K, N = 100, 70  # two steps of BLOCK_K, two column tiles, each the second one partial
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


def _operands(m, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, K, generator=g).to(dtype)
    w = torch.randn(N, K, generator=g).to(dtype)
    b = torch.randn(N, generator=g).to(dtype)
    return x.to(device), w.to(device), b.to(device)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [True, False])
def test_the_product_is_the_fp32_product_rounded(dtype, bias, kernel_device):
    x, w, b = _operands(75, dtype, kernel_device)
    b = b if bias else None
    y = invariant_linear(x, w, b)
    want = x.float() @ w.float().T + (0 if b is None else b.float())
    assert y.dtype == dtype and y.shape == (75, N)
    tol = TOLERANCE[dtype]
    assert torch.allclose(y.float().cpu(), want.to(dtype).float().cpu(), atol=tol, rtol=tol)


def test_leading_dimensions_and_empty_inputs(kernel_device):
    x, w, b = _operands(6, torch.float32, kernel_device)
    y = invariant_linear(x.view(2, 3, K), w, b)
    assert y.shape == (2, 3, N) and torch.equal(y.view(6, N), invariant_linear(x, w, b))
    assert invariant_linear(x[:0], w, b).shape == (0, N)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_rows_bits_do_not_depend_on_the_rows_beside_it(dtype, kernel_device):
    """Rows of products of 1, 7, 33 and 127 rows (one and two row tiles) against the same rows
    alone and in other company: bit for bit."""
    x, w, b = _operands(127, dtype, kernel_device)
    full = invariant_linear(x, w, b)
    for m in (1, 7, 33):
        assert torch.equal(invariant_linear(x[:m], w, b), full[:m]), m
        assert torch.equal(invariant_linear(x[m - 1 : m], w, b), full[m - 1 : m]), m
    others, _, _ = _operands(40, dtype, kernel_device, seed=1)
    mixed = invariant_linear(torch.cat([others, x[100:110]]), w, b)
    assert torch.equal(mixed[40:], full[100:110])  # other rows before it, another row tile


def test_a_row_has_the_same_bits_at_every_place_of_its_row_tile(kernel_device):
    """An fp32 row after 0 to 63 other rows: the same bits at each place. (Under the interpreter the
    products would otherwise go to the machine's BLAS, whose order of a sum may depend on the
    place: OpenBLAS's Haswell kernels differ from one six rows to the next.)"""
    x, w, b = _operands(64, torch.float32, kernel_device)
    alone = invariant_linear(x[:1], w, b)[0]
    for before in range(1, 64):
        rows = torch.cat([x[1 : before + 1], x[:1]])
        assert torch.equal(invariant_linear(rows, w, b)[before], alone), before


def test_one_configuration_and_the_row_count_not_specialised_on():
    kernel = invariant_matmul._invariant_matmul_kernel
    names = getattr(kernel, "do_not_specialize", None)
    if names is None:  # the interpreter keeps the decorator's arguments
        names = kernel.kwargs.get("do_not_specialize", ())
    assert "M" in set(names)
    assert not hasattr(kernel, "configs")  # not autotuned
