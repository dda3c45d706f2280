"""vLLM's ``structured_outputs`` and ``guided_*`` fields parsed into one engine constraint, and the
engine's ``choice`` grammar."""

import json

import pytest

from lmiserve.errors import ValidationFailed
from lmiserve.formatters import errors, openai_chat, openai_completions
from lmiserve.wire import GuidedDecoding

MESSAGES = [{"role": "user", "content": "x"}]
SCHEMA = {"type": "object", "properties": {"a": {"type": "string"}}}
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


def chat(**body) -> GuidedDecoding | None:
    return openai_chat.parse({"messages": MESSAGES, **body}).guided()


def completion(**body) -> GuidedDecoding | None:
    (generation,) = openai_completions.generation_requests(openai_completions.parse({"prompt": "x", **body}))
    return generation.params.guided


@pytest.mark.parametrize("guided", [chat, completion], ids=["chat", "completions"])
@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"structured_outputs": {"regex": "a+"}}, GuidedDecoding("regex", "a+")),
        ({"structured_outputs": {"choice": ["a", "b"]}}, GuidedDecoding("choice", '["a", "b"]')),
        ({"structured_outputs": {"grammar": 'root ::= "a"'}}, GuidedDecoding("grammar", 'root ::= "a"')),
        ({"structured_outputs": {"json": SCHEMA}}, GuidedDecoding("json_schema", json.dumps(SCHEMA))),
        ({"structured_outputs": {"json": json.dumps(SCHEMA)}}, GuidedDecoding("json_schema", json.dumps(SCHEMA))),
        ({"structured_outputs": {"json_object": True}}, GuidedDecoding("json_object")),
        ({"structured_outputs": {"structural_tag": {"type": "x"}}}, GuidedDecoding("structural_tag", '{"type": "x"}')),
        ({"structured_outputs": {"regex": "a", "disable_any_whitespace": True}}, GuidedDecoding("regex", "a")),
        ({"guided_regex": "a+", "guided_decoding_backend": "xgrammar"}, GuidedDecoding("regex", "a+")),
        ({"guided_choice": ["a"], "guided_whitespace_pattern": " "}, GuidedDecoding("choice", '["a"]')),
        ({"guided_grammar": 'root ::= "a"'}, GuidedDecoding("grammar", 'root ::= "a"')),
        ({"guided_json": SCHEMA}, GuidedDecoding("json_schema", json.dumps(SCHEMA))),
        ({"structured_outputs": None, "guided_regex": None}, None),
        ({}, None),
    ],
)
def test_each_field_becomes_its_constraint(guided, body, expected):
    assert guided(**body) == expected


@pytest.mark.parametrize("parse", [chat, completion], ids=["chat", "completions"])
@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs: takes one constraint, not"),
        ({"structured_outputs": {}}, "structured_outputs: needs one of json, regex, choice"),
        ({"structured_outputs": {"json_object": False}}, "json_object must be true"),
        ({"structured_outputs": {"json": "{"}}, "json is not valid JSON"),
        ({"structured_outputs": {"json": "[1]"}}, "json must be a JSON schema object"),
        ({"structured_outputs": {"regex": ""}}, "regex must not be empty"),
        ({"structured_outputs": {"choice": []}}, "choice must hold at least one choice"),
        ({"structured_outputs": {"choice": [1]}}, "structured_outputs.choice.0"),
        ({"structured_outputs": "a+"}, "structured_outputs"),
        ({"guided_regex": "a", "guided_json": SCHEMA}, "guided_json and guided_regex each constrain the output"),
        ({"structured_outputs": {"regex": "a"}, "guided_choice": ["a"]}, "structured_outputs and guided_choice"),
        ({"guided_grammar": ""}, "guided_grammar must not be empty"),
        ({"guided_regex": "a", "guided_decoding_backend": 1}, "guided_decoding_backend"),
    ],
)
def test_invalid_fields_are_refused_saying_which(parse, body, says):
    with pytest.raises(ValidationFailed) as err:
        parse(**body)
    assert says in str(err.value)
    status, answer = errors.openai(err.value)
    assert status == 400 and answer["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "response_format and guided_regex"),
        (
            {"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}},
            "response_format and structured_outputs",
        ),
        (
            {"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "f"}}, "guided_choice": ["a"]},
            "tool_choice and guided_choice",
        ),
        ({"tools": [TOOL], "tool_choice": "required", "structured_outputs": {"regex": "a"}}, "tool_choice and"),
        (
            {"tools": [TOOL], "tool_choice": "required", "response_format": {"type": "json_object"}},
            "response_format and tool_choice",
        ),
    ],
)
def test_chat_takes_one_way_of_constraining(body, says):
    with pytest.raises(ValidationFailed) as err:
        chat(**body)
    assert says in str(err.value)


def test_text_response_format_and_auto_tools_leave_the_constraint_to_the_fields():
    assert chat(response_format={"type": "text"}, guided_regex="a") == GuidedDecoding("regex", "a")
    strict = {"type": "function", "function": {**TOOL["function"], "strict": True}}
    assert chat(tools=[strict], tool_choice="auto", guided_regex="a") == GuidedDecoding("regex", "a")
    assert chat(tools=[strict], tool_choice="auto").kind == "structural_tag"


def test_choice_grammar_accepts_exactly_the_choices():
    xgrammar = pytest.importorskip("xgrammar")
    from xgrammar.testing import _is_grammar_accept_string as accepts

    from lmiserve.rolling_batch.runner.guided import choice_grammar

    choices = ["yes", 'say "hi" \\ now', "tab\there\n", "", "é😀", "a\x7fb", "\x01"]
    grammar = xgrammar.Grammar.from_ebnf(choice_grammar(choices))
    assert all(accepts(grammar, c) for c in choices)
    assert not any(accepts(grammar, c) for c in ("ye", "yesyes", "say", "a", "tab"))


def test_xgrammar_errors_keep_the_position_without_the_native_prefix():
    xgrammar = pytest.importorskip("xgrammar")
    from lmiserve.rolling_batch.runner.guided import error_text

    with pytest.raises(Exception) as err:  # noqa: B017 - xgrammar raises RuntimeError
        xgrammar.Grammar.from_regex("(ab")
    assert error_text(err.value) == "Regex parsing error at position 4: The parenthesis is not closed."
