"""The object a custom output formatter receives, the input formatter's result, and finding them."""

from __future__ import annotations

import pytest

from lmiserve.errors import BadRequest, ValidationFailed
from lmiserve.formatters import lmi_rolling
from lmiserve.formatters.request_io import TextInput, generation_output
from lmiserve.generation.request import RequestOutput, SequenceOutput, TokenOutput
from lmiserve.handlers import custom_formatters as custom_input
from lmiserve.handlers.custom_formatters import formatters_only, load_custom_formatters
from lmiserve.handlers.loader import HandlerLoadError


def _output(finished: bool) -> RequestOutput:
    tokens = [TokenOutput(5, "Hel", -0.5), TokenOutput(6, "lo", -0.25), TokenOutput(7, "!", -1.0)]
    seq = SequenceOutput(index=0, text="Hello!", tokens=tokens, new_tokens=tokens[1:], cumulative_logprob=-1.75)
    seq.finish_reason = "length" if finished else None
    return RequestOutput(request_id="r-1", prompt="Say", prompt_token_ids=[1, 2], sequences=[seq])


def test_generation_output_fields():
    view = generation_output(_output(True), TextInput(parameters={"max_new_tokens": 3}, stream=False))
    assert view.request_id == "r-1" and view.finished
    assert view.input.input_text == "Say" and view.input.input_ids == [1, 2]
    assert view.input.parameters == {"max_new_tokens": 3}
    best = view.sequences[view.best_sequence_index]
    assert best is view.best_sequence and view.text == best.text == "Hello!"
    assert [t.id for t in best.tokens] == [5, 6, 7]
    assert [t.as_dict() for t in view.new_tokens] == [
        {"id": 6, "text": "lo", "log_prob": -0.25},
        {"id": 7, "text": "!", "log_prob": -1.0},
    ]
    assert best.tokens[0].as_tgi_dict() == {"id": 5, "text": "Hel", "logprob": -0.5, "special": False}
    assert view.finish_reason == "length" and best.cumulative_log_prob == -1.75
    assert view.prompt_tokens_details is None


def test_get_next_token_walks_this_updates_tokens():
    best = generation_output(_output(True), TextInput()).best_sequence
    got = []
    while best.has_next_token():
        token, first, last = best.get_next_token()
        got.append((token.id, first, last))
    assert got == [(6, False, False), (7, False, True)]
    assert best.get_next_token() == (None, False, True)
    running = generation_output(_output(False), TextInput()).best_sequence
    assert [running.get_next_token()[2] for _ in range(2)] == [False, False]


def test_input_formatter_results():
    defaults = lmi_rolling.Defaults()
    req = custom_input.to_request(
        custom_input.normalize(TextInput(input_text="hi", parameters={"max_new_tokens": 4}, stream=True)),
        defaults,
        lambda m: "unused",
    )
    assert req.generation.prompt == "hi" and req.stream and req.generation.params.max_new_tokens == 4
    chat = custom_input.to_request(
        custom_input.normalize({"messages": [{"role": "user", "content": "x"}]}), defaults, lambda m: "<chat>"
    )
    assert chat.generation.prompt == "<chat>" and not chat.generation.add_special_tokens and not chat.stream
    assert custom_input.normalize("plain prompt").prompt == "plain prompt"
    with pytest.raises(BadRequest):
        custom_input.normalize({"parameters": {}})
    with pytest.raises(BadRequest):
        custom_input.normalize(42)
    adapted = custom_input.to_request(custom_input.normalize({"inputs": "x", "adapter": "lora-1"}), defaults, str)
    assert adapted.generation.adapter == "lora-1"
    with pytest.raises(BadRequest, match="adapter"):
        custom_input.normalize({"inputs": "x", "adapter": 7})
    with pytest.raises(ValidationFailed):
        custom_input.to_request(custom_input.normalize({"inputs": "x", "parameters": {"top_p": 5}}), defaults, str)


@pytest.mark.parametrize(
    ("source", "output_formatter", "only"),
    [
        (
            "from djl_python.output_formatter import output_formatter\n@output_formatter\ndef f(o):\n    return ''\n",
            "json",
            True,
        ),
        ("import djl_python.input_parser as p\n@p.input_formatter\ndef f(i):\n    return ''\n", "json", True),
        ("def fmt(o):\n    return ''\n", "fmt", True),
        ("def fmt(o):\n    return ''\n", "json", False),
        (
            "from djl_python.output_formatter import output_formatter\n@output_formatter\ndef f(o):\n    return ''\n"
            "def handle(inputs):\n    return None\n",
            "json",
            False,
        ),
        ("def model_fn(d):\n    return 1\n@output_formatter\ndef f(o):\n    return ''\n", "json", False),
    ],
)
def test_formatters_only_decides_engine_or_handler(tmp_path, source, output_formatter, only):
    (tmp_path / "model.py").write_text(source)
    assert formatters_only(tmp_path, "handle", output_formatter) is only


def test_loading_marked_and_named_formatters(tmp_path):
    (tmp_path / "model.py").write_text(
        "from djl_python.output_formatter import output_formatter\n"
        "from djl_python.input_parser import input_formatter\n"
        "@output_formatter\ndef out(o):\n    return 'x'\n"
        "@input_formatter\ndef inp(i):\n    return 'p'\n"
        "def other(o):\n    return 'y'\n"
    )
    found = load_custom_formatters(tmp_path, "json")
    assert found.output.__name__ == "out" and found.input.__name__ == "inp"
    assert load_custom_formatters(tmp_path, "other").output.__name__ == "other"
    (tmp_path / "fmtpkg_for_test.py").write_text("def dotted(o):\n    return 'z'\n")
    assert load_custom_formatters(tmp_path, "fmtpkg_for_test.dotted").output.__name__ == "dotted"
    with pytest.raises(HandlerLoadError, match="no such function"):
        load_custom_formatters(tmp_path, "missing")
    with pytest.raises(HandlerLoadError, match="cannot import"):
        load_custom_formatters(tmp_path, "nowhere_module.fn")


def test_two_output_formatters_are_refused(tmp_path):
    (tmp_path / "model.py").write_text(
        "from djl_python.output_formatter import output_formatter\n"
        "@output_formatter\ndef a(o):\n    return ''\n@output_formatter\ndef b(o):\n    return ''\n"
    )
    with pytest.raises(HandlerLoadError, match="more than one @output_formatter: a, b"):
        load_custom_formatters(tmp_path, "json")
