"""An AVX512_BF16 build of the bf16 linear kernel has two kinds of tiles, vdpbf16ps and FMAs on
widened weights, and takes the FMA ones from a number of rows that it measures: they give the
bits of fp32 sums over the pairs of k (odd k first), and on a CPU whose vdpbf16ps is what Intel
documents the same bits as vdpbf16ps, so that the choice never shows in an output."""

from __future__ import annotations

import pytest
import torch

from lmiserve.rolling_batch.ops import cpu_linear_tiles as tiles
from lmiserve.rolling_batch.ops.cpu_kernels import load_kernels

from .test_linear_isa import GATE_UP, MS, PLAIN, SHAPES, SWIGLU, in_order

both = pytest.mark.skipif(
    not (load_kernels() and tiles.has_both()), reason="the kernels here are not an AVX512_BF16 build"
)


@pytest.fixture
def fma_rows():  # type: ignore[no-untyped-def]
    """Sets the kernels' FMA row count for a test and puts the process's back afterwards."""
    ops = torch.ops.lmiserve_cpu
    before = ops.linear_bf16_fma_rows()
    yield ops.set_linear_bf16_fma_rows
    ops.set_linear_bf16_fma_rows(before)


def test_the_fma_tiles_start_where_they_win_at_every_larger_count() -> None:
    assert tiles.fma_rows_from({1: 1.04, 4: 0.82, 8: 0.65, 32: 0.64}) == 4
    assert tiles.fma_rows_from({1: 0.9, 4: 0.82, 8: 0.65, 32: 0.64}) == 1
    assert tiles.fma_rows_from({1: 0.9, 4: 1.2, 8: 0.65, 32: 0.64}) == 8
    assert tiles.fma_rows_from({1: 0.9, 4: 0.9, 8: 0.9, 32: 0.97}) == 0
    assert tiles.fma_rows_from({1: 1.0, 4: 1.0, 8: 1.0, 32: 1.0}) == 0


@both
@pytest.mark.parametrize("m", MS)
@pytest.mark.parametrize("k,n", SHAPES)
@pytest.mark.parametrize("with_bias", [False, True])
def test_fma_tiles_equal_fp32_sums_in_pair_order(fma_rows, m: int, k: int, n: int, with_bias: bool) -> None:  # type: ignore[no-untyped-def]
    ops = torch.ops.lmiserve_cpu
    fma_rows(1)
    g = torch.Generator().manual_seed(m * 7 + k)
    w = torch.randn(n, k, generator=g).bfloat16()
    x = torch.randn(m, k, generator=g).bfloat16()
    bias = torch.randn(n, generator=g).bfloat16() if with_bias else None
    y = ops.linear_bf16(x, ops.pack_linear_bf16(w), bias, n, PLAIN)
    assert torch.equal(y, in_order(x, w, bias))


@both
@pytest.mark.parametrize("m", [2, 17], ids=["x-widened-per-tile", "x-widened-once"])
def test_fma_tiles_read_denormal_x_as_zero(fma_rows, m: int) -> None:  # type: ignore[no-untyped-def]
    """As vdpbf16ps does: a row of x below bf16's smallest normal multiplies to zeros (a product
    of more than one tile and group widens x once for all of them, a smaller one in each tile)."""
    ops = torch.ops.lmiserve_cpu
    fma_rows(1)
    g = torch.Generator().manual_seed(3)
    w = torch.randn(64, 96, generator=g).bfloat16() * 1e30
    x = torch.randn(m, 96, generator=g).bfloat16()
    x[1] = (torch.randn(96, generator=g) * 1e-39).bfloat16()
    assert x[1].abs().max() < torch.finfo(torch.bfloat16).tiny and x[1].abs().max() > 0
    y = ops.linear_bf16(x, ops.pack_linear_bf16(w), None, 64, PLAIN)
    assert torch.equal(y[1], torch.zeros(64, dtype=torch.bfloat16))
    normal = torch.arange(m) != 1
    assert torch.equal(y[normal], in_order(x[normal], w))


