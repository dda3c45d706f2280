"""``option.quantize=int8`` on CPUs: a dense checkpoint's projections quantized at load into Q8_0
blocks, served by the block kernel; greedy tokens equal the reference ops' on the same weights
dequantized in fp32. What the loader refuses, and says."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from lmiserve.rolling_batch.quant.blocks import quantize_q8_0
from lmiserve.rolling_batch.quant.loading import QuantizationError, load_weights
from lmiserve.rolling_batch.quant.onthefly import PROJECTION
from lmiserve.wire import SamplingParams
from tests.unit.engine.engine_helpers import make_engine, run

PROMPTS = [[5, 17, 42, 9, 100, 3], list(range(60, 90))]


@pytest.fixture(scope="module")
def dense_and_dequantized(tmp_path_factory):
    import shutil

    from tests.tiny_models import build_model

    root = tmp_path_factory.mktemp("int8")
    hf = build_model(root / "hf", arch="qwen2", seed=5)
    reference = root / "dequantized"
    shutil.copytree(hf, reference)
    tensors = load_file(str(hf / "model.safetensors"))
    dequantized = {n: quantize_q8_0(t).dequantize() if PROJECTION.search(n) else t for n, t in tensors.items()}
    save_file(dequantized, str(reference / "model.safetensors"))
    return hf, reference


def _greedy(model_dir, **engine) -> dict:
    params = SamplingParams(max_new_tokens=12, ignore_eos=True)
    tokens, _, _ = run(make_engine(model_dir, **engine), {0: [(str(i), p, params) for i, p in enumerate(PROMPTS)]})
    return {rid: t[0] for rid, t in tokens.items()}


def test_int8_tokens_equal_the_dequantized_reference(dense_and_dequantized) -> None:
    hf, reference = dense_and_dequantized
    engine = make_engine(hf, quantize="int8")
    assert engine.runner.quantization.startswith("int8 q8_0 blocks of 32")
    assert engine.runner.model.layers[0].gate_up.packing == "gguf-q8_0"
    assert engine.runner.model.lm_head.quant is None and engine.runner.model.lm_head.packing != "gguf-q8_0"
    assert _greedy(hf, quantize="int8") == _greedy(reference, ops="reference")


def test_devices_each_scheme_runs_on(dense_and_dequantized) -> None:
    hf, _ = dense_and_dequantized
    with pytest.raises(QuantizationError, match="int8 runs on CPUs"):
        load_weights(hf, torch.float32, "cuda:0", "int8", native=("int4", "fp8"))
    with pytest.raises(QuantizationError, match="fp8 runs on CUDA GPUs"):
        load_weights(hf, torch.float32, "cpu", "fp8", native=("gguf",))
    with pytest.raises(QuantizationError, match="needs a awq checkpoint"):
        load_weights(hf, torch.float32, "cpu", "awq", native=("gguf",))
    tensors, what = load_weights(hf, torch.float32, "cpu", None, native=("gguf",))
    assert what == "none" and all(isinstance(t, torch.Tensor) for t in tensors.values())


def test_an_unsupported_checkpoint_scheme_is_refused_at_start(dense_and_dequantized, tmp_path) -> None:
    import json
    import shutil

    hf, _ = dense_and_dequantized
    model = tmp_path / "bnb"
    shutil.copytree(hf, model)
    config = json.loads((model / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_4bit": True}
    (model / "config.json").write_text(json.dumps(config))
    with pytest.raises(QuantizationError, match="bitsandbytes") as refused:
        make_engine(model)
    assert "awq" in str(refused.value) and "gptq" in str(refused.value)
