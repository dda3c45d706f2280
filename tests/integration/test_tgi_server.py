"""TGI / MindIE routes, with TGI's own Python client (text-generation) and raw HTTP."""

import json

import httpx
import pytest
from text_generation import Client
from text_generation.errors import ValidationError

from .engine_server import Reference

PROMPT = "What is Deep Learning?"


@pytest.fixture(scope="module")
def reference(tiny_llama_dir):
    return Reference(tiny_llama_dir)


@pytest.fixture(scope="module")
def server(engine_server):
    return engine_server


def test_client_generate_with_details(server, reference):
    client = Client(server.url, timeout=60)
    r = client.generate(PROMPT, max_new_tokens=10, decoder_input_details=True)
    assert r.generated_text == reference.text(PROMPT, 10)
    d = r.details
    assert d.generated_tokens == len(d.tokens) <= 10
    assert [t.id for t in d.tokens] == reference.ids(PROMPT, 10)[: len(d.tokens)]
    assert [t.id for t in d.prefill] == reference.tokenizer(PROMPT)["input_ids"]
    assert d.prefill[0].logprob is None and all(t.logprob <= 0 for t in d.tokens)
    assert isinstance(d.seed, int) and d.finish_reason.value in ("length", "eos_token")


def test_client_generate_stream(server, reference):
    # TGI's client streams from its base URL; "/" is MindIE's (a list token id), so TGI clients
    # that stream use TGI's own /generate_stream
    client = Client(server.url + "/generate_stream", timeout=60)
    responses = list(client.generate_stream(PROMPT, max_new_tokens=10))
    assert "".join(r.token.text for r in responses) == responses[-1].generated_text == reference.text(PROMPT, 10)
    assert all(r.generated_text is None for r in responses[:-1])
    assert responses[-1].details.generated_tokens == len(responses)


def test_client_sees_validation_errors(server):
    """TGI's own route refuses watermark (TGI would apply it); MindIE's / accepts it and applies none,
    as MindIE's document says."""
    with pytest.raises(ValidationError, match="watermark"):
        Client(server.url + "/generate", timeout=60).generate(PROMPT, watermark=True)
    assert Client(server.url, timeout=60).generate(PROMPT, max_new_tokens=2, watermark=True).generated_text


def test_generate_route_answers_an_object_with_timing_headers(server, reference):
    r = httpx.post(server.url + "/generate", json={"inputs": PROMPT, "parameters": {"max_new_tokens": 6}}, timeout=60)
    assert r.status_code == 200
    assert r.json() == {"generated_text": reference.text(PROMPT, 6)}
    for header in ("x-queue-time", "x-inference-time", "x-time-per-token", "x-prompt-tokens", "x-generated-tokens"):
        assert int(r.headers[header]) >= 0
    assert int(r.headers["x-prompt-tokens"]) == len(reference.tokenizer(PROMPT)["input_ids"])


def test_generate_stream_route_sends_sse_events(server):
    r = httpx.post(
        server.url + "/generate_stream",
        json={"inputs": PROMPT, "parameters": {"max_new_tokens": 4, "details": True}},
        timeout=60,
    )
    assert r.headers["content-type"].startswith("text/event-stream")
    events = [json.loads(e[len("data:") :]) for e in r.text.split("\n\n") if e.strip()]
    assert all(set(e) >= {"token", "generated_text", "details"} for e in events)
    assert events[0]["generated_text"] is None and events[0]["details"] is None
    last = events[-1]
    assert [e["index"] for e in events] == list(range(1, len(events) + 1))
    assert all(isinstance(e["token"]["id"], int) for e in events)
    assert r.text.startswith("data:{")
    assert set(last["details"]) == {"finish_reason", "generated_tokens", "seed"}


def test_root_route_streams_mindies_events(server, reference):
    body = {"inputs": PROMPT, "parameters": {"max_new_tokens": 4, "details": True}, "stream": True}
    r = httpx.post(server.url + "/", json=body, timeout=60)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    chunks = [e for e in r.text.split("\n\n") if e.strip()]
    assert all(e.startswith("data: {") for e in chunks)
    events = [json.loads(e[len("data: ") :]) for e in chunks]
    ids = [i for e in events for i in e["token"]["id"]]
    assert ids == reference.ids(PROMPT, 4)[: len(ids)]
    assert set(events[-1]["details"]) == {"prompt_tokens", "finish_reason", "generated_tokens", "seed"}


