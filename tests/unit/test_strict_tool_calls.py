"""``strict: true`` on a function holds the arguments of ``tool_choice: "auto"`` calls to its
parameters (Databricks' document; OpenAI's strict functions): the text stays free until the model
writes ``<tool_call>``, and from there only a call of a listed function, a strict one's arguments
matching its schema, can be generated."""

from __future__ import annotations

import json

import pytest

from lmiserve.formatters import openai_chat
from lmiserve.rolling_batch.runner.guided import GuidedDecoder

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
           "required": ["city"], "additionalProperties": False}  # fmt: skip
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "strict": True, "parameters": WEATHER}},
    {"type": "function", "function": {"name": "note", "parameters": {"type": "object"}}},
]


def request(tools=TOOLS, **extra):
    return openai_chat.parse({"messages": [{"role": "user", "content": "Weather?"}], "tools": tools, **extra})


@pytest.fixture(scope="module")
def follows(tiny_llama_dir, tiny_tokenizer):
    """Whether a text can be generated under a request's constraint, token by token."""
    import xgrammar as xgr

    decoder = GuidedDecoder(tiny_llama_dir, len(tiny_tokenizer), (tiny_tokenizer.eos_token_id,))

    def check(spec, text: str) -> bool:
        decoder.check(spec)
        matcher = xgr.GrammarMatcher(decoder._compiled(spec.kind, spec.value))
        return all(matcher.accept_token(t) for t in tiny_tokenizer(text, add_special_tokens=False)["input_ids"])

    return check


def call(name: str, arguments: dict) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(arguments)}}}\n</tool_call>'


def test_auto_with_a_strict_function_constrains_its_arguments_and_nothing_else(follows):
    spec = request(tool_choice="auto").guided()
    assert spec is not None and spec.kind == "structural_tag"
    assert follows(spec, "It is sunny, no tool needed.")
    assert follows(spec, "Let me look. " + call("get_weather", {"city": "Paris", "days": 2}))
    assert not follows(spec, "Let me look. " + call("get_weather", {"city": "Paris", "days": "two"}))
    assert not follows(spec, "Let me look. " + call("get_weather", {"town": "Paris"}))
    assert follows(spec, call("note", {"anything": [1, 2]}))  # not strict: any object
    assert not follows(spec, call("unknown", {}))


def test_without_strict_auto_is_free_and_required_keeps_its_schema():
    loose = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
    assert request(loose, tool_choice="auto").guided() is None
    assert request(tool_choice="required").guided().kind == "json_schema"
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
    assert request(tool_choice="auto", response_format=fmt).guided().kind == "json_schema"  # the format wins


def test_the_vllm_backend_is_given_the_same_structural_tag():
    from lmiserve.rolling_batch.vllm.params import _structured
    from tests.fakes.vllm.sampling_params import StructuredOutputsParams

    spec = request(tool_choice="auto").guided()
    api = type("Api", (), {"structured": StructuredOutputsParams, "version": "fake"})()
    assert _structured(spec, api).structural_tag == spec.value
