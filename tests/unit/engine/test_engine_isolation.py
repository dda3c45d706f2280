"""A failure while running one request ends that request alone."""

import pytest

from lmiserve.wire import SamplingParams

from .engine_helpers import fail_request, hf_greedy, make_engine, run

pytestmark = pytest.mark.usefixtures("scheduling")


def test_failing_request_is_isolated_and_others_continue(tiny_model_dirs, tiny_tokenizer):
    model_dir = tiny_model_dirs["llama"]
    engine = make_engine(model_dir)
    fail_request(engine, "bad")
    prompts = {
        rid: tiny_tokenizer(p)["input_ids"]
        for rid, p in [("a", "What is it?"), ("bad", "Hi there"), ("c", "Numbers: 1 2")]
    }
    arrivals = {0: [(rid, ids, SamplingParams(max_new_tokens=10)) for rid, ids in prompts.items()]}
    tokens, finish, deltas = run(engine, arrivals)
    assert finish["bad"][0] == "error"
    assert any(d.request_id == "bad" and d.error and "injected fault" in d.error for d in deltas)
    for rid in ("a", "c"):
        assert tokens[rid][0] == hf_greedy(model_dir, prompts[rid], 10)
    assert engine.blocks.num_used_blocks == 0


def test_requests_the_engine_cannot_take_are_rejected(tiny_model_dirs):
    import pytest

    from lmiserve.rolling_batch.core.engine import RequestRejected

    engine = make_engine(tiny_model_dirs["llama"], max_model_len=64)
    with pytest.raises(RequestRejected):
        engine.add_request("empty", [], SamplingParams())
    with pytest.raises(RequestRejected):
        engine.add_request("long", [5] * 64, SamplingParams())
    with pytest.raises(RequestRejected):
        engine.add_request("vocab", [10**7], SamplingParams())
    engine.add_request("ok", [5, 6], SamplingParams(max_new_tokens=100))
    with pytest.raises(RequestRejected):
        engine.add_request("ok", [5], SamplingParams())
    tokens, finish, _ = run(engine, {0: []})
    assert len(engine.groups) == 0


def test_max_model_len_caps_generation(tiny_model_dirs):
    engine = make_engine(tiny_model_dirs["llama"], max_model_len=40)
    tokens, finish, _ = run(
        engine, {0: [("r", list(range(5, 35)), SamplingParams(max_new_tokens=100, ignore_eos=True))]}
    )
    assert len(tokens["r"][0]) == 10 and finish["r"][0] == "length"


def test_abort_frees_blocks_at_once(tiny_model_dirs):
    engine = make_engine(tiny_model_dirs["llama"])
    engine.add_request("r", list(range(5, 40)), SamplingParams(max_new_tokens=100, ignore_eos=True))
    engine.step()
    assert engine.blocks.num_used_blocks > 0
    engine.abort("r")
    assert engine.blocks.num_used_blocks == 0 and not engine.has_work()
