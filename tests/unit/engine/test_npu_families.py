"""The families beyond Llama and Qwen on the NPU ops, against the semantic fake of torch_npu
(block size 128, a prompt prefilled in chunks): transformers' greedy tokens, token for token."""

import pytest

from lmiserve.wire import SamplingParams
from tests.tiny_models import MOE_ARCHS, build_model

from .engine_helpers import hf_greedy, make_engine, run

FAMILIES = (*MOE_ARCHS, "phi3", "olmo2", "granite")


@pytest.mark.parametrize("arch", FAMILIES)
def test_npu_ops_give_transformers_greedy_tokens(arch, tmp_path, fake_npu):
    model_dir = build_model(tmp_path / arch, arch, seed=2)
    prompt = [5, 17, 42, 9, 100, 30, 8, 60, 61, 62, 63]  # no special ids: generate masks the pad id
    engine = make_engine(model_dir, ops="npu", block_size=128, max_num_batched_tokens=8)
    assert engine.runner.ops.name == "npu"
    tokens, _, _ = run(engine, {0: [("a", prompt, SamplingParams(max_new_tokens=5))]})
    assert tokens["a"][0] == hf_greedy(model_dir, prompt, 5)
