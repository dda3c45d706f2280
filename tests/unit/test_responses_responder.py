"""The Responses API's answer, whole and streamed, from engine outputs (reasoning, calls, limits)."""

import json

import pytest

from lmiserve.errors import ValidationFailed
from lmiserve.formatters.responses_request import parse
from lmiserve.formatters.responses_responder import ResponsesResponder
from lmiserve.generation import reasoning
from lmiserve.generation.request import RequestOutput, SequenceOutput, TokenOutput

TOOL = {"type": "function", "name": "f", "parameters": {"type": "object"}}


def responder(body, parser=None, kept=None):
    req = parse({"model": "m", **body})
    chat = req.chat_request([{"role": "user", "content": "hi"}])
    return ResponsesResponder(req, chat, "m", reasoning.for_request(parser), kept.append if kept is not None else None)


def run(resp, pieces, finish="eos_token", cached=0):
    """Feed ``pieces`` one token an update; the streamed bytes (when streaming) and the outputs."""
    seq = SequenceOutput(index=0)
    out = RequestOutput("r", "p", [1, 2, 3], [seq], num_cached_tokens=cached)
    resp.start([out])
    data = b""
    for i, piece in enumerate(pieces):
        token = TokenOutput(id=i, text=piece, logprob=-0.5)
        seq.tokens.append(token)
        seq.new_tokens = [token]
        seq.text += piece
        if i == len(pieces) - 1:
            seq.finish_reason = finish
        if resp.stream:
            data += resp.chunk(0, out)
    return (data + resp.end([out])) if resp.stream else resp.body([out])


def events(data):
    out = []
    for block in data.split(b"\n\n")[:-1]:
        name, payload = block.split(b"\n")
        event = json.loads(payload.removeprefix(b"data: "))
        assert name == b"event: " + event["type"].encode()
        out.append(event)
    assert [e["sequence_number"] for e in out] == list(range(len(out)))
    return out


THOUGHT = ["<think>", "Let me", " see", "</think>", "The ", "answer", "."]


def test_reasoning_item_before_the_message():
    kept = []
    body = json.loads(run(responder({"input": "hi"}, "qwen3", kept), THOUGHT, cached=2))
    reasoning_item, message = body["output"]
    assert reasoning_item["type"] == "reasoning" and reasoning_item["id"].startswith("rs_")
    assert reasoning_item["content"] == [{"type": "reasoning_text", "text": "Let me see"}]
    assert reasoning_item["summary"] == []
    assert message["content"][0]["text"] == "The answer." and message["status"] == "completed"
    assert body["status"] == "completed" and body["incomplete_details"] is None
    assert body["usage"] == {
        "input_tokens": 3,
        "input_tokens_details": {"cached_tokens": 2, "cache_write_tokens": 0},
        "output_tokens": 7,
        "output_tokens_details": {"reasoning_tokens": 4},
        "total_tokens": 10,
    }
    assert kept == [body]


def test_reasoning_streamed_then_the_answer():
    kept = []
    data = run(responder({"input": "hi", "stream": True}, "qwen3", kept), THOUGHT)
    evs = events(data)
    assert [e["type"] for e in evs] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert "".join(e["delta"] for e in evs if e["type"] == "response.reasoning_text.delta") == "Let me see"
    assert "".join(e["delta"] for e in evs if e["type"] == "response.output_text.delta") == "The answer."
    final = evs[-1]["response"]
    assert [i["type"] for i in final["output"]] == ["reasoning", "message"]
    assert final["output"][1]["id"] == evs[9]["item"]["id"] and evs[9]["output_index"] == 1
    assert final["usage"]["output_tokens_details"]["reasoning_tokens"] == 4
    assert kept == [final]


