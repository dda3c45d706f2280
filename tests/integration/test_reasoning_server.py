"""Reasoning models through the server: tiny Qwen3- and DeepSeek-R1-style models whose output is a
written script (thinking, answer, tool call), read with the real ``openai`` client."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.integration.engine_server import start
from tests.tiny_reasoning import build_reasoning_model

THINKING = ["Let me think.", " Two and two."]
ANSWER = ["The answer is four."]
CALL = '\n{"name": "add", "arguments": {"a": 2, "b": 2}}\n'
QWEN3_SCRIPT = [*THINKING, "</think>", "\n\n", *ANSWER, "<tool_call>", CALL, "</tool_call>"]
SPLIT_SCRIPT = ["Let me think.", " Two and two.</thi", "nk>\n\nThe answer", " is four."]
"""DeepSeek-R1 style, with the closing marker split over two tokens that also carry text."""
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
        },
    }
]
QUESTION = [{"role": "user", "content": "What is 2+2?"}]


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen3-reasoning")
    model = build_reasoning_model(root / "model", "qwen3", QWEN3_SCRIPT)
    with start(root / "serve", model, "option.reasoning_parser=auto\noption.strip_reasoning=true\n") as server:
        yield server.wait_ready()


@pytest.fixture(scope="module")
def deepseek(tmp_path_factory):
    root = tmp_path_factory.mktemp("r1-reasoning")
    model = build_reasoning_model(root / "model", "deepseek_r1", SPLIT_SCRIPT)
    with start(root / "serve", model, "option.enable_reasoning=true\noption.reasoning_parser=deepseek_r1\n") as s:
        yield s.wait_ready()


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)


def streamed(server, **kwargs) -> tuple[str, str, list, str, dict]:
    """The joined reasoning and content deltas, the tool-call deltas, the finish reason and usage."""
    thinking, content, calls, reason, usage = [], [], [], None, None
    for chunk in client(server).chat.completions.create(
        model="tiny", messages=QUESTION, temperature=0, stream=True, stream_options={"include_usage": True}, **kwargs
    ):
        if chunk.usage is not None:
            usage = chunk.usage.model_dump()
        for choice in chunk.choices:
            extra = choice.delta.model_extra or {}
            assert extra.get("reasoning_content") == extra.get("reasoning")
            thinking.append(extra.get("reasoning_content") or "")
            content.append(choice.delta.content or "")
            calls.extend(choice.delta.tool_calls or [])
            reason = choice.finish_reason or reason
    return "".join(thinking), "".join(content), calls, reason, usage


def test_qwen3_thinking_answer_and_tool_call(qwen3):
    resp = client(qwen3).chat.completions.create(
        model="tiny", messages=QUESTION, temperature=0, tools=TOOLS, max_tokens=20
    )
    message = resp.choices[0].message
    assert message.model_extra["reasoning_content"] == "".join(THINKING)
    assert message.model_extra["reasoning"] == "".join(THINKING)
    assert message.content == "The answer is four."
    assert [(c.function.name, c.function.arguments) for c in message.tool_calls] == [("add", '{"a": 2, "b": 2}')]
    assert resp.choices[0].finish_reason == "tool_calls"
    assert resp.usage.completion_tokens_details.reasoning_tokens == 3  # the two thoughts and </think>


def test_qwen3_streamed_gives_the_same_split(qwen3):
    thinking, content, calls, reason, usage = streamed(qwen3, tools=TOOLS, max_tokens=20)
    assert thinking == "".join(THINKING)
    assert "</think>" not in content and content == "The answer is four."
    assert [(c.function.name, c.function.arguments) for c in calls] == [("add", '{"a": 2, "b": 2}')]
    assert reason == "tool_calls"
    assert usage["completion_tokens_details"]["reasoning_tokens"] == 3


def test_thinking_off_per_request_has_no_reasoning_field(qwen3):
    resp = client(qwen3).chat.completions.create(
        model="tiny",
        messages=QUESTION,
        temperature=0,
        max_tokens=20,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    message = resp.choices[0].message
    assert "reasoning_content" not in (message.model_extra or {})
    assert message.content.startswith("The answer is four.<tool_call>")
    thinking, content, _, _, _ = streamed(
        qwen3, max_tokens=20, extra_body={"chat_template_kwargs": {"enable_thinking": False}}
    )
    assert thinking == "" and content == message.content


def test_stopping_while_thinking_gives_the_thinking_and_empty_content(qwen3):
    resp = client(qwen3).chat.completions.create(model="tiny", messages=QUESTION, temperature=0, max_tokens=2)
    message = resp.choices[0].message
    assert (message.model_extra["reasoning_content"], message.content) == ("".join(THINKING), "")
    assert resp.choices[0].finish_reason == "length"
    assert streamed(qwen3, max_tokens=2)[:2] == ("".join(THINKING), "")


def test_split_marker_whole_and_streamed(deepseek):
    resp = client(deepseek).chat.completions.create(model="tiny", messages=QUESTION, temperature=0, max_tokens=20)
    message = resp.choices[0].message
    assert message.model_extra["reasoning_content"] == "Let me think. Two and two."
    assert message.content == "\n\nThe answer is four."
    assert resp.usage.completion_tokens_details.reasoning_tokens == 3  # "nk>..." closes the thinking
    thinking, content, _, reason, _ = streamed(deepseek, max_tokens=20)
    assert (thinking, content, reason) == ("Let me think. Two and two.", "\n\nThe answer is four.", "stop")


def test_other_protocols_keep_the_raw_text(deepseek):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(_model_dir(deepseek))
    prompt = tok.apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=False)
    body = {"inputs": prompt, "parameters": {"max_new_tokens": 20}}
    r = httpx.post(f"{deepseek.url}/invocations", json=body, timeout=60)
    assert r.status_code == 200, r.text
    text = r.json()["generated_text"]
    assert "Let me think." in text and "</thi" in text and "The answer" in text  # thinking and markers kept


def _model_dir(server):
    for line in (server.model_dir / "serving.properties").read_text().splitlines():
        if line.startswith("option.model_id="):
            return line.split("=", 1)[1]
    raise AssertionError("no model_id")


RESPONSE_TOOLS = [{"type": "function", "name": "add", "parameters": TOOLS[0]["function"]["parameters"]}]


def test_responses_api_gives_a_reasoning_item_the_answer_and_the_call(qwen3):
    r = client(qwen3).responses.create(model="tiny", input="What is 2+2?", tools=RESPONSE_TOOLS, temperature=0)
    kinds = [item.type for item in r.output]
    assert kinds == ["reasoning", "message", "function_call"]
    assert r.output[0].content[0].text == "".join(THINKING)
    assert r.output_text == "The answer is four."
    assert (r.output[2].name, r.output[2].arguments) == ("add", '{"a": 2, "b": 2}')
    assert r.usage.output_tokens_details.reasoning_tokens == 3


def test_responses_api_streams_the_reasoning_apart(qwen3):
    events = list(client(qwen3).responses.create(model="tiny", input="What is 2+2?", temperature=0, stream=True))
    thinking = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    answer = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert thinking == "".join(THINKING)
    assert "</think>" not in answer and "The answer is four." in answer
    assert events[-1].type == "response.completed"


def test_structured_output_holds_from_the_end_of_the_thinking(qwen3):
    choice = {"structured_outputs": {"choice": ["yes", "no"]}}
    resp = client(qwen3).chat.completions.create(
        model="tiny", messages=QUESTION, temperature=0, max_tokens=20, extra_body=choice
    )
    message = resp.choices[0].message
    assert message.model_extra["reasoning_content"] == "".join(THINKING)  # the thinking ran free
    assert message.content in ("yes", "no")
    off = {**choice, "chat_template_kwargs": {"enable_thinking": False}}
    resp = client(qwen3).chat.completions.create(
        model="tiny", messages=QUESTION, temperature=0, max_tokens=20, extra_body=off
    )
    assert "reasoning_content" not in (resp.choices[0].message.model_extra or {})
    assert resp.choices[0].message.content in ("yes", "no")


def test_strip_reasoning_leaves_the_thinking_out_of_the_other_protocols(qwen3):
    from transformers import AutoTokenizer

    prompt = AutoTokenizer.from_pretrained(_model_dir(qwen3)).apply_chat_template(
        QUESTION, add_generation_prompt=True, tokenize=False
    )
    body = {"inputs": prompt, "parameters": {"max_new_tokens": 20}}
    whole = httpx.post(f"{qwen3.url}/invocations", json=body, timeout=60).json()["generated_text"]
    assert "The answer is four." in whole and "Let me think" not in whole and "</think>" not in whole
    lines = httpx.post(f"{qwen3.url}/invocations", json={**body, "stream": True}, timeout=60).text.splitlines()
    streamed = "".join(json.loads(line)["token"]["text"] for line in lines if line)
    assert streamed == whole
    tgi = httpx.post(f"{qwen3.url}/generate", json=body, timeout=60).json()["generated_text"]
    assert tgi == "\n\nThe answer is four.<tool_call>" + CALL + "</tool_call>"  # TGI joins added tokens bare
