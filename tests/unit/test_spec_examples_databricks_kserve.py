"""The Databricks and KServe V2 documents' examples and rules, replayed through our formatters and
compared byte for byte with golden fixtures (``LMISERVE_UPDATE_GOLDEN=1`` rewrites them)."""

from __future__ import annotations

import orjson
import pytest

from lmiserve.errors import ValidationFailed

from .test_protocol_golden import golden

# --- Databricks foundation-model REST API --------------------------------------------------------

FUNCTION = {"name": "get_weather", "description": "Weather in a city", "parameters": {"type": "object"}}
USER = {"role": "user", "content": "hi"}


@pytest.mark.parametrize(
    "name,fields",
    [
        (
            "too_many_tools",
            {"tools": [{"type": "function", "function": {**FUNCTION, "name": f"f{i}"}} for i in range(33)]},
        ),
        ("no_description", {"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}),
        ("json_schema_without_name", {"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}}),
        ("json_schema_without_schema", {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}),
        ("system_not_first", {"messages": [USER, {"role": "system", "content": "be brief"}]}),
        ("two_systems", {"messages": [{"role": "system", "content": "a"}, {"role": "system", "content": "b"}, USER]}),
        ("tool_call_id_on_user", {"messages": [{**USER, "tool_call_id": "call_1"}]}),
    ],
)
def test_databricks_chat_validation_in_databricks_shape(name, fields):
    from lmiserve.formatters import databricks, errors

    body = {"messages": [USER], **fields}
    with pytest.raises(ValidationFailed) as err:
        databricks.parse_chat(body)
    status, answer = errors.databricks(err.value)
    assert status == 400 and answer["error_code"] == "INVALID_PARAMETER_VALUE"
    golden(f"databricks/invalid_{name}.json", orjson.dumps(answer))


def test_databricks_chat_accepts_what_its_reference_allows():
    from lmiserve.formatters import databricks

    tools = [{"type": "function", "function": {**FUNCTION, "name": f"f{i}"}} for i in range(32)]
    messages = [
        {"role": "system", "content": "be brief"},
        USER,
        {
            "role": "assistant",
            "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f1", "arguments": "{}"}}],
        },
        {"role": "tool", "content": "sunny", "tool_call_id": "call_1"},
    ]
    rf = {"type": "json_schema", "json_schema": {"name": "answer", "schema": {"type": "object"}}}
    assert len(databricks.parse_chat({"messages": messages, "tools": tools}).tools) == 32
    assert databricks.parse_chat({"messages": [USER], "response_format": rf}).response_format.type == "json_schema"


def test_databricks_truncate_answers_what_was_generated_when_time_runs_out():
    from lmiserve.formatters import databricks, openai_completions
    from lmiserve.serving.respond import truncate
    from lmiserve.serving.respond import truncated_stream as _truncated_stream

    from .test_protocol_golden import output

    def responder(stream: bool):
        req = databricks.parse_completion(
            {"prompt": "What is Deep Learning?", "error_behavior": "truncate", "stream": stream}
        )
        r = openai_completions.CompletionResponder(req, "tiny", databricks.COMPLETIONS)
        r.id, r.created, r.truncate_on_timeout = "id-1", 1700000000, True
        return r

    out = output(finish=None)  # four tokens generated, then the deadline
    r = responder(False)
    r.start([out])
    truncate([out])
    body = r.body([out])
    golden("databricks/completion_truncated.json", body)
    assert orjson.loads(body)["choices"][0] | {"text": None} == {
        "index": 0,
        "text": None,
        "logprobs": None,
        "finish_reason": "length",
        "stop_reason": None,
    }

    import asyncio

    async def collect(r, outs):
        return b"".join([chunk async for chunk in _truncated_stream(r, outs)])

    out = output(finish=None)
    r = responder(True)
    r.start([out])
    data = asyncio.run(collect(r, [out]))
    golden("databricks/completion_stream_truncated.sse", data)
    assert b'"finish_reason":"length"' in data and data.endswith(b"data: [DONE]\n\n")


def test_databricks_completion_choices_carry_their_prompts_index():
    """CompletionChoice.index: "the index of the prompt in the request", n choices each."""
    from lmiserve.formatters import databricks, openai_completions
    from lmiserve.generation.request import RequestOutput, SequenceOutput

    req = databricks.parse_completion({"prompt": ["a", "b"], "n": 2, "temperature": 0})  # n > 1 greedy: allowed
    r = openai_completions.CompletionResponder(req, "tiny", databricks.COMPLETIONS)
    outs = [RequestOutput(f"r{p}", p, [1], [SequenceOutput(i, f"{p}{i}", [], [], "length") for i in range(2)])
            for p in "ab"]  # fmt: skip
    choices = orjson.loads(r.body(outs))["choices"]
    assert [(c["index"], c["text"]) for c in choices] == [(0, "a0"), (0, "a1"), (1, "b0"), (1, "b1")]
    assert [g.params.n for g in databricks.completion_requests(req, 64)] == [2, 2]


def test_databricks_chat_n_with_temperature_zero_returns_n_choices():
    from lmiserve.formatters import databricks, openai_chat

    req = databricks.parse_chat({"messages": [USER], "n": 3, "temperature": 0})
    params = openai_chat.generation_request(req, "prompt", 64).params
    assert (params.n, params.do_sample) == (3, False)


def test_databricks_truncate_keeps_the_end_of_an_over_long_prompt():
    from lmiserve.formatters import databricks

    req = databricks.parse_completion({"prompt": "x", "error_behavior": "truncate", "max_tokens": 8})
    [gen] = databricks.completion_requests(req, 64)
    assert (gen.truncate, gen.fit_context) == (63, False)
    [gen] = databricks.completion_requests(databricks.parse_completion({"prompt": "x", "max_tokens": 8}), 64)
    assert (gen.truncate, gen.fit_context) == (None, True)


# --- KServe open inference protocol V2 -----------------------------------------------------------

V2_REQUEST = {
    "id": "42",
    "inputs": [
        {"name": "input0", "shape": [2, 2], "datatype": "UINT32", "data": [1, 2, 3, 4]},
        {"name": "input1", "shape": [3], "datatype": "BOOL", "data": [True]},
    ],
    "outputs": [{"name": "output0"}],
}
V2_ANSWER = {
    "outputs": [{"name": "output0", "shape": [3, 2], "datatype": "FP32", "data": [1.0, 1.1, 2.0, 2.1, 3.0, 3.1]}]
}


def test_kserve_handler_answer_is_the_documents_response(monkeypatch):
    from lmiserve.formatters import kserve, kserve_handler

    body = orjson.dumps(V2_REQUEST)
    data = kserve_handler.handler_response("mymodel", kserve_handler.request_id(body), orjson.dumps(V2_ANSWER))
    golden("kserve/handler_infer.json", data)
    assert orjson.loads(data)["id"] == "42" and orjson.loads(data)["outputs"] == V2_ANSWER["outputs"]
    # no id in the request: a new one, always present
    monkeypatch.setattr(kserve, "new_request_id", lambda: "generated-id")
    monkeypatch.setattr(kserve_handler, "new_request_id", lambda: "generated-id")
    bare = orjson.dumps({k: v for k, v in V2_REQUEST.items() if k != "id"})
    data = kserve_handler.handler_response(
        "mymodel", kserve_handler.request_id(bare), orjson.dumps(V2_ANSWER["outputs"])
    )
    assert orjson.loads(data)["id"] == "generated-id"
    from lmiserve.errors import HandlerFailure

    for bad in (b"not json", b'{"generated_text": "x"}', b'[{"name": "o"}]'):
        with pytest.raises(HandlerFailure):
            kserve_handler.handler_response("mymodel", "", bad)


def test_kserve_response_id_is_always_present(monkeypatch):
    from lmiserve.formatters import kserve, kserve_infer

    monkeypatch.setattr(kserve_infer, "new_request_id", lambda: "generated-id")
    data = {
        "inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": ["What is Deep Learning?"]}],
        "parameters": {"max_tokens": 4},
    }
    plan = kserve_infer.plan(kserve.parse_infer(data))
    body, header = kserve_infer.rest_body(plan.response("tiny", ["Deep Learning is a"]))
    golden("kserve/infer_without_id.json", body)
    assert orjson.loads(body)["id"] == "generated-id"
