"""The chat responder with a reasoning parser: the thinking, the answer and the tool calls of a
streamed answer equal the whole answer's, wherever the tokens cut the text."""

import itertools
import json

import pytest

from lmiserve.formatters import databricks, openai_chat
from lmiserve.formatters.openai_chat_responder import ChatResponder
from lmiserve.generation import reasoning
from lmiserve.generation.request import RequestOutput, SequenceOutput, TokenOutput

TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
TEXT = '<think>\nsum it</think>\n\nFour.<tool_call>\n{"name": "add", "arguments": {"a": 2}}\n</tool_call>'


def output(pieces: list[str], finish: str = "eos_token") -> RequestOutput:
    toks = [TokenOutput(i, p, -0.1) for i, p in enumerate(pieces)]
    seq = SequenceOutput(0, "".join(pieces), toks, list(toks), finish)
    return RequestOutput("r", "p", [1, 2], [seq])


def responder(body: dict, style=None, parser: str = "qwen3") -> ChatResponder:
    req = openai_chat.parse({"messages": [{"role": "user", "content": "hi"}], **body})
    return ChatResponder(req, "tiny", *([style] if style else []), reasoning=reasoning.ReasoningParser(parser))


def events(data: bytes) -> list[dict]:
    return [json.loads(e[6:]) for e in data.decode().split("\n\n") if e.startswith("data: {")]


def streamed(r: ChatResponder, out: RequestOutput) -> list[dict]:
    seq = out.sequences[0]
    tokens, final = list(seq.tokens), seq.finish_reason
    r.start([out])
    chunks = []
    for i, token in enumerate(tokens):
        seq.new_tokens, seq.tokens = [token], tokens[: i + 1]
        seq.text = "".join(t.text for t in seq.tokens)
        seq.finish_reason = final if i == len(tokens) - 1 else None
        chunks.append(r.chunk(0, out))
    chunks.append(r.end([out]))
    return events(b"".join(chunks))


def joined(chunks: list[dict]) -> tuple[str, str, list, str]:
    deltas = [c["choices"][0] for c in chunks if c["choices"]]
    thinking = "".join(d["delta"].get("reasoning_content", "") for d in deltas)
    content = "".join(d["delta"].get("content") or "" for d in deltas)
    calls = [c for d in deltas for c in d["delta"].get("tool_calls", [])]
    return thinking, content, calls, deltas[-1]["finish_reason"]


def test_whole_answer():
    message = json.loads(responder({"tools": TOOLS}).body([output([TEXT])]))["choices"][0]["message"]
    assert message["reasoning_content"] == message["reasoning"] == "\nsum it"
    assert message["content"] == "Four."
    assert [c["function"]["arguments"] for c in message["tool_calls"]] == ['{"a": 2}']


def test_every_split_streams_the_whole_answer():
    for i, j in itertools.combinations(range(1, len(TEXT)), 2):
        pieces = [TEXT[:i], TEXT[i:j], TEXT[j:]]
        thinking, content, calls, reason = joined(streamed(responder({"tools": TOOLS, "stream": True}), output(pieces)))
        # the whole answer's content is stripped around the call; a stream cannot take back "\n\n"
        assert (thinking, content.strip(), reason) == ("\nsum it", "Four.", "tool_calls"), pieces
        assert "<tool_call>" not in content, pieces
        assert [c["function"]["arguments"] for c in calls] == ['{"a": 2}'], pieces


@pytest.mark.parametrize("cut", range(1, len("</think>")))
def test_a_marker_cut_in_two_never_reaches_the_client(cut):
    pieces = ["abc", "</think>"[:cut], "</think>"[cut:] + "ans"]
    chunks = streamed(responder({"stream": True}, parser="deepseek_r1"), output(pieces))
    assert all("<" not in json.dumps(c["choices"][0]["delta"]) for c in chunks if c["choices"])
    assert joined(chunks)[:2] == ("abc", "ans")


def test_reasoning_tokens_are_counted():
    body = json.loads(responder({}).body([output(["<think>", "a", "b", "</think>", "c"])]))
    assert body["usage"]["completion_tokens_details"] == {"reasoning_tokens": 4}


def test_databricks_puts_the_thinking_in_a_reasoning_part():
    message = json.loads(responder({}, databricks.CHAT).body([output(["x</think>", "y"])]))["choices"][0]["message"]
    assert message["content"] == [
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "x"}]},
        {"type": "text", "text": "y"},
    ]
    chunks = streamed(responder({"stream": True}, databricks.CHAT), output(["x</think>", "y"]))
    parts = [c["choices"][0]["delta"].get("content") for c in chunks if c["choices"]]
    assert [{"type": "reasoning", "summary": [{"type": "summary_text", "text": "x"}]}] in parts and "y" in parts
