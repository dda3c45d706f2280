"""Greedy equivalence: requests of different lengths arriving at different times into one
running batch each produce exactly what transformers generate produces for them alone."""

import pytest

from lmiserve.wire import SamplingParams

from .engine_helpers import hf_greedy, make_engine, run, staggered

pytestmark = pytest.mark.usefixtures("scheduling")

PROMPTS = [
    "What is Deep Learning?",
    "The quick brown fox jumps over the lazy dog. " * 3,
    "Paged attention stores the key value cache in fixed-size blocks, and continuous batching "
    "lets new requests join the running batch at every step.",
    "Hi",
]


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_staggered_requests_match_generate_alone(arch, tiny_model_dirs, tiny_tokenizer):
    model_dir = tiny_model_dirs[arch]
    engine = make_engine(model_dir, max_num_batched_tokens=24)  # long prompts are prefilled in chunks
    prompts = [tiny_tokenizer(p)["input_ids"] for p in PROMPTS]
    lengths = [20, 12, 25, 30]
    arrivals = staggered(prompts, lengths)
    tokens, finish, _ = run(engine, arrivals)
    for rid, prompt, n in zip("abcd", prompts, lengths):
        expected = hf_greedy(model_dir, prompt, n)
        assert tokens[rid][0] == expected, (arch, rid)
        assert finish[rid][0] == (
            "length" if len(expected) == n and expected[-1] not in engine.eos_token_ids else "eos_token"
        )
    assert engine.blocks.num_used_blocks == 0  # everything was freed


def test_prefix_cache_and_preemption_keep_greedy_output(tiny_model_dirs, tiny_tokenizer):
    model_dir = tiny_model_dirs["llama"]
    # a cache of 10 blocks forces preemption; shared prefixes hit the prefix cache
    engine = make_engine(model_dir, kv_cache_bytes=None, max_model_len=128, max_num_batched_tokens=64)
    engine.blocks.__init__(10, 16)
    engine.scheduler.blocks = engine.blocks
    system = tiny_tokenizer(PROMPTS[2])["input_ids"]
    prompts = [system + tiny_tokenizer(q)["input_ids"] for q in ("What is it?", "Why?", "How so?")]
    arrivals = {0: [(f"r{i}", p, SamplingParams(max_new_tokens=40)) for i, p in enumerate(prompts)]}
    tokens, _, _ = run(engine, arrivals)
    assert engine.scheduler.num_preemptions > 0
    assert engine.blocks.prefix_hit_tokens > 0
    for i, p in enumerate(prompts):
        assert tokens[f"r{i}"][0] == hf_greedy(model_dir, p, 40)
