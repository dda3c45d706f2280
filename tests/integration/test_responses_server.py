"""OpenAI's Responses API with the official openai client, on a tiny random Llama."""

import json
import time

import httpx
import jsonschema
import openai
import pytest

from .engine_server import start

PROMPT = "What is Deep Learning?"
SCHEMA = {
    "type": "object",
    "properties": {"color": {"enum": ["red", "green", "blue"]}, "size": {"enum": [1, 2, 3]}},
    "required": ["color", "size"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"enum": ["Paris", "Rome"]}, "unit": {"enum": ["C", "F"]}},
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
    "strict": True,
}
TIME = {
    "type": "function",
    "name": "get_time",
    "parameters": {
        "type": "object",
        "properties": {"zone": {"enum": ["UTC", "CET"]}},
        "required": ["zone"],
        "additionalProperties": False,
    },
}


@pytest.fixture(scope="module")
def server(engine_server):
    return engine_server


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", timeout=60)


def chat_text(client, messages, n):
    r = client.chat.completions.create(model="tiny", messages=messages, max_tokens=n, temperature=0)
    return r.choices[0].message.content, r.choices[0].finish_reason


def test_plain_text_is_the_chat_answer(client):
    r = client.responses.create(model="tiny", input=PROMPT, max_output_tokens=8, temperature=0)
    expected, reason = chat_text(client, [{"role": "user", "content": PROMPT}], 8)
    assert r.object == "response" and r.id.startswith("resp_") and r.model == "tiny"
    assert r.output_text == expected
    [message] = r.output
    assert message.type == "message" and message.role == "assistant" and message.id.startswith("msg_")
    assert message.content[0].type == "output_text" and message.content[0].text == expected
    assert r.status == ("incomplete" if reason == "length" else "completed")
    if r.status == "incomplete":
        assert r.incomplete_details.reason == "max_output_tokens" and r.usage.output_tokens == 8
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.usage.output_tokens_details.reasoning_tokens == 0
    assert r.max_output_tokens == 8 and r.temperature == 0 and r.tools == [] and r.store is True


def test_instructions_and_message_items(client):
    items = [
        {"role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Hello."}]},
        {"type": "message", "role": "user", "content": PROMPT},
    ]
    r = client.responses.create(model="tiny", input=items, instructions="Be brief.", max_output_tokens=6, temperature=0)
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": PROMPT},
    ]
    assert r.output_text == chat_text(client, messages, 6)[0]
    assert r.instructions == "Be brief."


def test_max_output_tokens_gives_an_incomplete_response(client):
    r = client.responses.create(model="tiny", input=PROMPT, max_output_tokens=1, temperature=0, store=False)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 1 and r.output[0].status == "incomplete"


