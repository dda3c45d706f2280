"""Databricks serving endpoints and /invocations dispatch by body shape, on a tiny random Llama."""

import json

import httpx
import pytest

from .engine_server import Reference

PROMPT = "What is Deep Learning?"
USER = [{"role": "user", "content": PROMPT}]


@pytest.fixture(scope="module")
def reference(tiny_llama_dir):
    return Reference(tiny_llama_dir)


@pytest.fixture(scope="module")
def server(engine_server):
    return engine_server


def post(server, path, body, **kw):
    return httpx.post(server.url + path, json=body, timeout=60, **kw)


def sse_events(r) -> list[dict]:
    lines = [x for x in r.text.split("\n") if x.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(x[6:]) for x in lines[:-1]]


ENDPOINT = "/serving-endpoints/tiny/invocations"


def test_chat(server, reference):
    r = post(server, ENDPOINT, {"messages": USER, "max_tokens": 8, "temperature": 0})
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "chat.completions"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": reference.chat_text(USER, 8)}
    prompt_tokens = len(reference.tokenizer(reference.chat_prompt(USER), add_special_tokens=False)["input_ids"])
    assert body["usage"]["prompt_tokens"] == prompt_tokens
    assert body["usage"]["total_tokens"] == prompt_tokens + body["usage"]["completion_tokens"]
    assert "batch_size" not in body["usage"]


def test_chat_stream_has_usage_in_every_chunk(server, reference):
    r = post(server, ENDPOINT, {"messages": USER, "max_tokens": 6, "temperature": 0, "stream": True})
    assert r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r)
    assert all(e["object"] == "chat.completion.chunk" for e in events)
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events) == reference.chat_text(USER, 6)
    assert all("usage" in e for e in events)
    assert events[-1]["usage"]["completion_tokens"] == 6 or events[-1]["choices"][0]["finish_reason"] == "stop"
    counts = [e["usage"]["completion_tokens"] for e in events]
    assert counts == sorted(counts)


def test_completion_goes_through_the_chat_template_unless_raw(server, reference):
    r = post(server, ENDPOINT, {"prompt": PROMPT, "max_tokens": 8, "temperature": 0})
    assert r.status_code == 200
    assert r.json()["object"] == "text_completion"
    assert r.json()["choices"][0]["text"] == reference.chat_text(USER, 8)
    raw = post(server, ENDPOINT, {"prompt": PROMPT, "max_tokens": 8, "temperature": 0, "use_raw_prompt": True})
    assert raw.json()["choices"][0]["text"] == reference.text(PROMPT, 8)
    assert raw.json()["usage"]["prompt_tokens"] == len(reference.tokenizer(PROMPT)["input_ids"])


def test_completion_echo_suffix_and_batch(server, reference):
    body = {
        "prompt": [PROMPT, "Hi"],
        "max_tokens": 5,
        "temperature": 0,
        "use_raw_prompt": True,
        "echo": True,
        "suffix": "<END>",
    }
    choices = post(server, ENDPOINT, body).json()["choices"]
    assert [c["index"] for c in choices] == [0, 1]
    assert choices[0]["text"] == PROMPT + reference.text(PROMPT, 5) + "<END>"
    assert choices[1]["text"] == "Hi" + reference.text("Hi", 5) + "<END>"
    # echo shows the prompt as sent, also when the chat template rendered it for the model
    templated = post(server, ENDPOINT, {"prompt": PROMPT, "max_tokens": 4, "temperature": 0, "echo": True}).json()
    assert templated["choices"][0]["text"] == PROMPT + reference.chat_text(USER, 4)


def test_completion_stream_usage_every_chunk(server, reference):
    body = {"prompt": PROMPT, "max_tokens": 6, "temperature": 0, "use_raw_prompt": True, "stream": True}
    events = sse_events(post(server, ENDPOINT, body))
    assert "".join(e["choices"][0]["text"] for e in events if e["choices"]) == reference.text(PROMPT, 6)
    assert all(e["usage"]["prompt_tokens"] == len(reference.tokenizer(PROMPT)["input_ids"]) for e in events)


