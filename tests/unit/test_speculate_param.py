"""A request's ``speculate`` (false: no speculative decoding for it) on each protocol that takes it:
LMI's and TGI's ``parameters.speculate``, OpenAI completions' and chat's body field (the ``openai``
client's ``extra_body``); anything but true or false is refused in the protocol's error shape."""

import json

import pytest

from lmiserve.errors import LmiServeError
from lmiserve.formatters import errors, lmi_rolling, openai_chat, openai_completions, tgi


def lmi(parameters: dict):
    body = json.dumps({"inputs": "hi", "parameters": parameters}).encode()
    return lmi_rolling.parse_request(body, lmi_rolling.Defaults()).generation.params


def tgi_params(parameters: dict):
    return tgi.parse(json.dumps({"inputs": "hi", "parameters": parameters}).encode()).generation.params


def chat(extra: dict):
    req = openai_chat.parse({"messages": [{"role": "user", "content": "hi"}], **extra})
    return openai_chat.generation_request(req, "hi", 16).params


def completions(extra: dict):
    return openai_completions.generation_requests(openai_completions.parse({"prompt": "hi", **extra}))[0].params


PROTOCOLS = {
    "lmi": (lambda v: lmi({"speculate": v}), lambda: lmi({}), errors.lmi, 400),
    "tgi": (lambda v: tgi_params({"speculate": v}), lambda: tgi_params({}), errors.tgi, 422),
    "chat": (lambda v: chat({"speculate": v}), lambda: chat({}), errors.openai, 400),
    "completions": (lambda v: completions({"speculate": v}), lambda: completions({}), errors.openai, 400),
}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_speculate_false_reaches_the_engines_sampling_params(protocol):
    asked, default, _, _ = PROTOCOLS[protocol]
    assert default().speculate is True
    assert asked(True).speculate is True
    assert asked(False).speculate is False
    assert asked(None).speculate is True  # null: as if not sent


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("value", ["false", 0, 1, [], {"on": False}])
def test_anything_but_a_boolean_is_refused_in_the_protocols_error_shape(protocol, value):
    asked, _, shape, status = PROTOCOLS[protocol]
    with pytest.raises(LmiServeError) as err:
        asked(value)
    got, body = shape(err.value)
    assert got == status and "speculate" in json.dumps(body)


def test_beam_search_and_greedy_requests_carry_it_too():
    assert lmi({"speculate": False, "num_beams": 2}).speculate is False
    assert chat({"speculate": False, "use_beam_search": True, "n": 2}).speculate is False
    assert completions({"speculate": False, "temperature": 0}).speculate is False