def test_root_route_lowers_max_new_tokens_to_what_fits(server, reference):
    """MindIE: at most min(max_iter_times, max_new_tokens) tokens, and what fits in the context
    (256 here); a request beyond that generates until the context is full and ends with length."""
    body = {"inputs": PROMPT, "parameters": {"max_new_tokens": 2147483647, "details": True}}
    r = httpx.post(server.url + "/", json=body, timeout=120)
    assert r.status_code == 200, r.text
    details = r.json()[0]["details"]
    prompt = len(reference.tokenizer(PROMPT)["input_ids"])
    assert details["prompt_tokens"] == prompt
    assert details["finish_reason"] in ("length", "eos_token")
    assert details["generated_tokens"] <= 256 - prompt
    r = httpx.post(server.url + "/generate", json=body, timeout=60)
    assert r.status_code == 422  # TGI's own route keeps refusing it


def test_root_route_refuses_media_parts_on_a_text_model(server):
    parts = [{"type": "text", "text": PROMPT}, {"type": "image_url", "image_url": "/xxxx/test.png"}]
    r = httpx.post(server.url + "/", json={"inputs": parts}, timeout=60)
    assert r.status_code == 422 and r.json()["error"] == "inputs[1]: model tiny reads text only; it cannot take images"
    r = httpx.post(
        server.url + "/", json={"inputs": [{"type": "text", "text": PROMPT}], "parameters": {"max_new_tokens": 2}}
    )
    assert r.status_code == 200 and len(r.json()) == 1


def test_best_of_with_sampling(server):
    body = {
        "inputs": PROMPT,
        "parameters": {"max_new_tokens": 5, "best_of": 3, "do_sample": True, "details": True, "seed": 7},
    }
    r = httpx.post(server.url + "/generate", json=body, timeout=60).json()
    assert len(r["details"]["best_of_sequences"]) == 2 and r["details"]["seed"] == 7


@pytest.mark.parametrize(
    "params,stream,fragment",
    [
        ({"temperature": 0}, False, "temperature"),
        ({"top_p": 1.0}, False, "top_p"),
        ({"max_new_tokens": 0}, False, "max_new_tokens"),
        ({"adapter_id": "my-lora"}, False, "Adapter my-lora is not registered"),
        ({"decoder_input_details": True}, True, "decoder_input_details"),
        ({"best_of": 2}, False, "best_of"),
        ({"stop": ["x" * 2000]}, False, "stop"),
    ],
)
def test_validation_errors_are_422(server, params, stream, fragment):
    r = httpx.post(server.url + "/", json={"inputs": PROMPT, "parameters": params, "stream": stream}, timeout=60)
    assert r.status_code == 422
    body = r.json()
    assert body["error_type"] == "validation" and fragment in body["error"]


def test_info_health_tokenize(server, reference):
    info = httpx.get(server.url + "/info").json()
    assert info["model_id"] == "tiny" and info["max_total_tokens"] == 256 and info["model_dtype"] == "fp32"
    assert httpx.get(server.url + "/health").status_code == 200
    tokens = httpx.post(server.url + "/tokenize", json={"inputs": PROMPT}).json()
    assert [t["id"] for t in tokens] == reference.tokenizer(PROMPT)["input_ids"]
    assert "".join(t["text"] for t in tokens) == PROMPT


def test_grammar_regex_and_json_schema(server):
    import re

    import jsonschema
    from text_generation.types import Grammar, GrammarType

    client = Client(server.url, timeout=60)
    r = client.generate(PROMPT, max_new_tokens=12, grammar=Grammar(type=GrammarType.Regex, value="[0-9]{3}-[a-z]{2}"))
    assert re.fullmatch("[0-9]{3}-[a-z]{2}", r.generated_text)
    schema = {
        "type": "object",
        "properties": {"color": {"enum": ["red", "blue"]}, "n": {"enum": [1, 2]}},
        "required": ["color", "n"],
        "additionalProperties": False,
    }
    r = client.generate(PROMPT, max_new_tokens=40, grammar=Grammar(type=GrammarType.Json, value=schema))
    jsonschema.validate(json.loads(r.generated_text), schema)


def test_bad_grammar_is_a_validation_error(server):
    for grammar in ({"type": "regex", "value": ""}, {"type": "xml", "value": "a"}, {"type": "json", "value": "{no"}):
        r = httpx.post(
            server.url + "/generate", json={"inputs": PROMPT, "parameters": {"grammar": grammar}}, timeout=60
        )
        assert r.status_code == 422, grammar
        assert r.json()["error_type"] == "validation"
