"""A constraint that starts after a token (a reasoning model's end of thinking): the output runs
free up to that token, then follows the grammar; a replay past it continues the same way."""

import re

import pytest

from lmiserve.wire import GuidedDecoding, SamplingParams

from .engine_helpers import make_engine
from .test_replay import PROMPT, collect, replayed, tokens_of

pytestmark = pytest.mark.usefixtures("scheduling")
PATTERN = "(yes|no)[0-9]"


def test_free_until_the_token_then_constrained(tiny_model_dirs, tiny_tokenizer):
    pytest.importorskip("xgrammar")
    engine = make_engine(tiny_model_dirs["llama"])
    engine.add_request("free", PROMPT, SamplingParams(max_new_tokens=8, ignore_eos=True))
    free = tokens_of(collect(engine)["free"])
    k = next(i for i in range(1, len(free)) if free[i] not in free[:i])  # a token that comes once, first at k
    params = SamplingParams(max_new_tokens=8 + k, guided=GuidedDecoding("regex", PATTERN, after=free[k]))
    engine.add_request("after", PROMPT, params)
    first = collect(engine)["after"]
    out = tokens_of(first)
    assert out[: k + 1] == free[: k + 1]  # unconstrained up to and with the token
    assert re.fullmatch(PATTERN, tiny_tokenizer.decode(out[k + 1 :], skip_special_tokens=True))
    for j in range(1, len(out)):  # a replay from anywhere, before the token or past it
        engine.submit(replayed(PROMPT, params, first, j))
        assert tokens_of(collect(engine)[f"r{j}"]) == out[j:]


def test_without_the_token_nothing_is_constrained(tiny_model_dirs):
    pytest.importorskip("xgrammar")
    engine = make_engine(tiny_model_dirs["llama"])
    engine.add_request("free", PROMPT, SamplingParams(max_new_tokens=8, ignore_eos=True))
    free = tokens_of(collect(engine)["free"])
    absent = next(t for t in range(5, 400) if t not in free)
    guided = GuidedDecoding("regex", PATTERN, after=absent)
    engine.add_request("after", PROMPT, SamplingParams(max_new_tokens=8, ignore_eos=True, guided=guided))
    assert tokens_of(collect(engine)["after"]) == free
