"""Gemma 2 and Gemma 3 (text) on the engine: greedy output equal to transformers generate, token
for token, with prompts whole and in chunks, and from the prefix cache. The tiny models have
sliding-window (8) and global layers, random norms and (Gemma 2) score and logit caps that bite."""

import pytest

from lmiserve.wire import SamplingParams

from .engine_helpers import hf_greedy, make_engine, run, staggered

PROMPTS = [
    "What is Deep Learning? Deep learning is a subfield of machine learning.",
    "The quick brown fox jumps over the lazy dog. " * 3,
    "Paged attention stores the key value cache in fixed-size blocks, and continuous batching "
    "lets new requests join the running batch at every step.",
    "Hi",
]


@pytest.fixture(scope="module")
def gemma_dirs(tmp_path_factory) -> dict:
    from tests.tiny_models import build_model

    root = tmp_path_factory.mktemp("tiny-gemma")
    return {arch: build_model(root / arch, arch, seed=3) for arch in ("gemma2", "gemma3")}


@pytest.mark.parametrize("arch", ["gemma2", "gemma3"])
@pytest.mark.parametrize("batched_tokens", [256, 16])
def test_gemma_matches_generate(arch, batched_tokens, gemma_dirs, tiny_tokenizer):
    """Whole prompts (256 tokens a step), then prompts prefilled 16 tokens a step beside decodes."""
    model_dir = gemma_dirs[arch]
    engine = make_engine(model_dir, max_num_batched_tokens=batched_tokens)
    prompts = [tiny_tokenizer(p)["input_ids"] for p in PROMPTS]
    assert max(len(p) for p in prompts) > 24  # longer than the window, the global layers see all
    lengths = [20, 12, 25, 30]
    arrivals = staggered(prompts, lengths)
    tokens, _, _ = run(engine, arrivals)
    for rid, prompt, n in zip("abcd", prompts, lengths):
        assert tokens[rid][0] == hf_greedy(model_dir, prompt, n), (arch, rid)


@pytest.mark.parametrize("arch", ["gemma2", "gemma3"])
def test_gemma_prefix_cache_hit(arch, gemma_dirs, tiny_tokenizer):
    model_dir = gemma_dirs[arch]
    engine = make_engine(model_dir, max_num_batched_tokens=64)
    system = tiny_tokenizer(PROMPTS[2])["input_ids"]
    prompts = [system + tiny_tokenizer(q)["input_ids"] for q in ("What is it?", "Why?")]
    arrivals = {
        0: [("r0", prompts[0], SamplingParams(max_new_tokens=16))],
        20: [("r1", prompts[1], SamplingParams(max_new_tokens=16))],
    }
    tokens, _, _ = run(engine, arrivals)
    assert engine.blocks.prefix_hit_tokens > 0
    for i, p in enumerate(prompts):
        assert tokens[f"r{i}"][0] == hf_greedy(model_dir, p, 16), (arch, i)


def test_gemma2_final_cap_in_prompt_logprobs(gemma_dirs, tiny_tokenizer):
    """The logit cap leaves greedy choices alone (tanh is monotonic) but not the log-probabilities."""
    import torch

    from .engine_helpers import _hf

    model_dir = gemma_dirs["gemma2"]
    engine = make_engine(model_dir)
    prompt = tiny_tokenizer(PROMPTS[0])["input_ids"]
    _, _, deltas = run(engine, {0: [("p", prompt, SamplingParams(max_new_tokens=1, prompt_logprobs=0))]})
    ours = next(d.prompt_logprobs for d in deltas if d.prompt_logprobs)
    with torch.no_grad():
        logits = _hf(model_dir)(torch.tensor([prompt])).logits[0].float()
    cap = 3.0  # the tiny model's final_logit_softcapping
    for capped, close in ((logits, True), (torch.atanh(logits / cap) * cap, False)):
        expected = torch.log_softmax(capped, -1)[torch.arange(len(prompt) - 1), torch.tensor(prompt[1:])]
        assert ours[0] is None
        assert torch.allclose(torch.tensor(ours[1:]), expected, atol=1e-4) is close


