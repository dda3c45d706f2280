"""OpenAI-compatible routes with the official openai client, on a tiny random Llama."""

import json

import httpx
import jsonschema
import openai
import pytest

from .engine_server import Reference

PROMPT = "What is Deep Learning?"
SCHEMA = {
    "type": "object",
    "properties": {"color": {"enum": ["red", "green", "blue"]}, "size": {"enum": [1, 2, 3]}, "ok": {"type": "boolean"}},
    "required": ["color", "size", "ok"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"enum": ["Paris", "Rome"]}, "unit": {"enum": ["C", "F"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"enum": ["UTC", "CET"]}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}


@pytest.fixture(scope="module")
def reference(tiny_llama_dir):
    return Reference(tiny_llama_dir)


@pytest.fixture(scope="module")
def server(engine_server):
    return engine_server


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", timeout=60)


def test_models(client):
    assert [m.id for m in client.models.list().data] == ["tiny"]


def test_completion_greedy_matches_generate(client, reference):
    r = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=12, temperature=0)
    assert r.object == "text_completion" and r.model == "tiny"
    assert r.choices[0].text == reference.text(PROMPT, 12)
    assert r.choices[0].finish_reason in ("length", "stop")
    prompt_tokens = len(reference.tokenizer(PROMPT)["input_ids"])
    assert r.usage.prompt_tokens == prompt_tokens
    assert r.usage.total_tokens == prompt_tokens + r.usage.completion_tokens
    extra = r.usage.model_extra
    assert len(extra["batch_size"]) == len(extra["queue_wait_time"]) == r.usage.completion_tokens


def test_completion_list_prompt_n_and_logprobs(client):
    r = client.completions.create(
        model="tiny", prompt=[PROMPT, "Hi"], max_tokens=5, n=2, temperature=0.8, seed=3, logprobs=2
    )
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.text_offset) == len(lp.top_logprobs)
    assert "".join(lp.tokens) == r.choices[0].text or len(lp.tokens) == 5
    assert lp.text_offset[0] == 0 and all(len(d) >= 1 for d in lp.top_logprobs)


def test_completion_echo_with_logprobs(client):
    r = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=3, temperature=0, echo=True, logprobs=1)
    choice = r.choices[0]
    assert choice.text.startswith(PROMPT)
    assert choice.logprobs.token_logprobs[0] is None  # the first prompt token has no log-probability


def test_completion_stream(client, reference):
    chunks = list(
        client.completions.create(
            model="tiny",
            prompt=PROMPT,
            max_tokens=10,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == reference.text(PROMPT, 10)
    assert chunks[-1].usage.completion_tokens == len(reference.ids(PROMPT, 10))
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("length", "stop")


def test_completion_stop_string(client, reference):
    full = reference.text(PROMPT, 20)
    stop = full[3:6]
    r = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=20, temperature=0, stop=[stop])
    assert r.choices[0].text == full[: full.index(stop)]
    assert r.choices[0].finish_reason == "stop" and r.choices[0].model_extra["stop_reason"] == stop


def test_chat_greedy_matches_templated_generate(client, reference):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": PROMPT}]
    prompt = reference.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = reference.tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
    expected = reference.tokenizer.decode(
        reference.model.generate(ids, max_new_tokens=8, do_sample=False)[0, ids.shape[1] :], skip_special_tokens=True
    )
    r = client.chat.completions.create(model="tiny", messages=messages, max_tokens=8, temperature=0)
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content == expected


def test_chat_stream_and_logprobs(client):
    stream = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=6,
        temperature=0,
        stream=True,
        logprobs=True,
        top_logprobs=2,
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    assert all(c.usage is None for c in chunks[:-1])
    entries = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert chunks[-1].usage.completion_tokens == len(entries) and chunks[-1].usage.prompt_tokens > 0
    assert entries and all(len(e.top_logprobs) == 2 and e.logprob <= 0 for e in entries)


def test_response_format_json_schema_validates(client):
    r = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Describe a thing"}],
        max_tokens=60,
        temperature=0.7,
        seed=1,
        response_format={"type": "json_schema", "json_schema": {"name": "thing", "schema": SCHEMA}},
    )
    jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMA)
    assert r.choices[0].finish_reason == "stop"


