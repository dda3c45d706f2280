"""Speculation beside the engine's other features: LoRA adapters (every verify row adapted), beam
searches (which do not propose) and a failing request (the others go on), each with the tokens of
the engine without speculation."""

from __future__ import annotations

from lmiserve import wire
from lmiserve.config.speculative import parse_speculative
from lmiserve.wire import SamplingParams
from tests.lora_adapters import build_adapter
from tests.unit.engine.engine_helpers import fail_request, make_engine

NGRAM = parse_speculative('{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "adaptive": false}')
PROMPT = [9, 10, 11, 12, 9, 10, 11, 12, 9, 10, 11, 12, 9, 10, 40, 41, 9, 10, 11]


def _generate(engine, requests, adapters=None):
    for rid, (prompt, params) in requests.items():
        engine.add_request(rid, prompt, params, (adapters or {}).get(rid, ""))
    tokens, finish = {rid: {} for rid in requests}, {}
    while engine.has_work():
        for d in engine.step():
            tokens[d.request_id].setdefault(d.index, []).extend(d.token_ids)
            if d.finish_reason:
                finish[(d.request_id, d.index)] = d.finish_reason
    return tokens, finish


def test_lora_rows_are_adapted(tiny_llama_dir, tmp_path):
    adapter = build_adapter(tiny_llama_dir, tmp_path / "a", seed=21, rank=8)
    requests = {
        "base": (PROMPT, SamplingParams(max_new_tokens=16)),
        "lora": (PROMPT, SamplingParams(max_new_tokens=16)),
    }
    outs = []
    for spec in (None, NGRAM):
        engine = make_engine(tiny_llama_dir, enable_lora=True, max_loras=1, speculative=spec)
        result = engine.adapter_command(wire.AdapterCommand(op_id=1, action="register", name="a", src=str(adapter)))
        assert result.kind is None, result.error
        outs.append(_generate(engine, requests, {"lora": "a"}))
        if spec is not None:
            assert engine.stats().spec_drafts > 0
    assert outs[0] == outs[1]
    assert outs[0][0]["lora"] != outs[0][0]["base"]  # the adapter changes the tokens


def test_beam_search_beside_proposing_sequences(tiny_llama_dir):
    requests = {
        "beam": (PROMPT, SamplingParams(max_new_tokens=8, num_beams=3, n=2)),
        "plain": (PROMPT, SamplingParams(max_new_tokens=12)),
    }
    plain = _generate(make_engine(tiny_llama_dir), requests)
    engine = make_engine(tiny_llama_dir, speculative=NGRAM)
    assert _generate(engine, requests) == plain
    assert engine.stats().spec_drafts > 0


def test_a_failing_verify_run_ends_its_request_only(tiny_llama_dir):
    requests = {
        "bad": (PROMPT, SamplingParams(max_new_tokens=12)),
        "good": (PROMPT[2:], SamplingParams(max_new_tokens=12)),
    }
    plain = _generate(make_engine(tiny_llama_dir), {"good": requests["good"]})[0]["good"]
    engine = make_engine(tiny_llama_dir, speculative=NGRAM)
    fail_request(engine, "bad", after=3)
    tokens, finish = _generate(engine, requests)
    assert finish[("bad", 0)] == "error"
    assert tokens["good"] == plain
    assert engine.blocks.num_used_blocks == 0


def test_overlapped_steps_collect_before_proposing(tiny_llama_dir):
    """With overlapped steps, a step in flight whose sequences propose is collected first; one that
    opted out keeps overlapping; the tokens are the serial engine's."""
    requests = {
        "spec": (PROMPT, SamplingParams(max_new_tokens=16)),
        "plain": (PROMPT[1:], SamplingParams(max_new_tokens=16, speculate=False)),
    }
    expected = _generate(make_engine(tiny_llama_dir, async_scheduling="false"), requests)
    engine = make_engine(tiny_llama_dir, async_scheduling="true", speculative=NGRAM)
    assert engine.overlap is not None
    assert _generate(engine, requests) == expected
    assert engine.stats().spec_drafts > 0
    alone = make_engine(tiny_llama_dir, async_scheduling="true", speculative=NGRAM)
    assert _generate(alone, {"plain": requests["plain"]})[0]["plain"] == expected[0]["plain"]
    assert alone.overlap.overlapped > 0 and alone.stats().spec_drafts == 0


def test_deterministic_text_alone_or_batched_speculating_or_not(tiny_llama_dir):
    """Deterministic mode: a request's tokens are the same alone or beside others, with or without
    proposals (greedy and seeded sampling)."""
    target = {
        "g": (PROMPT, SamplingParams(max_new_tokens=14)),
        "s": (PROMPT, SamplingParams(max_new_tokens=14, do_sample=True, temperature=0.8, seed=5)),
    }
    others = {f"o{i}": (PROMPT[i:] + [50 + i], SamplingParams(max_new_tokens=10)) for i in range(3)}
    alone = _generate(make_engine(tiny_llama_dir, deterministic=True), target)[0]
    for spec in (None, NGRAM):
        engine = make_engine(tiny_llama_dir, deterministic=True, speculative=spec)
        batched = _generate(engine, {**target, **others})[0]
        assert {rid: batched[rid] for rid in target} == alone
