"""The dtype measured for a CPU without bf16 arithmetic: the layers sampled from the model's
config and GGUF file, the choice from the times, and a real measurement's shape."""

from __future__ import annotations

import os

import pytest
import torch

from lmiserve.model_store import GGUF_SOURCE
from lmiserve.rolling_batch.ops import cpu_dtype
from lmiserve.rolling_batch.ops.cpu_dtype import Layer, measure, model_layers
from lmiserve.rolling_batch.ops.reference import ReferenceOps
from tests.tiny_models import build_model
from tests.unit.quant.gguf_files import write_gguf


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    return build_model(tmp_path_factory.mktemp("dtype") / "hf", arch="llama", seed=3)


def test_layers_follow_the_config(hf) -> None:
    import json

    config = json.loads((hf / "config.json").read_text())
    layers, count, head = model_layers(hf)
    hidden, heads, kv = config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    assert count == config["num_hidden_layers"]
    assert [(x.name, x.out_features, x.in_features, x.kind) for x in layers] == [
        ("qkv_proj", (heads + 2 * kv) * head_dim, hidden, "dense"),
        ("o_proj", hidden, heads * head_dim, "dense"),
        ("gate_up_proj", 2 * config["intermediate_size"], hidden, "dense"),
        ("down_proj", hidden, config["intermediate_size"], "dense"),
    ]
    assert head == Layer("lm_head", config["vocab_size"], hidden)


def test_gguf_layers_keep_their_block_kinds(hf, tmp_path) -> None:
    write_gguf(hf, tmp_path / "model.gguf")
    model = tmp_path / "model"
    model.mkdir()
    for name in ("config.json",):
        (model / name).write_bytes((hf / name).read_bytes())
    os.symlink(tmp_path / "model.gguf", model / GGUF_SOURCE)
    layers, _, head = model_layers(model)
    assert [x.kind for x in layers] == ["q4_0", "q4_0", "q4_1", "q4_1"]  # gguf_files.KINDS
    assert head is not None and head.kind == "q8_0"  # a head of its own
    dense, _, _ = model_layers(model, quantize="none")  # dequantized at load
    assert {x.kind for x in dense} == {"dense"}


def _timed(monkeypatch, times: dict) -> None:
    """``time_rows`` answering from ``times``: by (dtype, whether the layers are dense)."""

    def fake(ops, layers, dtype, rows):  # type: ignore[no-untyped-def]
        return dict.fromkeys(rows, times[dtype, all(x.kind == "dense" for x in layers)] * len(layers))

    monkeypatch.setattr(cpu_dtype, "time_rows", fake)


@pytest.mark.parametrize("fp32, bf16, chosen", [(10.0, 5.0, "bf16"), (10.0, 9.9, "fp32"), (5.0, 10.0, "fp32")])
def test_the_faster_dtype_is_chosen_and_said(monkeypatch, fp32: float, bf16: float, chosen: str) -> None:
    _timed(monkeypatch, {(torch.float32, True): fp32, (torch.bfloat16, True): bf16})
    choice = measure([Layer("o_proj", 64, 64)], 2, None, ops=object())
    assert choice.dtype == chosen and not choice.dense  # a near tie (within 5%) stays fp32
    # 1, 8 and 32 rows, each over both layers sampled (two copies of the one: a scale of one)
    assert choice.seconds == {"fp32": 6 * fp32, "bf16": 6 * bf16}
    assert "ms" in choice.why() and choice.why().endswith(f": {chosen}")


def test_a_gguf_model_may_be_served_dense_where_that_measures_faster(monkeypatch) -> None:
    blocks = [Layer("o_proj", 64, 64, "q4_1")]
    times = {(torch.float32, False): 10.0, (torch.bfloat16, False): 9.0, (torch.float32, True): 8.0}
    _timed(monkeypatch, times | {(torch.bfloat16, True): 4.0})
    choice = measure(blocks, 2, None, ops=object())
    assert (choice.dtype, choice.dense, choice.name) == ("bf16", True, "bf16 dense")
    assert set(choice.seconds) == {"fp32", "bf16", "fp32 dense", "bf16 dense"}
    assert "dequantized at load" in choice.why()
    # dense weights that would not fit are not a candidate
    choice = measure(blocks, 2, None, ops=object(), dense_allowed=False)
    assert (choice.dtype, choice.dense) == ("bf16", False) and set(choice.seconds) == {"fp32", "bf16"}


def test_a_real_measurement_times_every_candidate() -> None:
    layers = [Layer("qkv_proj", 96, 64), Layer("down_proj", 64, 128), Layer("blocks", 64, 64, "q8_0")]
    choice = measure(layers, 3, Layer("lm_head", 256, 64), ops=ReferenceOps())
    assert choice.dtype in ("fp32", "bf16")
    assert set(choice.seconds) == {"fp32", "bf16", "fp32 dense", "bf16 dense"}
    assert all(s > 0 for s in choice.seconds.values())


def test_a_measurement_is_kept_for_the_next_start(hf, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("LMISERVE_CACHE", str(tmp_path))
    calls = []

    def fake(layers, count, head, ops=None, dense_allowed=True):  # type: ignore[no-untyped-def]
        calls.append(count)
        return cpu_dtype.Choice("bf16", {"fp32": 2.0, "bf16": 1.0})

    monkeypatch.setattr(cpu_dtype, "measure", fake)
    first, why = cpu_dtype.measured_format(hf)
    second, again = cpu_dtype.measured_format(hf)
    assert len(calls) == 1 and first == second and first.dtype == "bf16"
    assert "earlier start" not in why and "earlier start" in again
    cpu_dtype.measured_format(hf, quantize="int8")  # another question: measured anew
    assert len(calls) == 2
    monkeypatch.setattr(cpu_dtype, "MANY_ROWS", (4, 16))  # another way of measuring: likewise
    cpu_dtype.measured_format(hf)
    assert len(calls) == 3


def test_sets_of_layers_are_timed_in_turns() -> None:
    """Each run of one set is followed by a run of the next, at every row count: a slower spell
    of the machine falls on both, not on the set measured last."""
    order = []

    class Ops:
        def prepare_linear(self, weight):  # type: ignore[no-untyped-def]
            return weight.shape[0]

        def linear(self, x, w):  # type: ignore[no-untyped-def]
            order.append((x.shape[0], w))

    first, second = [Layer("o_proj", 8, 64, "dense")], [Layer("o_proj", 16, 64, "dense")]
    timed = cpu_dtype.time_alternating(Ops(), [first, second], torch.float32, (1, 3))
    assert [set(t) for t in timed] == [{1, 3}, {1, 3}]
    turns = cpu_dtype.REPEATS + 1
    assert order == [(1, 8), (1, 16)] * turns + [(3, 8), (3, 16)] * turns
