"""The LMI rolling-batch schema, byte for byte against golden fixtures."""

import json
import os
from pathlib import Path

import pytest

from lmiserve.errors import BadRequest, ValidationFailed
from lmiserve.formatters import lmi_rolling as fmt
from lmiserve.formatters import lmi_rolling_output as out_fmt
from lmiserve.generation.request import RequestOutput, SequenceOutput, TokenOutput

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "lmi_rolling"
PROMPT = "What is Deep Learning?"
TOKENS = [(29602, "Deep", -0.0524), (5663, " Learning", -1.2865), (314, " is", -0.0074), (253, " a", -0.25)]


def golden(name: str, data: bytes) -> None:
    """Compare with the fixture; LMISERVE_UPDATE_GOLDEN=1 rewrites it (review the diff)."""
    path = FIXTURES / name
    if os.environ.get("LMISERVE_UPDATE_GOLDEN") == "1":
        path.write_bytes(data)
    assert path.exists(), f"missing fixture {name}"
    assert data == path.read_bytes(), f"{name} changed"


def parse(body: dict, **defaults) -> fmt.ParsedRequest:
    import json

    return fmt.parse_request(json.dumps(body).encode(), fmt.Defaults(**defaults))


def output(finish="length", prefill=False, top=False, sequences=1) -> RequestOutput:
    seqs = []
    for index in range(sequences):
        toks = [
            TokenOutput(
                i,
                t,
                lp - index,
                top=[TokenOutput(i, t, lp - index), TokenOutput(2, "<|im_end|>", -3.5, True)] if top else None,
            )
            for i, t, lp in TOKENS[: 4 - index]
        ]
        seq = SequenceOutput(
            index, "".join(t.text for t in toks), toks, list(toks), finish, sum(t.logprob for t in toks)
        )
        seqs.append(seq)
    out = RequestOutput("r", PROMPT, [1780, 314, 12584, 5663, 47], seqs)
    if prefill:
        out.prompt_tokens = [
            TokenOutput(1780, "What", None),
            TokenOutput(314, " is", -3.93),
            TokenOutput(12584, " Deep", -11.9),
            TokenOutput(5663, " Learning", -1.67),
            TokenOutput(47, "?", -0.79),
        ]
    return out


def stream_bytes(out: RequestOutput, req: fmt.ParsedRequest) -> bytes:
    """Replay ``out`` one token per update, as the server does."""
    seq = out.sequences[0]
    tokens, final = list(seq.tokens), seq.finish_reason
    chunks = []
    for i, token in enumerate(tokens):
        seq.new_tokens = [token]
        seq.tokens = tokens[: i + 1]
        seq.text = "".join(t.text for t in seq.tokens)
        seq.finish_reason = final if i == len(tokens) - 1 else None
        chunks.append(out_fmt.stream_chunks(out, req, first=i == 0))
    return b"".join(chunks)


def test_plain_json():
    golden("plain.json", out_fmt.final_body(output(), parse({"inputs": PROMPT})))


def test_details_with_prefill_and_top_tokens():
    req = parse({"inputs": PROMPT, "parameters": {"details": True, "decoder_input_details": True, "top_n_tokens": 2}})
    golden("details.json", out_fmt.final_body(output(prefill=True, top=True), req))


def test_best_of_sequences():
    req = parse({"inputs": PROMPT, "parameters": {"details": True, "n": 2, "do_sample": True}})
    golden("best_of.json", out_fmt.final_body(output(sequences=2), req))


def test_return_full_text():
    req = parse({"inputs": PROMPT, "parameters": {"return_full_text": True}})
    assert out_fmt.final_body(output(), req) == b'{"generated_text":"What is Deep Learning?Deep Learning is a"}'


def test_tgi_compat_json_is_a_list_with_logprob():
    req = parse({"inputs": PROMPT, "parameters": {"details": True}}, tgi_compat=True)
    golden("tgi_compat.json", out_fmt.final_body(output(finish="eos_token"), req))


def test_jsonlines_stream():
    req = parse({"inputs": PROMPT, "parameters": {"details": True}, "stream": True})
    assert req.content_type == "application/jsonlines"
    golden("stream.jsonl", stream_bytes(output(), req))


def test_sse_stream_from_configuration_and_parameter():
    req = parse({"inputs": PROMPT, "stream": True}, output_formatter="sse")
    assert req.content_type == "text/event-stream"
    golden("stream.sse", stream_bytes(output(), req))
    req = parse({"inputs": PROMPT, "parameters": {"output_formatter": "sse"}, "stream": True})
    assert req.output_format == "sse"