def test_stream_events_join_to_the_final_text(client):
    events = list(client.responses.create(model="tiny", input=PROMPT, max_output_tokens=10, temperature=0, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        kinds[-1],
    ]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == final.output_text == next(e.text for e in events if e.type == "response.output_text.done")
    assert (
        deltas == client.responses.create(model="tiny", input=PROMPT, max_output_tokens=10, temperature=0).output_text
    )
    assert final.id == events[0].response.id and events[0].response.status == "in_progress"
    assert final.usage.output_tokens == 10 or final.status == "completed"


def test_stream_helper(client):
    with client.responses.stream(model="tiny", input=PROMPT, max_output_tokens=12, temperature=0.5, top_p=0.9) as s:
        events = list(s)
    texts = [e.delta for e in events if e.type == "response.output_text.delta"]
    snapshots = [e.snapshot for e in events if e.type == "response.output_text.delta"]
    assert snapshots[-1] == "".join(texts)
    last = events[-1]
    assert last.type in ("response.incomplete", "response.completed")
    assert last.response.output[0].content[0].text == "".join(texts)


def test_stream_helper_completes(client):
    """Constrained JSON ends by itself: the helper gets its ``response.completed``."""
    fmt = {"type": "json_schema", "name": "thing", "schema": SCHEMA, "strict": True}
    with client.responses.stream(
        model="tiny",
        input="A thing",
        text={"format": fmt},
        max_output_tokens=60,
        temperature=0.7,
        extra_body={"seed": 1},
    ) as s:
        texts = [e.delta for e in s if e.type == "response.output_text.delta"]
        final = s.get_final_response()
    assert final.status == "completed" and "".join(texts) == final.output_text
    jsonschema.validate(json.loads(final.output_text), SCHEMA)


def test_json_schema_format_validates(client):
    fmt = {"type": "json_schema", "name": "thing", "schema": SCHEMA, "strict": True}
    r = client.responses.create(
        model="tiny",
        input="Describe a thing",
        text={"format": fmt},
        max_output_tokens=60,
        temperature=0.7,
        extra_body={"seed": 1},
    )
    assert r.status == "completed"
    jsonschema.validate(json.loads(r.output_text), SCHEMA)
    assert r.text.format.type == "json_schema" and r.text.format.name == "thing"
    obj = client.responses.create(
        model="tiny", input="JSON please", text={"format": {"type": "json_object"}}, max_output_tokens=8
    )
    assert obj.output_text.lstrip().startswith("{") and obj.text.format.type == "json_object"


def test_function_call_round_trip(client):
    r = client.responses.create(
        model="tiny",
        input="Weather in Paris?",
        tools=[WEATHER, TIME],
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=60,
        temperature=0,
    )
    [call] = r.output
    assert call.type == "function_call" and call.name == "get_weather" and call.status == "completed"
    assert call.id.startswith("fc_") and call.call_id
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
    follow = client.responses.create(
        model="tiny",
        previous_response_id=r.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": '{"temperature": 21}'}],
        tools=[WEATHER, TIME],
        max_output_tokens=5,
        temperature=0,
    )
    assert follow.status in ("completed", "incomplete") and follow.previous_response_id == r.id
    assert follow.output and follow.output[-1].type in ("message", "function_call")


def test_required_tool_choice_streamed(client):
    events = list(
        client.responses.create(
            model="tiny",
            input="Time?",
            tools=[WEATHER, TIME],
            tool_choice="required",
            parallel_tool_calls=False,
            max_output_tokens=60,
            temperature=0,
            stream=True,
        )
    )
    kinds = [e.type for e in events]
    assert kinds[-1] == "response.completed"
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert len(done) == 1 and deltas == done[0].arguments
    [call] = events[-1].response.output
    assert call.type == "function_call" and json.loads(call.arguments) == json.loads(deltas)


def test_store_get_delete(client, server):
    r = client.responses.create(model="tiny", input=PROMPT, max_output_tokens=3, metadata={"k": "v"})
    got = client.responses.retrieve(r.id)
    assert got.id == r.id and got.output_text == r.output_text and got.metadata == {"k": "v"}
    client.responses.delete(r.id)
    for call in (lambda: client.responses.retrieve(r.id), lambda: client.responses.delete(r.id)):
        with pytest.raises(openai.NotFoundError) as err:
            call()
        assert err.value.body["type"] == "not_found_error" and r.id in err.value.body["message"]


def test_unstored_response_cannot_be_continued(client, server):
    r = client.responses.create(model="tiny", input=PROMPT, max_output_tokens=3, store=False)
    assert r.store is False
    reply = httpx.post(
        server.url + "/v1/responses", json={"model": "tiny", "input": "more", "previous_response_id": r.id}
    )
    assert reply.status_code == 404
    assert reply.json()["error"]["param"] == "previous_response_id" and r.id in reply.json()["error"]["message"]


@pytest.mark.parametrize(
    "body, where",
    [
        ({"input": "hi", "tools": [{"type": "web_search"}]}, "web_search"),
        ({"input": "hi", "temperature": 3}, "temperature"),
        ({"input": 42}, "input"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "item_reference"),
        ({"input": [{"role": "robot", "content": "x"}]}, "role"),
        ({"input": "hi", "tool_choice": "required"}, "tool_choice"),
        ({"input": "hi", "text": {"format": {"type": "json_schema"}}}, "json_schema"),
        ({}, "input"),
    ],
)
def test_bad_requests_are_400_in_openai_shape(server, body, where):
    reply = httpx.post(server.url + "/v1/responses", json={"model": "tiny", **body})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    assert where in error["message"]


def test_not_json_is_400(server):
    reply = httpx.post(server.url + "/v1/responses", content=b"{not json", headers={"content-type": "application/json"})
    assert reply.status_code == 400 and "error" in reply.json()


def test_bodies_validate_against_the_sdk_types(server):
    """Every field the SDK's models declare, with its type: the response and each stream event."""
    import pydantic
    from openai.types.responses import Response, ResponseStreamEvent

    body = {"model": "tiny", "input": PROMPT, "max_output_tokens": 4, "include": ["message.output_text.logprobs"]}
    reply = httpx.post(server.url + "/v1/responses", json={**body, "top_logprobs": 2})
    response = Response.model_validate(reply.json())
    [part] = response.output[0].content
    assert len(part.logprobs) == 4 and all(len(p.top_logprobs) == 2 for p in part.logprobs)
    events = pydantic.TypeAdapter(ResponseStreamEvent)
    with httpx.stream("POST", server.url + "/v1/responses", json={**body, "stream": True}) as s:
        assert s.headers["content-type"].startswith("text/event-stream")
        blocks = b"".join(s.iter_bytes()).split(b"\n\n")
    assert blocks[-1] == b""
    for block in blocks[:-1]:
        name, data = block.split(b"\n")
        parsed = events.validate_python(json.loads(data.removeprefix(b"data: ")))
        assert name == b"event: " + parsed.type.encode()


@pytest.fixture(scope="module")
def thinking_server(tiny_llama_dir, tmp_path_factory):
    """The tiny Llama read by the deepseek_r1 parser (its whole output is thinking: it never closes
    ``<think>``), behind two API processes."""
    root = tmp_path_factory.mktemp("responses-reasoning")
    env = {"SERVING_API_PROCESSES": "2"}
    with start(root / "m", tiny_llama_dir, "option.reasoning_parser=deepseek_r1\n", env=env) as s:
        s.wait_ready()
        yield s


def test_reasoning_item_and_its_stream(thinking_server, client):
    thinking = openai.OpenAI(base_url=thinking_server.url + "/v1", api_key="none", timeout=60)
    r = thinking.responses.create(model="tiny", input=PROMPT, max_output_tokens=6, temperature=0)
    expected = chat_text(client, [{"role": "user", "content": PROMPT}], 6)[0]
    reasoning_item, message = r.output
    assert reasoning_item.type == "reasoning" and reasoning_item.content[0].text == expected
    assert message.type == "message" and r.output_text == ""
    assert r.usage.output_tokens_details.reasoning_tokens == r.usage.output_tokens == 6
    events = list(
        thinking.responses.create(model="tiny", input=PROMPT, max_output_tokens=6, temperature=0, stream=True)
    )
    deltas = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert deltas == expected == next(e.text for e in events if e.type == "response.reasoning_text.done")
    assert [i.type for i in events[-1].response.output] == ["reasoning", "message"]
    again = thinking.responses.create(model="tiny", previous_response_id=r.id, input="More?", max_output_tokens=2)
    assert again.status == "incomplete" and again.previous_response_id == r.id


def test_every_api_process_sees_the_stored_responses(thinking_server):
    """A response stored through any API process is found through any other (once the second
    process serves inference itself, it still passes /v1/responses on to the first)."""
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
    deadline = time.monotonic() + 180
    while True:
        reply = httpx.post(thinking_server.url + "/v1/chat/completions", json=chat, timeout=60)
        if reply.headers["x-api-process"] == "1" and "x-api-process-forwarded" not in reply.headers:
            break
        assert time.monotonic() < deadline, "the second API process never served a request itself"
    created: dict[int, str] = {}
    for _ in range(40):
        body = {"model": "tiny", "input": "Hi", "max_output_tokens": 1}
        reply = httpx.post(thinking_server.url + "/v1/responses", json=body, timeout=60)
        assert reply.status_code == 200, reply.text
        assert reply.headers.get("x-api-process-forwarded", "0") == "0"
        created.setdefault(int(reply.headers["x-api-process"]), reply.json()["id"])
        if len(created) == 2:
            break
    assert sorted(created) == [0, 1]
    for _ in range(4):
        for response_id in created.values():
            got = httpx.get(f"{thinking_server.url}/v1/responses/{response_id}", timeout=60)
            assert got.status_code == 200 and got.json()["id"] == response_id


def test_unknown_model_is_404_in_openai_shape(server):
    reply = httpx.post(server.url + "/v1/responses", json={"model": "nope", "input": "hi"})
    assert reply.status_code == 404 and reply.json()["error"]["type"] == "not_found_error"
