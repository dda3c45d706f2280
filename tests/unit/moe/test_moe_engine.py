"""Mixture-of-experts models on the engine: greedy tokens equal transformers' generate, for
whole prompts, prompts prefilled in chunks, and prompts that hit the prefix cache."""

import pytest

from lmiserve.rolling_batch.models.architectures import spec_from_config
from lmiserve.rolling_batch.models.spec import read_config
from lmiserve.wire import SamplingParams
from tests.tiny_models import MOE_ARCHS, build_model
from tests.unit.engine.engine_helpers import hf_greedy, make_engine, run

PROMPTS = [
    "What is Deep Learning?",
    "The quick brown fox jumps over the lazy dog. " * 3,
    "Paged attention stores the key value cache in fixed-size blocks, and continuous batching "
    "lets new requests join the running batch at every step.",
]


@pytest.fixture(scope="module")
def moe_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny-moe")
    return {arch: build_model(root / arch, arch, seed=2) for arch in MOE_ARCHS}


@pytest.fixture(scope="module")
def tokenizer(moe_dirs):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(moe_dirs["mixtral"])


def test_specs(moe_dirs):
    specs = {arch: spec_from_config(read_config(moe_dirs[arch])) for arch in MOE_ARCHS}
    assert specs["mixtral"].num_experts == 4 and specs["mixtral"].norm_topk_prob
    assert specs["qwen3_moe"].dense_mlp_layers == (1,) and specs["qwen3_moe"].qk_norm
    assert specs["qwen2_moe"].shared_expert_intermediate_size == 96 and specs["qwen2_moe"].qkv_bias
    assert specs["olmoe"].qk_norm_scope == "projection" and not specs["olmoe"].norm_topk_prob


@pytest.mark.parametrize("chunk", [256, 16], ids=["whole", "chunked"])
@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_greedy_matches_generate(arch, chunk, moe_dirs, tokenizer):
    model_dir = moe_dirs[arch]
    engine = make_engine(model_dir, max_num_batched_tokens=chunk)
    prompts = [tokenizer(p)["input_ids"] for p in PROMPTS]
    lengths = [12, 8, 10]
    arrivals = {
        0: [("a", prompts[0], SamplingParams(max_new_tokens=lengths[0]))],
        2: [
            ("b", prompts[1], SamplingParams(max_new_tokens=lengths[1])),
            ("c", prompts[2], SamplingParams(max_new_tokens=lengths[2])),
        ],
    }
    tokens, _, _ = run(engine, arrivals)
    for rid, prompt, n in zip("abc", prompts, lengths):
        assert tokens[rid][0] == hf_greedy(model_dir, prompt, n), (arch, rid)


@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_prefix_cache_hit_keeps_greedy_output(arch, moe_dirs, tokenizer):
    model_dir = moe_dirs[arch]
    engine = make_engine(model_dir, max_num_batched_tokens=64)
    system = tokenizer(PROMPTS[2])["input_ids"]
    prompts = [system + tokenizer(q)["input_ids"] for q in ("What is it?", "Why?")]
    arrivals = {
        0: [("r0", prompts[0], SamplingParams(max_new_tokens=8))],
        1: [("r1", prompts[1], SamplingParams(max_new_tokens=8))],
    }
    tokens, _, _ = run(engine, arrivals)
    assert engine.blocks.prefix_hit_tokens > 0
    for i, p in enumerate(prompts):
        assert tokens[f"r{i}"][0] == hf_greedy(model_dir, p, 8)