@both
@pytest.mark.parametrize("m", [1, 5, 8, 17, 70])
def test_the_two_tiles_give_the_same_bits_for_every_output(fma_rows, m: int) -> None:  # type: ignore[no-untyped-def]
    """Plain, gate_up in place and SwiGLU, products of 1 to 70 rows: the same on either kind of
    tiles where the probe says this CPU's vdpbf16ps is the documented pair of FMAs."""
    if not tiles.same_bits():
        pytest.skip("this CPU's vdpbf16ps does not round as the FMA tiles do")
    ops = torch.ops.lmiserve_cpu
    g = torch.Generator().manual_seed(m)
    w = (torch.randn(200, 1600, generator=g) * 0.05).bfloat16()
    x = torch.randn(m, 1600, generator=g).bfloat16()
    bias = torch.randn(200, generator=g).bfloat16()
    plain, gated = ops.pack_linear_bf16(w), ops.pack_linear_bf16(w, True)
    outputs = {}
    for rows in (0, 1):
        fma_rows(rows)
        outputs[rows] = (
            ops.linear_bf16(x, plain, bias, 200, PLAIN),
            ops.linear_bf16(x, gated, None, 200, GATE_UP),
            ops.linear_bf16(x, gated, None, 100, SWIGLU),
        )
    for a, b in zip(outputs[0], outputs[1], strict=True):
        assert torch.equal(a, b)


@both
def test_a_row_alone_equals_the_row_in_a_batch_across_the_threshold(fma_rows) -> None:  # type: ignore[no-untyped-def]
    """FMA tiles from 8 rows: a row multiplied alone (vdpbf16ps) equals the same row in a batch
    of 17 (FMA tiles), bit for bit, where the two give the same bits here."""
    if not tiles.same_bits():
        pytest.skip("this CPU's vdpbf16ps does not round as the FMA tiles do")
    ops = torch.ops.lmiserve_cpu
    fma_rows(8)
    g = torch.Generator().manual_seed(11)
    w = torch.randn(150, 576, generator=g).bfloat16()
    x = torch.randn(17, 576, generator=g).bfloat16()
    packed = ops.pack_linear_bf16(w)
    y = ops.linear_bf16(x, packed, None, 150, PLAIN)
    for r in range(17):
        assert torch.equal(ops.linear_bf16(x[r : r + 1], packed, None, 150, PLAIN), y[r : r + 1])


@both
def test_decide_takes_the_variable_and_deterministic_mode_takes_all_or_none() -> None:
    if not tiles.same_bits():
        assert tiles.decide("8").fma_rows == 0
        return
    assert tiles.decide("8").fma_rows == 8
    assert tiles.decide("0").fma_rows == 0
    assert tiles.decide("8", whole=True).fma_rows == 1
    assert tiles.decide("0", whole=True).fma_rows == 0
    with pytest.raises(ValueError, match="LMISERVE_LINEAR_FMA_ROWS"):
        tiles.decide("-3")
    measured = tiles.decide(whole=True)
    assert measured.fma_rows in (0, 1) and set(measured.ratios) == set(tiles.ROWS)


@both
def test_the_setter_refuses_a_negative_count() -> None:
    with pytest.raises(RuntimeError, match="0 \\(never\\) or more"):
        torch.ops.lmiserve_cpu.set_linear_bf16_fma_rows(-1)


@both
def test_choose_sets_its_mode_again_at_every_call(fma_rows) -> None:  # type: ignore[no-untyped-def]
    """Ops made for a measurement (the default mode) and then the engine's (deterministic mode):
    the kernels run the mode of the ops made last."""
    ops = torch.ops.lmiserve_cpu
    for whole in (False, True, False):
        fma_rows(5)
        choice = tiles.choose(whole)
        assert choice is not None and ops.linear_bf16_fma_rows() == choice.fma_rows


@both
def test_a_measurement_kept_for_one_tile_setting_is_not_read_for_another(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The start-up measurements' keys hold the default mode's FMA row count."""
    from lmiserve.rolling_batch.ops.cpu_dtype import Layer, cache_file

    layers = [Layer("o_proj", 64, 64)]
    keys = {}
    try:
        for rows in ("0", "4", "0"):
            monkeypatch.setenv(tiles.ENV, rows)
            tiles._decided.cache_clear()
            keys.setdefault(rows, set()).add(cache_file(layers, 2, None, True, ["rows"]))
    finally:
        tiles._decided.cache_clear()
    if not tiles.same_bits():
        assert keys["0"] == keys["4"]
        return
    assert len(keys["0"]) == 1 and keys["0"] != keys["4"]