def test_error_behavior(server, reference):
    prompt_tokens = len(reference.tokenizer(PROMPT)["input_ids"])
    too_many = 256 - prompt_tokens + 1  # max_model_len is 256
    body = {"prompt": PROMPT, "max_tokens": too_many, "temperature": 0, "use_raw_prompt": True, "ignore_eos": True}
    r = post(server, ENDPOINT, body)
    assert r.status_code == 400
    assert r.json()["error_code"] == "INVALID_PARAMETER_VALUE" and "context length" in r.json()["message"]
    r = post(server, ENDPOINT, {**body, "error_behavior": "truncate"})
    assert r.status_code == 200
    assert r.json()["choices"][0]["finish_reason"] == "length"
    assert r.json()["usage"]["total_tokens"] == 256
    # a prompt longer than the context: refused, or truncated to its last 255 tokens and answered
    long_prompt = " ".join(["word"] * 400)
    over = {"prompt": long_prompt, "max_tokens": 4, "temperature": 0, "use_raw_prompt": True, "ignore_eos": True}
    assert post(server, ENDPOINT, over).status_code == 400
    r = post(server, ENDPOINT, {**over, "error_behavior": "truncate"})
    assert r.status_code == 200, r.text
    assert r.json()["usage"] == {"prompt_tokens": 255, "completion_tokens": 1, "total_tokens": 256}
    assert r.json()["choices"][0]["finish_reason"] == "length"


def test_completion_choices_carry_their_prompts_index_and_n_greedy_choices(server, reference):
    body = {"prompt": [PROMPT, "Hello"], "n": 2, "max_tokens": 3, "temperature": 0, "use_raw_prompt": True}
    r = post(server, ENDPOINT, body)
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    assert [c["index"] for c in choices] == [0, 0, 1, 1]
    assert choices[0]["text"] == choices[1]["text"] == reference.text(PROMPT, 3)


def test_no_max_tokens_means_up_to_the_context(server, reference):
    body = {"prompt": PROMPT, "temperature": 0, "use_raw_prompt": True, "ignore_eos": True}
    r = post(server, ENDPOINT, body)
    assert r.json()["usage"]["total_tokens"] == 256


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"inputs": "x"}, "BAD_REQUEST"),
        ({"prompt": "x", "temperature": 5}, "INVALID_PARAMETER_VALUE"),
        ({"messages": []}, "INVALID_PARAMETER_VALUE"),
        ({"prompt": "x", "error_behavior": "ignore"}, "INVALID_PARAMETER_VALUE"),
        ({"input": "x"}, "RESOURCE_DOES_NOT_EXIST"),
    ],
)
def test_errors_in_databricks_shape(server, body, code):
    r = post(server, ENDPOINT, body)
    assert r.status_code in (400, 404)
    assert set(r.json()) == {"error_code", "message"} and r.json()["error_code"] == code


def test_openai_client_on_the_workspace_paths(server, reference):
    import openai

    client = openai.OpenAI(base_url=server.url + "/serving-endpoints", api_key="token", timeout=60)
    r = client.chat.completions.create(model="tiny", messages=USER, max_tokens=6, temperature=0)
    assert r.choices[0].message.content == reference.chat_text(USER, 6)
    chunks = list(client.chat.completions.create(model="tiny", messages=USER, max_tokens=6, temperature=0, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == reference.chat_text(USER, 6)


# --- /invocations by body shape -----------------------------------------------------------


def test_invocations_messages_answer_chat_completion(server, reference):
    r = post(server, "/invocations", {"messages": USER, "max_tokens": 8, "temperature": 0})
    assert r.status_code == 200
    assert r.json()["object"] == "chat.completion"
    assert r.json()["choices"][0]["message"]["content"] == reference.chat_text(USER, 8)


def test_invocations_messages_stream_jsonlines(server, reference):
    r = post(server, "/invocations", {"messages": USER, "max_tokens": 6, "temperature": 0, "stream": True})
    assert r.headers["content-type"].startswith("application/jsonlines")
    lines = [json.loads(x) for x in r.text.splitlines() if x]
    assert all(x["object"] == "chat.completion.chunk" for x in lines)
    assert "".join(x["choices"][0]["delta"].get("content") or "" for x in lines) == reference.chat_text(USER, 6)


def test_invocations_prompt_answers_completion(server, reference):
    r = post(server, "/predictions/tiny", {"prompt": PROMPT, "max_tokens": 6, "temperature": 0})
    assert r.json()["object"] == "text_completion"
    assert r.json()["choices"][0]["text"] == reference.text(PROMPT, 6)


def test_invocations_inputs_still_lmi(server, reference):
    r = post(server, "/invocations", {"inputs": PROMPT, "parameters": {"max_new_tokens": 6}})
    assert r.json() == {"generated_text": reference.text(PROMPT, 6)}


def test_invocations_openai_shaped_errors(server):
    r = post(server, "/invocations", {"messages": "hello"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = post(server, "/invocations", {"input": "x"})
    assert r.status_code == 404 and "error" in r.json()