def test_tgi_compat_streams_sse_by_default():
    req = parse({"inputs": PROMPT, "stream": True}, tgi_compat=True)
    assert req.output_format == "sse"
    golden("tgi_compat_stream.sse", stream_bytes(output(), req))


def test_streaming_configuration():
    assert parse({"inputs": "x"}, enable_streaming=True).stream
    assert parse({"inputs": "x"}, output_formatter="jsonlines").stream
    assert not parse({"inputs": "x", "stream": False}, enable_streaming=True).stream
    assert not parse({"inputs": "x"}).stream


def test_error_payloads():
    golden("validation_error.json", out_fmt.validation_error_body("parameters.top_p: bad"))
    golden("generation_error.json", out_fmt.generation_error_body(parse({"inputs": "x"})))
    golden("stream_error.jsonl", out_fmt.stream_error_chunk(parse({"inputs": "x", "stream": True}), "boom"))
    tgi_stream = parse({"inputs": "x", "stream": True}, tgi_compat=True)
    golden("tgi_stream_error.sse", out_fmt.stream_error_chunk(tgi_stream, "boom"))


def test_parameters_map_to_sampling():
    req = parse(
        {
            "inputs": "x",
            "parameters": {
                "do_sample": True,
                "temperature": 0.7,
                "top_k": -1,
                "top_p": 0.9,
                "seed": 5,
                "max_new_tokens": 7,
                "stop_sequences": ["\n"],
                "ignore_eos_token": True,
                "decoder_input_details": True,
                "top_n_tokens": 3,
                "n": 2,
                "best_of": 3,
                "repetition_penalty": 1.2,
                "stop_token_ids": [9],
            },
        }
    )
    p = req.generation.params
    assert (p.do_sample, p.temperature, p.top_k, p.top_p, p.seed, p.max_new_tokens) == (True, 0.7, 0, 0.9, 5, 7)
    assert (p.ignore_eos, p.prompt_logprobs, p.logprobs, p.n, p.best_of, p.repetition_penalty) == (
        True,
        3,
        3,
        2,
        3,
        1.2,
    )
    assert p.stop_token_ids == [9] and req.generation.stop == ["\n"]


@pytest.mark.parametrize(
    "params,where",
    [
        ({"temperature": -1}, "temperature"),
        ({"temperature": -0.01}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"n": 3, "best_of": 2}, "best_of (2) must be at least n (3)"),
        ({"num_beams": 2, "n": 3}, "must not exceed num_beams"),
        ({"typical_p": 1.5}, "typical_p"),
        ({"top_n_tokens": 99}, "top_n_tokens"),
    ],
)
def test_out_of_range_values_are_validation_errors(params, where):
    with pytest.raises(ValidationFailed) as err:
        parse({"inputs": "x", "parameters": params})
    assert where in err.value.detail


def test_n_with_streaming_is_refused():
    with pytest.raises(ValidationFailed, match="without streaming"):
        parse({"inputs": "x", "parameters": {"num_beams": 2}, "stream": True})
    with pytest.raises(ValidationFailed, match="without streaming"):
        parse({"inputs": "x", "parameters": {"n": 2}, "stream": True})


@pytest.mark.parametrize("body", [b"nope", b"[]", b'{"prompt": "x"}'])
def test_malformed_bodies(body):
    with pytest.raises(BadRequest):
        fmt.parse_request(body, fmt.Defaults())


# --- the document's error responses, details under tgi_compat, beams, temperature 0 ------------


def refusal(body, **defaults):
    import json

    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    try:
        fmt.parse_request(raw, fmt.Defaults(**defaults))
    except (BadRequest, ValidationFailed) as err:
        return out_fmt.refusal(raw, fmt.Defaults(**defaults), err)
    raise AssertionError("the request was accepted")


@pytest.mark.parametrize("params", [{"top_p": 2}, {"temperature": -3}, {"n": 3, "best_of": 2}])
def test_bad_parameter_value_answers_the_documents_error_response(params):
    status, body, media_type = refusal({"inputs": "x", "parameters": params})
    assert (status, media_type) == (400, "application/json")
    golden("bad_parameter.json", body)
    status, body, media_type = refusal({"inputs": "x", "parameters": params, "stream": True})
    assert (status, media_type) == (400, "application/jsonlines")
    golden("bad_parameter_stream.jsonl", body)


@pytest.mark.parametrize(
    "body", [b"nope", b"[]", b'{"prompt": "x"}', b'{"inputs": 5}', b'{"inputs": "x", "parameters": {"top_p": "high"}}']
)
def test_payload_validation_answers_424(body):
    status, data, media_type = refusal(body)
    assert (status, media_type) == (424, "application/json")
    import orjson

    answer = orjson.loads(data)
    assert list(answer) == ["error", "code"] and answer["code"] == 424 and answer["error"]


