"""Admission: every check a request meets before the engine, in one place, without touching the
parsed request."""

import pytest

from lmiserve.errors import ValidationFailed
from lmiserve.generation.admission import Admission
from lmiserve.generation.limits import RequestLimits
from lmiserve.generation.request import GenerationRequest
from lmiserve.wire import SamplingParams


class Chars:
    """A tokenizer with one token per character."""

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [ord(c) for c in text]}

    def decode(self, ids):
        return "".join(map(chr, ids))


def admission(**kw):
    base = dict(limits=RequestLimits(max_new_tokens=100), max_model_len=100, vocab_size=1000)
    return Admission(**{**base, **kw})


def test_the_admitted_request_is_final_and_the_parsed_one_untouched():
    parsed = GenerationRequest("", SamplingParams(max_new_tokens=5), prompt_ids=[104, 105])
    admitted = admission().admit(parsed, Chars())
    assert admitted.prompt_ids == (104, 105) and admitted.request.prompt == "hi"
    assert parsed.prompt == "" and parsed.prompt_ids == [104, 105]
    with pytest.raises(AttributeError):
        admitted.prompt_ids = (1,)  # frozen


@pytest.mark.parametrize(
    "request_, message",
    [
        (GenerationRequest("", SamplingParams()), "the prompt is empty"),
        (GenerationRequest("", SamplingParams(), prompt_ids=[5, 1000]), "outside the vocabulary"),
        (GenerationRequest("x" * 100, SamplingParams()), r"more than max_model_len \(100\)"),
        (GenerationRequest("hi", SamplingParams(max_new_tokens=101)), r"max_new_tokens \(101\) is more than"),
        (GenerationRequest("x" * 50, SamplingParams(max_new_tokens=60), fit_context=True), "context length of 100"),
    ],
)
def test_refusals(request_, message):
    with pytest.raises(ValidationFailed, match=message):
        admission().admit(request_, Chars())


def test_truncate_keeps_the_last_tokens_before_the_length_checks():
    admitted = admission().admit(GenerationRequest("x" * 150 + "end", SamplingParams(), truncate=3), Chars())
    assert admitted.prompt_ids == tuple(map(ord, "end"))


def test_mindie_lowers_max_new_tokens_rather_than_refusing():
    omitted = GenerationRequest("x" * 90, SamplingParams(max_new_tokens=16), max_new_tokens_omitted=True)
    assert admission().admit(omitted, Chars()).params.max_new_tokens == 10  # the room left
    assert admission(max_iter_times=4).admit(omitted, Chars()).params.max_new_tokens == 4
    capped = GenerationRequest("hi", SamplingParams(max_new_tokens=99), cap_max_new_tokens=True)
    assert admission(max_new_tokens_limit=20).admit(capped, Chars()).params.max_new_tokens == 20
    untouched = GenerationRequest("hi", SamplingParams(max_new_tokens=7))
    assert admission().admit(untouched, Chars()).params is untouched.params
