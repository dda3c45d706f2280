"""The engine on the CUDA ops (Triton, interpreted on the CPU) serving 4-bit and FP8 checkpoints
through their kernels, with decode graphs (the recording stand-in): greedy tokens equal the
reference ops' on the same weights dequantized in fp32 (FP8: the reference ops' W8A8)."""

from __future__ import annotations

import shutil

import pytest
from safetensors.torch import save_file

from lmiserve.rolling_batch.quant.weights import Fp8Weight, Int4Weight
from lmiserve.rolling_batch.quant.writers import write_quantized
from lmiserve.rolling_batch.runner import graphs
from lmiserve.wire import SamplingParams
from tests.unit.engine.engine_helpers import make_engine, run
from tests.unit.engine.recording_graphs import RecordingBackend

PROMPTS = [[5, 17, 42, 9, 100, 3], list(range(60, 84))]


def _greedy(engine) -> dict:
    params = SamplingParams(max_new_tokens=6, ignore_eos=True)
    tokens, _, _ = run(engine, {0: [(str(i), p, params) for i, p in enumerate(PROMPTS)]})
    return {rid: t[0] for rid, t in tokens.items()}


@pytest.mark.parametrize("fmt, layout", [("awq", Int4Weight), ("gptq", Int4Weight), ("fp8", Fp8Weight)])
def test_quantized_checkpoints_through_the_triton_kernels(
    fmt, layout, tiny_model_dirs, tmp_path, kernel_device, monkeypatch
):
    monkeypatch.setattr(graphs, "backend_for", lambda device: RecordingBackend())
    quantized, reference = tmp_path / "quantized", tmp_path / "reference"
    weights = write_quantized(tiny_model_dirs["llama"], quantized, fmt, group_size=32)
    shutil.copytree(quantized, reference)
    for f in reference.glob("*.safetensors"):
        f.unlink()
    save_file({k: v.contiguous() for k, v in weights.items()}, str(reference / "model.safetensors"))
    (reference / "config.json").write_text((tiny_model_dirs["llama"] / "config.json").read_text())
    dtype = "fp32" if fmt != "fp8" else "bf16"
    # the longer prompt in one step of more than SMALL_ROWS rows, the decodes in fewer: both kernel
    # configurations; one mixed-graph prompt bucket (16 tokens) keeps the interpreted capture short
    limits = dict(max_num_seqs=4, max_num_batched_tokens=32, max_decode_step_prefill_tokens=16)
    engine = make_engine(quantized, ops="cuda", device=kernel_device, dtype=dtype, **limits)
    qkv = engine.runner.model.layers[0].qkv
    assert isinstance(qkv.quant, layout) and engine.runner.graphs is not None
    ours = _greedy(engine)
    # FP8: the reference ops' W8A8 (activations quantized per token) on the checkpoint itself
    expected_from = quantized if fmt == "fp8" else reference
    assert ours == _greedy(make_engine(expected_from, ops="reference", dtype=dtype, **limits))
