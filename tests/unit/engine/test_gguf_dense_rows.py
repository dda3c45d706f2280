"""GGUF blocks with dense bf16 weights beside them: which rows take which (the CPU ops), where the
crossing is measured and kept, and how placement hands it to the engine."""

from __future__ import annotations

import os

import pytest
import torch

from lmiserve.model_store import GGUF_SOURCE
from lmiserve.rolling_batch.ops import cpu_ceilings, cpu_gguf_rows
from lmiserve.rolling_batch.ops.cpu import CpuOps
from lmiserve.rolling_batch.ops.cpu_dtype import Layer
from lmiserve.rolling_batch.ops.cpu_gguf_rows import ROWS, RowsChoice, crossing, measure_rows
from lmiserve.rolling_batch.ops.cpu_kernels import bf16_linear_kernel, load_kernels
from tests.tiny_models import build_model
from tests.unit.engine.test_gguf_linear import blocks
from tests.unit.quant.gguf_files import write_gguf

kernels = pytest.mark.skipif(not (load_kernels() and bf16_linear_kernel()), reason="no bf16 linear kernel here")


def test_the_crossing_is_the_fewest_rows_from_which_dense_wins_at_every_count() -> None:
    blocks_ms = dict.fromkeys(ROWS, 10.0)
    assert crossing(blocks_ms, dict.fromkeys(ROWS, 9.6)) == 0  # within the margin: the blocks
    assert crossing(blocks_ms, dict.fromkeys(ROWS, 5.0)) == 1
    dense = {1: 12.0, 2: 10.0, 4: 8.0, 8: 7.0, 16: 12.0, 32: 7.0, 64: 7.0, 128: 7.0, 256: 7.0}
    assert crossing(blocks_ms, dense) == 32  # blocks win again at 16: dense only from 32
    dense = {1: 12.0, 2: 9.0, 4: 8.0, 8: 7.0, 16: 7.0, 32: 7.0, 64: 7.0, 128: 7.0, 256: 7.0}
    assert crossing(blocks_ms, dense) == 2
    assert crossing(blocks_ms, dense | {256: 11.0}) == 0
    # a tie up to 64 rows, dense faster past it (the blocks' AMX kernel on a Xeon): dense from 128
    assert crossing(blocks_ms, dict.fromkeys(ROWS, 10.0) | {128: 8.0, 256: 7.0}) == 128


@kernels
@pytest.mark.parametrize("kind", ["q4_0", "q4_1", "q8_0"])
def test_rows_from_the_crossing_run_the_dense_weights_and_fewer_the_blocks(kind: str) -> None:
    w = blocks(kind, 96, 128, seed=1)
    hybrid, plain = CpuOps(dense_rows=4), CpuOps()
    prepared = hybrid.prepare_linear(w)
    assert prepared.packing == f"gguf-{kind}" and prepared.dense is not None
    dense = plain.prepare_linear(w.dequantize(torch.bfloat16))
    from_blocks = plain.prepare_linear(w)
    assert from_blocks.dense is None  # none kept without a crossing
    generator = torch.Generator().manual_seed(2)
    for rows in (1, 3, 4, 9):
        x = torch.randn(rows, 128, generator=generator).bfloat16()
        want = plain.linear(x, dense if rows >= 4 else from_blocks)
        assert torch.equal(hybrid.linear(x, prepared), want), rows
        assert torch.equal(hybrid.linear(x.float(), prepared), plain.linear(x.float(), from_blocks))  # fp32: blocks
    gate_up = hybrid.prepare_gate_up(w)
    assert gate_up.dense is not None and gate_up.dense.packing == "lmiserve-gated"
    dense_gated, blocks_gated = plain.prepare_gate_up(w.dequantize(torch.bfloat16)), plain.prepare_gate_up(w)
    for rows in (2, 5):
        x = torch.randn(rows, 128, generator=generator).bfloat16()
        want = plain.gate_up_swiglu(x, dense_gated if rows >= 4 else blocks_gated)
        assert torch.equal(hybrid.gate_up_swiglu(x, gate_up), want), rows
        assert torch.equal(hybrid.linear(x, gate_up), plain.linear(x, dense_gated if rows >= 4 else blocks_gated))


@kernels
def test_deterministic_ops_keep_no_dense_weights() -> None:
    ops = CpuOps(row_invariant=True, dense_rows=4)
    assert ops.dense_rows == 0 and ops.prepare_linear(blocks("q4_1", 64, 64)).dense is None


@kernels
def test_a_real_measurement_times_both_at_every_row_count() -> None:
    choice = measure_rows([Layer("o_proj", 64, 128, "q4_1"), Layer("down_proj", 128, 64, "q8_0")], 3, CpuOps())
    assert set(choice.blocks_ms) == set(choice.dense_ms) == set(ROWS)
    assert all(t > 0 for t in [*choice.blocks_ms.values(), *choice.dense_ms.values()])
    assert choice.dense_rows in (0, *ROWS)
    assert "dense time / blocks time: 1 rows" in choice.why()