def test_responder_refusals_are_the_documents_error_response():
    from lmiserve.errors import GenerationError

    req = parse({"inputs": "x"})
    status, body = out_fmt.LmiResponder(req).error_body(ValidationFailed("n (200) is more than max_n (128)"))
    assert status == 400
    golden("bad_parameter.json", body)
    req = parse({"inputs": "x", "stream": True})
    responder = out_fmt.LmiResponder(req)
    assert responder.error_media_type == "application/jsonlines"
    status, body = responder.error_body(GenerationError("boom"))
    assert status == 500
    golden("bad_parameter_stream.jsonl", body)


def test_tgi_compat_turns_details_on_unless_asked_not_to():
    req = parse({"inputs": PROMPT}, tgi_compat=True)
    assert req.parameters.details
    golden("tgi_compat_default.json", out_fmt.final_body(output(finish="eos_token"), req))
    assert not parse({"inputs": PROMPT, "parameters": {"details": False}}, tgi_compat=True).parameters.details
    assert not parse({"inputs": PROMPT}).parameters.details


def test_beam_search_returns_the_other_beams_as_best_of_sequences():
    req = parse({"inputs": PROMPT, "parameters": {"details": True, "num_beams": 3}})
    p = req.generation.params
    assert (p.num_beams, p.n, p.best_of) == (3, 3, 3)
    golden("beams.json", out_fmt.final_body(output(sequences=3), req))


def test_temperature_zero_is_greedy():
    p = parse({"inputs": "x", "parameters": {"temperature": 0, "do_sample": True}}).generation.params
    assert (p.do_sample, p.temperature) == (False, 1.0)
    p = parse({"inputs": "x", "parameters": {"temperature": 0.5, "do_sample": True}}).generation.params
    assert (p.do_sample, p.temperature) == (True, 0.5)


def test_spaces_between_special_tokens_reaches_the_request():
    assert parse({"inputs": "x"}).generation.spaces_between_special_tokens is True
    req = parse({"inputs": "x", "parameters": {"spaces_between_special_tokens": False}})
    assert req.generation.spaces_between_special_tokens is False


def test_tensorrt_llm_parameters_are_applied():
    req = parse(
        {
            "inputs": "x",
            "parameters": {
                "min_length": 4,
                "bad_sequences": ["foo", "bar baz"],
                "stop": ["\n\n"],
                "stop_sequences": ["."],
            },
        }
    )
    p = req.generation.params
    assert (p.min_new_tokens, p.bad_words) == (4, ["foo", "bar baz"])
    assert req.generation.stop == [".", "\n\n"]
    assert parse(
        {"inputs": "x", "parameters": {"bad_sequences": "foo", "stop": False}}
    ).generation.params.bad_words == ["foo"]


@pytest.mark.parametrize(
    ("params", "where"),
    [
        ({"stop": True}, "stops a TensorRT-LLM request in flight"),
        ({"bad_sequences": ["x"], "num_beams": 2}, "bad_sequences does not combine with beam search"),
        ({"min_length": -1}, "min_length"),
    ],
)
def test_tensorrt_llm_parameters_that_cannot_apply_are_refused(params, where):
    with pytest.raises(ValidationFailed, match=where):
        parse({"inputs": "x", "parameters": params})


def test_logprobs_and_prompt_logprobs_show_in_details_as_top_tokens_and_prefill():
    req = parse({"inputs": PROMPT, "parameters": {"details": True, "logprobs": 2, "prompt_logprobs": 0}})
    assert (req.generation.params.logprobs, req.generation.params.prompt_logprobs) == (2, 0)
    body = json.loads(out_fmt.final_body(output(prefill=True, top=True), req))
    assert [t["id"] for t in body["details"]["prefill"]] == [1780, 314, 12584, 5663, 47]
    assert body["details"]["prefill"][1]["log_prob"] == -3.93
    assert [[t["id"] for t in top] for top in body["details"]["top_tokens"]][0] == [TOKENS[0][0], 2]
    plain = json.loads(
        out_fmt.final_body(output(prefill=True, top=True), parse({"inputs": PROMPT, "parameters": {"details": True}}))
    )
    assert "prefill" not in plain["details"] and "top_tokens" not in plain["details"]
    streamed = stream_bytes(output(prefill=True, top=True), req).splitlines()
    assert all("top_tokens" in json.loads(line) for line in streamed)
    assert "prefill" in json.loads(streamed[-1])["details"]
