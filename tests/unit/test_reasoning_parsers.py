"""Reasoning parsers: the thinking and the answer of a text, whole and streamed in pieces cut at
every place (markers split over pieces, or sharing a piece with answer text)."""

import itertools

import pytest

from lmiserve.generation import reasoning

CASES = [
    ("deepseek_r1", "Let me think.\n</think>\n\nThe answer is 4.", ("Let me think.\n", "\n\nThe answer is 4.")),
    ("deepseek_r1", "<think>\nhmm</think>ok", ("\nhmm", "ok")),
    ("deepseek_r1", "still thinking <thi", ("still thinking <thi", "")),
    ("deepseek_r1", "a < b </think", ("a < b </think", "")),
    ("deepseek_r1", "x</think>y</think>z", ("x", "y</think>z")),
    ("qwen3", "<think>\nplan\n</think>\n\nHello", ("\nplan\n", "\n\nHello")),
    ("qwen3", "plan<tool_call>\n{}\n</tool_call>", ("plan", "<tool_call>\n{}\n</tool_call>")),
    ("qwen3", "", ("", "")),
    ("granite", "Here is my thought process: a b Here is my response: c", (" a b ", " c")),
    ("granite", "plain answer", (None, "plain answer")),
    ("granite", "Here's my thought process: never answers", (" never answers", "")),
    (
        "gpt_oss",
        "<|channel|>analysis<|message|>think<|end|><|start|>assistant<|channel|>final<|message|>ans",
        ("think", "ans"),
    ),
    ("gpt_oss", "<|channel|>final<|message|>only answer<|return|>", (None, "only answer")),
]


def streamed(name, pieces):
    stream = reasoning.ReasoningParser(name).stream()
    thinking, answer = [], []
    for piece in pieces:
        r, a = stream.feed(piece)
        thinking.append(r)
        answer.append(a)
    r, a = stream.finish()
    return "".join(thinking) + r, "".join(answer) + a, stream.entered


@pytest.mark.parametrize(("name", "text", "expected"), CASES)
def test_whole_text(name, text, expected):
    assert reasoning.ReasoningParser(name).split(text) == expected


@pytest.mark.parametrize(("name", "text", "expected"), CASES)
def test_every_two_cuts_give_the_same_split(name, text, expected):
    want_thinking, want_answer = expected
    for i, j in itertools.combinations_with_replacement(range(len(text) + 1), 2):
        thinking, answer, entered = streamed(name, [text[:i], text[i:j], text[j:]])
        assert (thinking if entered else None, answer) == (want_thinking, want_answer), (i, j)


def test_one_character_at_a_time_never_leaks_a_marker():
    stream = reasoning.ReasoningParser("deepseek_r1").stream()
    out = [stream.feed(c) for c in "ab</think>cd"]
    assert all("<" not in r + a for r, a in out)
    assert "".join(r for r, _ in out) == "ab" and "".join(a for _, a in out) == "cd"


def test_request_turning_thinking_off_has_no_parser():
    assert reasoning.for_request("qwen3", {"enable_thinking": False}) is None
    assert reasoning.for_request("deepseek_r1", {"thinking": False}) is None
    assert reasoning.for_request(None, {}) is None
    assert reasoning.for_request("qwen3", {"enable_thinking": True}).name == "qwen3"


def test_unknown_parser_is_refused():
    with pytest.raises(ValueError, match="unknown reasoning parser"):
        reasoning.ReasoningParser("nope")


@pytest.mark.parametrize(
    ("template", "vocab", "expected"),
    [
        ("{% if enable_thinking %}<think>{% endif %}", {"<think>": 1, "</think>": 2}, "qwen3"),
        ("<｜Assistant｜><think>\n", {"<think>": 1, "</think>": 2}, "deepseek_r1"),
        ("Here is my thought process:", {}, "granite"),
        ("", {"<|channel|>": 1, "<|message|>": 2}, "gpt_oss"),
        ("{{ messages }}", {"hello": 1}, None),
    ],
)
def test_auto_detection(template, vocab, expected):
    assert reasoning.detect(template, vocab) == expected
