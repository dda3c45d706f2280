"""vLLM's ``structured_outputs`` and ``guided_*`` fields on the OpenAI routes, with the official
openai client, on a tiny random Llama: the output is parsed against the constraint."""

import json
import re

import httpx
import jsonschema
import openai
import pytest

PATTERN = r"[a-c]{2,4}-[0-9]{3}"
CHOICES = ["red", "green", "blue", 'say "hi"']
GRAMMAR = 'root ::= "yes" | "no" | ("maybe " [0-9])'
GRAMMAR_AS_REGEX = r"yes|no|maybe [0-9]"
SCHEMA = {
    "type": "object",
    "properties": {"n": {"enum": [1, 2, 3]}, "ok": {"type": "boolean"}},
    "required": ["n", "ok"],
    "additionalProperties": False,
}
MESSAGES = [{"role": "user", "content": "Answer briefly"}]


@pytest.fixture(scope="module")
def server(engine_server):
    return engine_server


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", timeout=120)


def chat_text(client, extra: dict, seed: int = 1) -> str:
    r = client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=60, temperature=0.9, seed=seed, extra_body=extra
    )
    assert r.choices[0].finish_reason == "stop"
    return r.choices[0].message.content


def completion_text(client, extra: dict, seed: int = 1) -> str:
    r = client.completions.create(
        model="tiny", prompt="The answer:", max_tokens=60, temperature=0.9, seed=seed, extra_body=extra
    )
    assert r.choices[0].finish_reason == "stop"
    return r.choices[0].text


@pytest.mark.parametrize("generate", [chat_text, completion_text], ids=["chat", "completions"])
def test_regex(client, generate):
    for seed in (1, 2):
        assert re.fullmatch(PATTERN, generate(client, {"structured_outputs": {"regex": PATTERN}}, seed))
    text = generate(client, {"guided_regex": PATTERN, "guided_decoding_backend": "xgrammar"})
    assert re.fullmatch(PATTERN, text)


@pytest.mark.parametrize("generate", [chat_text, completion_text], ids=["chat", "completions"])
def test_choice(client, generate):
    seen = {generate(client, {"structured_outputs": {"choice": CHOICES}}, seed) for seed in (1, 2, 3)}
    assert seen <= set(CHOICES)
    assert generate(client, {"guided_choice": CHOICES[:2]}) in CHOICES[:2]


@pytest.mark.parametrize("generate", [chat_text, completion_text], ids=["chat", "completions"])
def test_grammar(client, generate):
    for seed in (1, 2, 3):
        assert re.fullmatch(GRAMMAR_AS_REGEX, generate(client, {"structured_outputs": {"grammar": GRAMMAR}}, seed))
    assert re.fullmatch(GRAMMAR_AS_REGEX, generate(client, {"guided_grammar": GRAMMAR}))


@pytest.mark.parametrize("generate", [chat_text, completion_text], ids=["chat", "completions"])
def test_json_schema(client, generate):
    for extra in ({"structured_outputs": {"json": SCHEMA}}, {"guided_json": json.dumps(SCHEMA)}):
        jsonschema.validate(json.loads(generate(client, extra)), SCHEMA)


def test_json_object_starts_an_object(client):
    """A random model's object may not end within the tokens; it is an object from the first byte."""
    r = client.completions.create(
        model="tiny", prompt="x", max_tokens=8, extra_body={"structured_outputs": {"json_object": True}}
    )
    assert r.choices[0].text.startswith("{")


def test_streamed_completion_and_chat_follow_the_regex(client):
    stream = client.completions.create(
        model="tiny",
        prompt="The answer:",
        max_tokens=40,
        temperature=0.9,
        seed=4,
        stream=True,
        extra_body={"structured_outputs": {"regex": PATTERN}},
    )
    chunks = list(stream)
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert re.fullmatch(PATTERN, "".join(c.choices[0].text for c in chunks if c.choices))
    stream = client.chat.completions.create(
        model="tiny",
        messages=MESSAGES,
        max_tokens=40,
        temperature=0.9,
        seed=4,
        stream=True,
        extra_body={"guided_choice": CHOICES},
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text in CHOICES


def post(server, route: str, body: dict) -> httpx.Response:
    main = {"messages": MESSAGES} if "chat" in route else {"prompt": "x"}
    return httpx.post(server.url + route, json={"model": "tiny", "max_tokens": 4, **main, **body}, timeout=60)


def error(r: httpx.Response) -> str:
    assert r.status_code == 400, r.text
    body = r.json()
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["type"] == "invalid_request_error" and body["error"]["code"] == 400
    return body["error"]["message"]


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions"])
def test_an_invalid_regex_or_grammar_is_a_400_saying_where(server, route):
    message = error(post(server, route, {"structured_outputs": {"regex": "(ab"}}))
    assert "invalid regex" in message and "position 4" in message and "parenthesis" in message
    message = error(post(server, route, {"guided_grammar": 'root ::= "a" | '}))
    assert "invalid grammar" in message and "line 1, column 16" in message
    message = error(post(server, route, {"structured_outputs": {"grammar": "root ::= missing"}}))
    assert "line 1, column 10" in message and "missing" in message


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions"])
def test_more_than_one_constraint_is_a_400_naming_the_fields(server, route):
    message = error(post(server, route, {"structured_outputs": {"regex": "a", "choice": ["a"]}}))
    assert "regex and choice" in message
    message = error(post(server, route, {"structured_outputs": {"regex": "a"}, "guided_choice": ["a"]}))
    assert "structured_outputs and guided_choice" in message
    assert "guided_json and guided_regex" in error(post(server, route, {"guided_regex": "a", "guided_json": {}}))
    assert "needs one of" in error(post(server, route, {"structured_outputs": {}}))
    assert "guided_decoding_backend" in error(post(server, route, {"guided_regex": "a", "guided_decoding_backend": 1}))


def test_chat_constraints_conflict_with_response_format_and_forced_tools(server):
    message = error(
        post(server, "/v1/chat/completions", {"response_format": {"type": "json_object"}, "guided_regex": "a"})
    )
    assert "response_format and guided_regex" in message
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    forced = {"tools": [tool], "tool_choice": {"type": "function", "function": {"name": "f"}}}
    message = error(post(server, "/v1/chat/completions", {**forced, "structured_outputs": {"choice": ["a"]}}))
    assert "tool_choice and structured_outputs" in message
    message = error(
        post(server, "/v1/chat/completions", {"tools": [tool], "tool_choice": "required", "guided_regex": "a"})
    )
    assert "tool_choice and guided_regex" in message
