"""Prompt-lookup speculation in the engine: greedy tokens equal those without it, token for token,
whole, chunked and beside plain sequences; what it proposes is checked and rolled back."""

from __future__ import annotations

import pytest

from lmiserve.config.speculative import parse_speculative
from lmiserve.wire import GuidedDecoding, SamplingParams
from tests.unit.engine.engine_helpers import make_engine

NGRAM = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3, "adaptive": false}'


def _repeating(vocab: int, seed: int, length: int) -> list[int]:
    """A prompt that repeats a short phrase with variations: prompt lookup finds matches in it."""
    import random

    rng = random.Random(seed)
    phrase = [rng.randrange(3, vocab) for _ in range(7)]
    out: list[int] = []
    while len(out) < length:
        out += phrase if rng.random() < 0.7 else [rng.randrange(3, vocab)]
    return out[:length]


def _generate(engine, requests: dict[str, tuple[list[int], SamplingParams]]):
    for rid, (prompt, params) in requests.items():
        engine.add_request(rid, prompt, params)
    tokens: dict[str, list[int]] = {rid: [] for rid in requests}
    logprobs: dict[str, list[float]] = {rid: [] for rid in requests}
    finish: dict[str, str] = {}
    steps = 0
    while engine.has_work():
        steps += 1
        for d in engine.step():
            tokens[d.request_id] += d.token_ids
            logprobs[d.request_id] += d.logprobs
            if d.finish_reason:
                finish[d.request_id] = d.finish_reason
    return tokens, logprobs, finish, steps


def _pair(model_dir, requests, spec: str = NGRAM, **cfg):
    plain = make_engine(model_dir, **cfg)
    spec_engine = make_engine(model_dir, speculative=parse_speculative(spec), **cfg)
    return _generate(plain, requests), _generate(spec_engine, requests), spec_engine


def test_greedy_equal_tiny_llama_mixed_and_chunked(tiny_llama_dir):
    """Four requests, one opted out (plain decodes beside verify runs), a small step budget (the
    prompts run in chunks beside the verify runs): same tokens, finish reasons and log-probabilities."""
    vocab = 256
    requests = {
        f"r{i}": (_repeating(vocab, i, 40 + 9 * i), SamplingParams(max_new_tokens=24 + i, speculate=i != 2))
        for i in range(4)
    }
    (plain, plain_lp, plain_fin, plain_steps), (spec, spec_lp, spec_fin, spec_steps), engine = _pair(
        tiny_llama_dir, requests, max_num_batched_tokens=24
    )
    assert spec == plain
    assert spec_fin == plain_fin
    for rid in requests:
        assert spec_lp[rid] == pytest.approx(plain_lp[rid], abs=1e-4)
    stats = engine.stats()
    assert stats.spec_drafts > 0 and stats.spec_proposed_tokens >= stats.spec_accepted_tokens
    assert engine.blocks.num_used_blocks == 0


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_greedy_equal_smollm2(smollm2_dir, dtype):
    """The embedded SmolLM2: a copying request (most proposals kept) and a free one (most refused)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    text = "The keeper climbed the spiral stairs every evening, lit the lamp, and watched the ships pass."
    chat = [{"role": "user", "content": f"Repeat the following text exactly:\n\n{text}"}]
    copy = tok.encode(tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False))
    free = tok.encode("A list of fruits: apples, pears, plums, apples, pears,")
    requests = {
        "copy": (copy, SamplingParams(max_new_tokens=40)),
        "free": (free, SamplingParams(max_new_tokens=24)),
    }
    (plain, _, _, plain_steps), (spec, _, _, spec_steps), engine = _pair(
        smollm2_dir, requests, dtype=dtype, max_num_batched_tokens=64
    )
    assert spec == plain
    stats = engine.stats()
    assert stats.spec_accepted_tokens > 10  # the copy is mostly accepted
    assert spec_steps < plain_steps


def test_penalties_logprobs_and_guided_with_proposals(tiny_llama_dir):
    """Each proposed row is processed as a decode's with the proposals before it as output: a
    repetition penalty, top log-probabilities and a regular expression give the same tokens."""
    vocab = 256
    prompt = _repeating(vocab, 7, 48)
    requests = {
        "pen": (prompt, SamplingParams(max_new_tokens=20, repetition_penalty=1.3, frequency_penalty=0.2)),
        "top": (prompt, SamplingParams(max_new_tokens=20, logprobs=3)),
        "min": (prompt, SamplingParams(max_new_tokens=12, min_new_tokens=10)),
    }
    (plain, plain_lp, _, _), (spec, spec_lp, _, _), _ = _pair(tiny_llama_dir, requests)
    assert spec == plain
    assert spec_lp["top"] == pytest.approx(plain_lp["top"], abs=1e-4)


def test_guided_run_is_masked_at_every_row(tiny_llama_dir, tiny_tokenizer):
    """A constrained request whose proposals cross the grammar: the same tokens, all valid."""
    pytest.importorskip("xgrammar")
    regex = "(ab|cd){3,8}"
    prompt = tiny_tokenizer.encode("abcdabcdabcdab cdab cd ab cd")
    params = SamplingParams(max_new_tokens=16, guided=GuidedDecoding("regex", regex))
    (plain, _, _, _), (spec, _, _, _), engine = _pair(tiny_llama_dir, {"g": (prompt, params)})
    assert spec == plain
    assert engine.stats().spec_drafts > 0


def test_rollback_leaves_cache_as_without_proposals(tiny_llama_dir):
    """After refused proposals, the prefix cache holds exactly the blocks a run without proposals
    registers, and a following request reusing them gets the same tokens and cache hits."""
    vocab = 256
    prompt = _repeating(vocab, 3, 70)
    first = {"a": (prompt, SamplingParams(max_new_tokens=40))}
    plain_engine = make_engine(tiny_llama_dir)
    spec_engine = make_engine(tiny_llama_dir, speculative=parse_speculative(NGRAM))
    proposer = spec_engine._phases.speculation.proposer
    real = proposer.propose

    def some_wrong(seqs, counts):  # every other proposal run ends with two tokens the model never picks
        found = real(seqs, counts)
        return [
            p[:1] + [(s.token_ids[-1] * 7 + 1) % vocab, 2] if s.num_generated % 2 else p for s, p in zip(seqs, found)
        ]

    proposer.propose = some_wrong
    out_plain = _generate(plain_engine, first)[0]["a"]
    out_spec = _generate(spec_engine, first)[0]["a"]
    assert out_spec == out_plain
    assert spec_engine.stats().spec_proposed_tokens > spec_engine.stats().spec_accepted_tokens  # some refused

    def registered(engine):
        return sorted((b.hash, b.tokens) for b in engine.blocks.blocks if b.hash is not None)

    assert registered(spec_engine) == registered(plain_engine)
    follow = {"b": (prompt + out_plain[:-1], SamplingParams(max_new_tokens=12))}
    assert _generate(spec_engine, follow)[0] == _generate(plain_engine, follow)[0]
    assert spec_engine.blocks.prefix_hit_tokens == plain_engine.blocks.prefix_hit_tokens > 0
