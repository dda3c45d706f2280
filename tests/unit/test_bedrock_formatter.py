"""Amazon Bedrock's Meta Llama schema: parsing, bodies, stream lines and errors."""

import json

import pytest

from lmiserve.errors import GenerationError, Overloaded, ValidationFailed
from lmiserve.formatters import bedrock
from lmiserve.generation.request import RequestOutput, SequenceOutput, TokenOutput


def parse(body, stream=False):
    return bedrock.parse_request(json.dumps(body).encode(), stream)


def test_defaults_are_bedrocks():
    req = parse({"prompt": "Hi"})
    p = req.generation.params
    assert req.generation.prompt == "Hi" and not req.stream
    assert (p.max_new_tokens, p.temperature, p.top_p, p.do_sample) == (512, 0.5, 0.9, True)


def test_parameters_map_and_temperature_zero_is_greedy():
    p = parse({"prompt": "Hi", "temperature": 0.2, "top_p": 0.5, "max_gen_len": 7}).generation.params
    assert (p.max_new_tokens, p.temperature, p.top_p, p.do_sample) == (7, 0.2, 0.5, True)
    greedy = parse({"prompt": "Hi", "temperature": 0}, stream=True)
    assert greedy.stream and not greedy.generation.params.do_sample


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({}, "required key [prompt]"),
        ({"prompt": 3}, "#/prompt"),
        ({"prompt": "x", "temperature": 1.5}, "#/temperature"),
        ({"prompt": "x", "top_p": "high"}, "#/top_p"),
        ({"prompt": "x", "max_gen_len": 0}, "#/max_gen_len"),
        ({"prompt": "x", "max_gen_len": 1.5}, "#/max_gen_len"),
        ({"prompt": "x", "inputs_extra": 1}, "extraneous key [inputs_extra]"),
        ([1, 2], "JSONObject"),
    ],
)
def test_invalid_requests_are_validation_errors(body, words):
    with pytest.raises(ValidationFailed) as info:
        parse(body)
    assert info.value.detail.startswith("Malformed input request: ") and words in info.value.detail


def test_non_json_is_a_validation_error():
    with pytest.raises(ValidationFailed):
        bedrock.parse_request(b"not json")


def test_stream_header():
    assert bedrock.wants_stream({"x-amzn-sagemaker-forwarded-api": "InvokeEndpointWithResponseStream"})
    assert not bedrock.wants_stream({"x-amzn-sagemaker-forwarded-api": "InvokeEndpoint"})
    assert not bedrock.wants_stream({})


def test_stop_reasons():
    assert bedrock.stop_reason("length") == "length"
    assert bedrock.stop_reason("eos_token") == "stop"
    assert bedrock.stop_reason("stop_sequence") == "stop"
    assert bedrock.stop_reason(None) is None


def _out(text, tokens, new, finish=None):
    toks = [TokenOutput(id=i, text="", logprob=None) for i in range(tokens)]
    seq = SequenceOutput(index=0, text=text, tokens=toks, new_tokens=toks[tokens - new :], finish_reason=finish)
    return RequestOutput(request_id="r", prompt="p", prompt_token_ids=[1, 2, 3], sequences=[seq])


def test_final_body():
    body = json.loads(bedrock.final_body(_out("Hello there", 4, 4, "length")))
    assert body == {
        "generation": "Hello there",
        "prompt_token_count": 3,
        "generation_token_count": 4,
        "stop_reason": "length",
    }


def test_stream_lines_carry_new_text_and_running_counts():
    responder = bedrock.BedrockResponder(parse({"prompt": "p"}, stream=True))
    assert responder.stream and responder.media_type == "application/jsonlines"
    lines = [
        responder.chunk(0, _out("He", 1, 1)),
        responder.chunk(0, _out("He", 1, 0)),  # nothing new: nothing sent
        responder.chunk(0, _out("Hello", 3, 2)),
        responder.chunk(0, _out("Hello!", 4, 1, "eos_token")),
    ]
    assert lines[1] == b""
    parsed = [json.loads(line) for line in lines if line]
    assert all(line.endswith(b"\n") for line in lines if line)
    assert parsed == [
        {"generation": "He", "prompt_token_count": 3, "generation_token_count": 1, "stop_reason": None},
        {"generation": "llo", "prompt_token_count": None, "generation_token_count": 3, "stop_reason": None},
        {"generation": "!", "prompt_token_count": None, "generation_token_count": 4, "stop_reason": "stop"},
    ]


def test_error_bodies():
    status, body, headers = bedrock.error_body(ValidationFailed("bad"))
    assert (status, json.loads(body), headers) == (400, {"message": "bad"}, {"x-amzn-ErrorType": "ValidationException"})
    status, body, headers = bedrock.error_body(Overloaded("busy"))
    assert status == 429 and headers["x-amzn-ErrorType"] == "ThrottlingException"
    status, body, headers = bedrock.error_body(GenerationError("boom"))
    assert status == 424 and json.loads(body) == {"message": "boom"}
    chunk = bedrock.BedrockResponder(parse({"prompt": "p"}, True)).error_chunk("boom")
    assert json.loads(chunk) == {"message": "boom", "type": "modelStreamErrorException"}