def test_auto_calls_are_held_back_and_become_function_call_items():
    pieces = ["<tool_call>", '{"name": "f", ', '"arguments": {"a": 1}}', "</tool_call>"]
    body = json.loads(run(responder({"input": "hi", "tools": [TOOL]}), pieces))
    [call] = body["output"]
    assert call["type"] == "function_call" and call["name"] == "f" and json.loads(call["arguments"]) == {"a": 1}
    assert call["call_id"].startswith("call_") and call["id"].startswith("fc_") and call["status"] == "completed"
    evs = events(run(responder({"input": "hi", "tools": [TOOL], "stream": True}), pieces))
    kinds = [e["type"] for e in evs]
    assert "response.output_text.delta" not in kinds
    assert kinds[2:] == [
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert evs[2]["item"]["arguments"] == "" and json.loads(evs[3]["delta"]) == {"a": 1}


def test_the_token_limit_makes_it_incomplete():
    body = json.loads(run(responder({"input": "hi", "max_output_tokens": 2}), ["a", "b"], finish="length"))
    assert body["status"] == "incomplete" and body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert body["output"][0]["status"] == "incomplete" and "completed_at" not in body
    evs = events(run(responder({"input": "hi", "stream": True}), ["a", "b"], finish="length"))
    assert evs[-1]["type"] == "response.incomplete" and evs[-1]["response"]["output"][0]["status"] == "incomplete"


def test_logprobs_when_included():
    body = {"input": "hi", "include": ["message.output_text.logprobs"], "top_logprobs": 0}
    part = json.loads(run(responder(body), ["a", "b"]))["output"][0]["content"][0]
    assert part["logprobs"] == [
        {"token": t, "bytes": [ord(t)], "logprob": -0.5, "top_logprobs": []} for t in ("a", "b")
    ]
    deltas = [e for e in events(run(responder({**body, "stream": True}), ["a", "b"])) if "logprobs" in e]
    assert [len(e["logprobs"]) for e in deltas] == [1, 1, 2]


def test_the_request_echo_has_what_the_sdk_needs():
    echo = parse({"input": "x", "tools": [TOOL], "tool_choice": {"type": "function", "name": "f"}}).echo()
    assert echo["tool_choice"] == {"type": "function", "name": "f"} and echo["tools"][0]["name"] == "f"
    assert echo["text"] == {"format": {"type": "text"}} and echo["temperature"] == 1.0 and echo["top_p"] == 1.0
    assert echo["store"] is True and echo["parallel_tool_calls"] is True and echo["metadata"] == {}


def test_reasoning_effort_reaches_the_chat_template():
    req = parse({"input": "x", "reasoning": {"effort": "high"}, "chat_template_kwargs": {"enable_thinking": True}})
    chat = req.chat_request([{"role": "user", "content": "x"}])
    assert chat.template_kwargs == {"enable_thinking": True, "reasoning_effort": "high"}


@pytest.mark.parametrize(
    "body, words",
    [
        ({"input": "x", "tools": [{"type": "file_search"}]}, "file_search"),
        ({"input": "x", "tool_choice": {"type": "function", "name": "g"}, "tools": [TOOL]}, "not one of the tools"),
        ({"input": "x", "tool_choice": {"type": "web_search_preview"}}, "tool_choice"),
        ({"input": "x", "top_p": 0}, "top_p"),
        ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": "x", "background": True}, "background"),
        ({"input": "x", "metadata": {str(i): "v" for i in range(17)}}, "16"),
        ({"input": "x", "text": {"format": {"type": "yaml"}}}, "text.format"),
    ],
)
def test_bad_values_are_validation_errors(body, words):
    with pytest.raises(ValidationFailed, match=words):
        parse(body)


def test_a_failure_mid_stream_is_an_error_event_then_response_failed():
    kept = []
    resp = responder({"input": "hi", "stream": True}, kept=kept)
    seq = SequenceOutput(index=0, text="a", tokens=[TokenOutput(0, "a", -1.0)])
    seq.new_tokens = list(seq.tokens)
    out = RequestOutput("r", "p", [1], [seq])
    resp.start([out])
    evs = events(resp.chunk(0, out) + resp.error_chunk("the engine stopped"))
    assert [e["type"] for e in evs[-2:]] == ["error", "response.failed"]
    assert evs[-2]["message"] == "the engine stopped" and evs[-1]["response"]["status"] == "failed"
    assert evs[-1]["response"]["error"] == {"code": "server_error", "message": "the engine stopped"}
    assert kept == []


def test_auto_text_that_is_no_call_is_sent_at_the_end():
    pieces = ["{", "not a call"]
    body = json.loads(run(responder({"input": "hi", "tools": [TOOL]}), pieces))
    assert [i["type"] for i in body["output"]] == ["message"] and body["output"][0]["content"][0][
        "text"
    ] == "{not a call"
    evs = events(run(responder({"input": "hi", "tools": [TOOL], "stream": True}), pieces))
    assert [e["delta"] for e in evs if e["type"] == "response.output_text.delta"] == ["{not a call"]
    assert evs[-1]["response"]["output"][0]["content"][0]["text"] == "{not a call"


@pytest.mark.parametrize("cut", range(1, len("<tool_call>")))
def test_a_call_after_text_is_held_back_from_its_tag(cut):
    tag = "<tool_call>"
    pieces = ["Sure.", " " + tag[:cut], tag[cut:] + '{"name": "f", "arguments": {}}</tool_call>']
    evs = events(run(responder({"input": "hi", "tools": [TOOL], "stream": True}), pieces))
    text = "".join(e["delta"] for e in evs if e["type"] == "response.output_text.delta")
    assert text == "Sure. " and "<" not in text
    calls = [
        e["item"] for e in evs if e["type"] == "response.output_item.done" and e["item"]["type"] == "function_call"
    ]
    assert [c["name"] for c in calls] == ["f"]


def test_a_held_tail_that_is_no_call_is_sent_at_the_end():
    pieces = ["a <", "b> c"]
    evs = events(run(responder({"input": "hi", "tools": [TOOL], "stream": True}), pieces))
    assert "".join(e["delta"] for e in evs if e["type"] == "response.output_text.delta") == "a <b> c"
