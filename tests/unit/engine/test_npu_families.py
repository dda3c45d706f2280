"""The families beyond Llama and Qwen on the NPU ops, against the semantic fake of torch_npu
(block size 128, a prompt prefilled in chunks): transformers' greedy tokens, token for token."""

import pytest

from lmiserve.wire import SamplingParams
from tests.tiny_models import MOE_ARCHS, build_model

from .engine_helpers import hf_greedy, make_engine, run, run_pictures

FAMILIES = (*MOE_ARCHS, "phi3", "olmo2", "granite")


@pytest.mark.parametrize("arch", FAMILIES)
def test_npu_ops_give_transformers_greedy_tokens(arch, tmp_path, fake_npu):
    model_dir = build_model(tmp_path / arch, arch, seed=2)
    prompt = [5, 17, 42, 9, 100, 30, 8, 60, 61, 62, 63]  # no special ids: generate masks the pad id
    engine = make_engine(model_dir, ops="npu", block_size=128, max_num_batched_tokens=8)
    assert engine.runner.ops.name == "npu"
    tokens, _, _ = run(engine, {0: [("a", prompt, SamplingParams(max_new_tokens=5))]})
    assert tokens["a"][0] == hf_greedy(model_dir, prompt, 5)


def test_llava_on_the_npu_ops(tmp_path, fake_npu):
    from tests.tiny_vision import build_llava, hf_llava_greedy, picture

    model_dir = build_llava(tmp_path / "llava")
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is this?"}]}]
    ids, expected = hf_llava_greedy(model_dir, messages, [picture(1)], 5)
    engine = make_engine(model_dir, ops="npu", block_size=128, max_num_batched_tokens=8)
    tokens = run_pictures(engine, {"a": (ids, [picture(1)])}, 5)["a"]
    assert tokens == expected


def test_qwen2_5_vl_on_the_npu_ops(tmp_path, fake_npu):
    from tests.tiny_vision import build_qwen_vl, hf_qwen_greedy, picture, qwen_prompt

    model_dir = build_qwen_vl(tmp_path / "qwen")
    ids, pictures = qwen_prompt(model_dir, [picture(2, 150, 60), "Describe it."])
    engine = make_engine(model_dir, ops="npu", block_size=128, max_num_batched_tokens=8)
    tokens = run_pictures(engine, {"a": (ids, pictures)}, 5)["a"]
    assert tokens == hf_qwen_greedy(model_dir, ids, pictures, 5)


def test_qwen3_vl_on_the_npu_ops(tmp_path, fake_npu):
    from tests.tiny_qwen3_vl import build_qwen3_vl
    from tests.tiny_vision import hf_qwen_greedy, picture, qwen_prompt

    model_dir = build_qwen3_vl(tmp_path / "qwen3")
    ids, pictures = qwen_prompt(model_dir, [picture(2, 150, 60), "Describe it."])
    engine = make_engine(model_dir, ops="npu", block_size=128, max_num_batched_tokens=8)
    tokens = run_pictures(engine, {"a": (ids, pictures)}, 5)["a"]
    assert tokens == hf_qwen_greedy(model_dir, ids, pictures, 5)