def test_named_tool_choice_yields_a_valid_call(client):
    r = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[WEATHER, TIME],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=40,
        temperature=0,
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather" and call.id.startswith("call_")
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])


def test_required_tool_choice_streamed(client):
    chunks = list(
        client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "Time?"}],
            tools=[WEATHER, TIME],
            tool_choice="required",
            parallel_tool_calls=False,
            max_tokens=60,
            temperature=0,
            stream=True,
        )
    )
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert calls and chunks[-1].choices[0].finish_reason == "tool_calls"
    assert all(tc.function.name in ("get_weather", "get_time") for tc in calls)
    for tc in calls:
        json.loads(tc.function.arguments)


def test_openai_errors(server, client):
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt="x", max_tokens=2)
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="tiny", prompt="x", max_tokens=2, temperature=-1)
    assert "temperature" in str(err.value)
    # MindIE's /v1/completions takes any temperature >= 0 (chat keeps OpenAI's [0, 2])
    assert client.completions.create(model="tiny", prompt="x", max_tokens=2, temperature=5).choices
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], temperature=5)
    r = httpx.post(server.url + "/v1/chat/completions", json={"model": "tiny", "messages": [], "max_tokens": 2})
    assert r.status_code == 400 and set(r.json()["error"]) == {"message", "type", "param", "code"}
    r = httpx.post(server.url + "/v1/completions", json={"model": "tiny", "prompt": "word " * 400})
    assert r.status_code == 400 and "max_model_len" in r.json()["error"]["message"]
    r = httpx.post(
        server.url + "/v1/chat/completions",
        json={
            "model": "tiny",
            "messages": [{"role": "user", "content": "x"}],
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "object", "properties": {"a": {"$ref": "#/nope"}}}},
            },
        },
    )
    assert r.status_code == 400, r.text


def test_completions_without_max_tokens_run_to_max_iter_times_within_the_context(server, reference):
    """MindIE: max_tokens left out is maxIterTimes (512 by default), lowered to what fits in the
    context (256 tokens here); a max_tokens beyond the context is lowered the same way."""
    prompt = len(reference.tokenizer(PROMPT)["input_ids"])
    for extra in ({}, {"max_tokens": 2147483647}):
        body = {"model": "tiny", "prompt": PROMPT, "ignore_eos": True, **extra}
        r = httpx.post(server.url + "/v1/completions", json=body, timeout=300)
        assert r.status_code == 200, r.text
        answer = r.json()
        assert answer["usage"]["completion_tokens"] == 256 - prompt
        assert answer["choices"][0]["finish_reason"] == "length"


def test_n_streams_as_one_event_holding_every_choice(server):
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 3, "n": 2, "temperature": 1, "seed": 3, "stream": True}
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
    events = [e for e in r.text.split("\n\n") if e.strip()]
    assert events[-1] == "data: [DONE]" and len(events) == 2
    event = json.loads(events[0][len("data: ") :])
    assert sorted(c["index"] for c in event["choices"]) == [0, 1]
    assert all(c["finish_reason"] for c in event["choices"]) and event["usage"]["completion_tokens"] <= 6


def test_beam_search_completions(client, reference):
    ids = reference.tokenizer(PROMPT, return_tensors="pt")["input_ids"]
    out = reference.model.generate(ids, max_new_tokens=8, num_beams=3, num_return_sequences=2, do_sample=False)
    expected = [reference.tokenizer.decode(row[ids.shape[1] :], skip_special_tokens=True) for row in out]
    r = client.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=8, n=2, best_of=3, temperature=0, extra_body={"use_beam_search": True}
    )
    assert [c.text for c in r.choices] == expected
    stream = list(
        client.completions.create(
            model="tiny",
            prompt=PROMPT,
            max_tokens=8,
            n=2,
            best_of=3,
            temperature=0,
            stream=True,
            extra_body={"use_beam_search": True},
        )
    )
    streamed = {}
    for chunk in stream:
        for c in chunk.choices:
            streamed[c.index] = streamed.get(c.index, "") + c.text
    assert [streamed[0], streamed[1]] == expected