@pytest.mark.parametrize("arch", ["gemma2", "gemma3"])
def test_gemma_lora_matches_peft(arch, gemma_dirs, tiny_tokenizer, tmp_path):
    """An adapter on every projection, beside requests for the base model in the same batch."""
    from lmiserve import wire
    from tests.lora_adapters import build_adapter, peft_greedy

    model_dir = gemma_dirs[arch]
    adapter = build_adapter(model_dir, tmp_path / "all", seed=11, rank=8)
    engine = make_engine(model_dir, enable_lora=True, max_loras=1, max_lora_rank=8)
    result = engine.adapter_command(wire.AdapterCommand(op_id=0, action="register", name="all", src=str(adapter)))
    assert result.kind is None, result.error
    ids = [tiny_tokenizer(p)["input_ids"] for p in PROMPTS[:3]]
    names = {"r0": "all", "r1": "", "r2": "all"}
    original = engine.add_request
    engine.add_request = lambda rid, prompt, params: original(rid, prompt, params, names[rid])
    arrivals = {0: [(rid, ids[i], SamplingParams(max_new_tokens=12)) for i, rid in enumerate(names)]}
    tokens, _, deltas = run(engine, arrivals)
    assert not [d for d in deltas if d.error]
    for i, (rid, name) in enumerate(names.items()):
        want = peft_greedy(model_dir, adapter if name else None, ids[i], 12)
        assert tokens[rid][0] == want, (arch, rid)
    assert tokens["r0"][0] != peft_greedy(model_dir, None, ids[0], 12)  # the adapter changes the tokens


@pytest.mark.parametrize("arch", ["gemma2", "gemma3"])
def test_gemma_deterministic_mode(arch, gemma_dirs, tiny_tokenizer):
    """bf16, deterministic: a request's tokens alone, beside others, prefilled in chunks of 16 and
    from the prefix cache are the same."""
    import random

    model_dir = gemma_dirs[arch]
    prompt = tiny_tokenizer(PROMPTS[2])["input_ids"]

    def tokens(budget=64, others=(), warm=False):
        engine = make_engine(model_dir, dtype="bf16", deterministic=True, max_num_batched_tokens=budget)
        if warm:
            run(engine, {0: [("w", prompt, SamplingParams(max_new_tokens=1))]})
        arrivals = {0: [(f"o{i}", p, SamplingParams(max_new_tokens=8)) for i, p in enumerate(others)]}
        arrivals[0].append(("t", prompt, SamplingParams(max_new_tokens=12)))
        got, _, _ = run(engine, arrivals)
        assert not warm or engine.blocks.prefix_hit_tokens > 0
        return got["t"][0]

    rng = random.Random(5)
    others = [[rng.randrange(4, len(tiny_tokenizer)) for _ in range(rng.randrange(3, 40))] for _ in range(7)]
    alone = tokens(budget=512)
    assert len(alone) == 12
    assert tokens(others=others) == alone
    assert tokens(budget=16) == alone
    assert tokens(budget=16, warm=True) == alone


@pytest.mark.parametrize("arch", ["gemma2", "gemma3"])
def test_gemma_sharded_forward_equals_the_whole_model(arch, gemma_dirs):
    """Two tensor-parallel ranks (threads, all-reduces summed in memory) against one."""
    import torch

    from . import tp_helpers

    model_dir = gemma_dirs[arch]
    steps, _ = tp_helpers.batch_steps(tp_helpers.spec_of(model_dir).vocab_size)
    whole = tp_helpers.sharded_logits(model_dir, 1, "cpu", steps)
    sharded = tp_helpers.sharded_logits(model_dir, 2, "cpu", steps)
    for w, s in zip(whole, sharded):
        torch.testing.assert_close(s, w, atol=2e-5, rtol=1e-4)
