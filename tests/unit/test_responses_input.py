"""The Responses API's conversation items as chat messages."""

import pytest

from lmiserve.errors import ValidationFailed
from lmiserve.formatters.responses_input import chat_messages, input_items
from lmiserve.formatters.responses_request import parse


def test_a_string_is_one_user_message_after_the_instructions():
    assert chat_messages(input_items("Hi"), "Be brief.") == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
    ]


def test_message_items_and_their_parts():
    items = [
        {"role": "developer", "content": "Rules."},
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}],
        },
        {
            "type": "message",
            "id": "msg_1",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "c", "annotations": []}],
        },
        {
            "role": "user",
            "content": [{"type": "input_text", "text": "see"}, {"type": "input_image", "image_url": "http://x/i.png"}],
        },
    ]
    assert chat_messages(items) == [
        {"role": "developer", "content": "Rules."},
        {"role": "user", "content": "ab"},
        {"role": "assistant", "content": "c"},
        {
            "role": "user",
            "content": [{"type": "text", "text": "see"}, {"type": "image_url", "image_url": {"url": "http://x/i.png"}}],
        },
    ]


def test_calls_join_their_turn_and_results_are_tool_messages():
    items = [
        {"role": "user", "content": "Weather?"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "hm"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Looking."}]},
        {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "call_1",
            "name": "weather",
            "arguments": '{"city": "Rome"}',
        },
        {"type": "function_call", "call_id": "call_2", "name": "time", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "noon"}]},
        {"type": "function_call", "call_id": "call_3", "name": "time", "arguments": "{}"},
    ]
    weather = {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Rome"}'}}
    time = {"id": "call_2", "type": "function", "function": {"name": "time", "arguments": "{}"}}
    again = {"id": "call_3", "type": "function", "function": {"name": "time", "arguments": "{}"}}
    assert chat_messages(items) == [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Looking.", "tool_calls": [weather, time]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny", "name": "weather"},
        {"role": "tool", "tool_call_id": "call_2", "content": "noon", "name": "time"},
        {"role": "assistant", "content": None, "tool_calls": [again]},
    ]


def test_the_chat_request_renders_calls_as_templates_expect():
    req = parse({"input": [{"role": "user", "content": "x"}]})
    items = [
        {"role": "user", "content": "x"},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"a": 1}'},
        {"type": "function_call_output", "call_id": "c1", "output": "2"},
    ]
    messages = req.chat_request(chat_messages(items)).template_messages()
    assert messages[1]["tool_calls"][0]["function"]["arguments"] == {"a": 1}
    assert messages[2] == {"role": "tool", "content": "2", "tool_call_id": "c1", "name": "f"}


@pytest.mark.parametrize(
    "items, words",
    [
        ([{"type": "item_reference", "id": "x"}], "item_reference"),
        ([{"role": "tool", "content": "x"}], "role"),
        ([{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}], "input_file"),
        ([{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}], "image_url"),
        ([{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{nope"}], "not JSON"),
        ([{"type": "function_call", "name": "f", "arguments": "{}"}], "call_id"),
        ([{"type": "function_call_output", "call_id": "c", "output": 3}], "output"),
        ([{"type": "reasoning", "summary": []}], "no message"),
        (["text"], "object"),
    ],
)
def test_what_cannot_be_mapped_is_a_validation_error(items, words):
    with pytest.raises(ValidationFailed, match=words):
        chat_messages(items)