def test_the_sample_outgrows_the_last_level_cache(tmp_path, monkeypatch) -> None:
    for index, size in enumerate(["48K", "2048K", "491520K"]):
        (tmp_path / f"index{index}").mkdir()
        (tmp_path / f"index{index}" / "size").write_text(size + "\n")
    assert cpu_ceilings.last_level_cache_bytes(tmp_path) == 480 << 20
    assert [cpu_ceilings.cache_size_bytes(t) for t in ("32M", "1024", "2G", "?K", "")] == [
        32 << 20,
        1024,
        2 << 30,
        0,
        0,
    ]
    # a small cache leaves the 64 MiB sample; a large one doubles past it, up to the whole model
    monkeypatch.setattr(cpu_gguf_rows, "last_level_cache_bytes", lambda: 8 << 20)
    assert cpu_gguf_rows.sample_bytes() == cpu_gguf_rows.SAMPLE_BYTES
    monkeypatch.setattr(cpu_gguf_rows, "last_level_cache_bytes", lambda: 480 << 20)
    assert cpu_gguf_rows.sample_bytes() == 960 << 20
    sampled = []
    monkeypatch.setattr(
        cpu_gguf_rows,
        "time_alternating",
        lambda ops, sets, dtype, rows: [sampled.append(len(x)) or dict.fromkeys(rows, 1.0) for x in sets],
    )
    layer = Layer("o_proj", 4096, 4096, "q4_1")  # 32 MiB dense: 2 copies fill 64 MiB, 30 of the 40 fill 960
    cpu_gguf_rows.measure_rows([layer], 40, None, cpu_gguf_rows.sample_bytes())
    assert sampled == [30, 30]
    cpu_gguf_rows.measure_rows([layer], 40, None)  # the 64 MiB sample
    assert sampled == [30, 30, 2, 2]


@pytest.fixture(scope="module")
def gguf_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("dense-rows")
    hf = build_model(root / "hf", arch="llama", seed=3)
    write_gguf(hf, root / "model.gguf")
    os.symlink(root / "model.gguf", hf / GGUF_SOURCE)
    return hf


@kernels
def test_the_crossing_is_measured_once_and_said(gguf_dir, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("LMISERVE_CACHE", str(tmp_path))
    calls = []

    def fake(layers, count, ops, sample):  # type: ignore[no-untyped-def]
        assert sample == cpu_gguf_rows.sample_bytes()
        calls.append([x.kind for x in layers])
        return RowsChoice(8, dict.fromkeys(ROWS, 2.0), dict.fromkeys(ROWS, 1.0))

    monkeypatch.setattr(cpu_gguf_rows, "measure_rows", fake)
    first, why = cpu_gguf_rows.dense_rows(gguf_dir)
    second, again = cpu_gguf_rows.dense_rows(gguf_dir)
    assert calls == [["q4_0", "q4_0", "q4_1", "q4_1"]] and first == second and first.dense_rows == 8
    assert "from 8" in why and "earlier start" not in why and "earlier start" in again
    monkeypatch.setattr(cpu_gguf_rows, "memory_available", lambda: 1000)  # dense would not fit
    none, why = cpu_gguf_rows.dense_rows(gguf_dir)
    assert none is None and "free memory" in why
    assert cpu_gguf_rows.dense_rows(tmp_path) == (None, "")  # no GGUF file: nothing to say


@pytest.mark.parametrize(
    "rows, deterministic, want_rows, want_quantize",
    [(8, False, 8, None), (1, False, 0, "none"), (0, False, 0, None), (8, True, 0, None)],
)
def test_placement_hands_the_crossing_to_the_engine(
    gguf_dir, monkeypatch, rows, deterministic, want_rows, want_quantize
):
    from lmiserve.config.loader import load_settings
    from lmiserve.rolling_batch.engine_config import engine_options
    from lmiserve.rolling_batch.runner import placement

    choice = RowsChoice(rows, dict.fromkeys(ROWS, 2.0), dict.fromkeys(ROWS, 1.0))
    monkeypatch.setattr(cpu_gguf_rows, "dense_rows", lambda path, int8: (choice, choice.why()))
    monkeypatch.setattr(placement, "resolve_device", lambda spec: "cpu")
    monkeypatch.setattr(placement, "resolve_dtype", lambda spec, device: ("bf16", "native"))
    monkeypatch.setattr(placement, "cpu_has_native_bf16", lambda: True)
    props = gguf_dir.parent / f"props-{rows}-{deterministic}"
    props.mkdir()
    (props / "serving.properties").write_text(f"option.deterministic={str(deterministic).lower()}\n")
    s = load_settings(props, env={})
    config, why = placement.placed_config(str(gguf_dir), engine_options(s.model, s.engine))
    assert (config.gguf_dense_rows, config.quantize) == (want_rows, want_quantize)
    assert ("GGUF blocks or dense bf16" in why) == (not deterministic)
