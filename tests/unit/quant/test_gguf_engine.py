"""The engine serving a GGUF file's blocks: the weights it reads, and its greedy tokens against the
reference ops on the same weights dequantized in fp32, token for token."""

from __future__ import annotations

import os

import pytest
import torch

from lmiserve.model_store import GGUF_SOURCE
from lmiserve.rolling_batch.quant.gguf_weights import read_gguf
from lmiserve.rolling_batch.quant.weights import BlockWeight
from lmiserve.wire import SamplingParams
from tests.unit.engine.engine_helpers import make_engine, run
from tests.unit.quant.gguf_files import dense_copy, write_gguf

PROMPTS = [[5, 17, 42, 9, 100, 3], [7, 7, 250, 31], list(range(60, 90))]


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def gguf_model(request, tmp_path_factory):
    """(a model directory whose weights are a GGUF file's, the reference directory)."""
    from tests.tiny_models import build_model

    root = tmp_path_factory.mktemp(f"gguf-{request.param}")
    hf = build_model(root / "hf", arch=request.param, seed=3)
    expected = write_gguf(hf, root / "model.gguf", arch=request.param)
    os.symlink(root / "model.gguf", hf / GGUF_SOURCE)
    return hf, dense_copy(hf, expected, root / "dense"), expected


def test_blocks_read_in_hugging_face_order(gguf_model) -> None:
    hf, _, expected = gguf_model
    tensors = read_gguf(hf / GGUF_SOURCE, torch.float32)
    assert set(tensors) == set(expected)
    kinds = {name: t.kind for name, t in tensors.items() if isinstance(t, BlockWeight)}
    assert kinds["model.layers.0.self_attn.q_proj.weight"] == "q4_0"
    assert kinds["model.layers.1.mlp.down_proj.weight"] == "q4_1"
    assert kinds["lm_head.weight"] == "q8_0"
    for name, t in tensors.items():
        got = t.dequantize() if isinstance(t, BlockWeight) else t
        assert torch.equal(got, torch.from_numpy(expected[name])), name


def _greedy(model_dir, **engine) -> dict:
    params = SamplingParams(max_new_tokens=12, ignore_eos=True)
    tokens, _, _ = run(make_engine(model_dir, **engine), {0: [(str(i), p, params) for i, p in enumerate(PROMPTS)]})
    return {rid: t[0] for rid, t in tokens.items()}


def test_greedy_tokens_equal_the_dequantized_reference_in_fp32(gguf_model) -> None:
    hf, dense, _ = gguf_model
    engine = make_engine(hf)
    assert engine.runner.quantization.startswith("gguf blocks (q4_0 x")
    assert engine.info["quantization"] == engine.runner.quantization  # GET /models' engine description
    assert engine.runner.model.layers[0].qkv.packing == "gguf-q4_0"
    assert _greedy(hf) == _greedy(dense, ops="reference")


def test_deterministic_mode_and_chunked_prompts_keep_the_tokens(gguf_model) -> None:
    hf, dense, _ = gguf_model
    assert _greedy(hf, deterministic=True, max_num_batched_tokens=8) == _greedy(dense, ops="reference")


def test_quantize_none_serves_the_dense_copy(gguf_model) -> None:
    hf, _, _ = gguf_model
    engine = make_engine(hf, quantize="none")
    assert engine.runner.quantization == "none"
    assert engine.runner.model.layers[0].qkv.quant is None


def test_dense_weights_beside_the_blocks_give_the_dense_models_bf16_tokens(gguf_model) -> None:
    """With dense weights taken from one row on, every layer runs the bf16 weights the blocks
    dequantize to: the tokens are those of the dense copy loaded in bf16, bit for bit."""
    from lmiserve.rolling_batch.ops.cpu_kernels import bf16_linear_kernel

    if not bf16_linear_kernel():
        pytest.skip("no bf16 linear kernel here")
    hf, dense, _ = gguf_model
    engine = make_engine(hf, dtype="bf16", gguf_dense_rows=1)
    assert engine.runner.model.layers[0].qkv.dense is not None
    assert _greedy(hf, dtype="bf16", gguf_dense_rows=1) == _greedy(dense, dtype="bf16")


def test_gpu_schemes_are_refused_for_a_gguf_file(gguf_model) -> None:
    hf, _, _ = gguf_model
    with pytest.raises(ValueError, match="option.quantize=awq needs a awq checkpoint"):
        make_engine(hf, quantize="awq")


def test_the_default_model_is_served_from_its_q4_1_blocks(smollm2_dir) -> None:
    """The embedded SmolLM2's file: every linear layer in Q4_1 blocks that dequantize to exactly the
    weights transformers reads from it (the converted copy); the engine runs them in the kernel.
    (tests/unit/engine/test_smollm2_bf16_cpu.py checks its greedy tokens against transformers.)"""
    from safetensors import safe_open

    blocks = read_gguf((smollm2_dir / GGUF_SOURCE).resolve(), torch.float32)
    kinds = {t.kind for t in blocks.values() if isinstance(t, BlockWeight)}
    assert kinds == {"q4_1"} and sum(isinstance(t, BlockWeight) for t in blocks.values()) == 210
    with safe_open(str(next(smollm2_dir.glob("*.safetensors"))), framework="pt") as f:
        for name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.29.mlp.down_proj.weight"):
            assert torch.equal(blocks[name].dequantize(), f.get_tensor(name).float()), name
    engine = make_engine(smollm2_dir, dtype="bf16", max_model_len=64)
    assert engine.runner.quantization == "gguf blocks (q4_1 x210)"
    assert engine.runner.model.layers[0].gate_up.packing == "gguf-q4_1"
