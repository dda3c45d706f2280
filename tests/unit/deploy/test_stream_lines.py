import random

import pytest

from lmiserve.deploy.stream_lines import LineAssembler, iter_lines
from tests.aws.event_stream import split_randomly

JSONLINES = (
    '{"token": {"id": 1, "text": "Grüße", "log_prob": -0.1}}\n'
    '{"token": {"id": 2, "text": " 👋 日本語", "log_prob": -0.2}}\n'
    "\n"
    '{"token": {"id": 3, "text": "é"}, "generated_text": "Grüße 👋 日本語é"}\n'
)


@pytest.mark.parametrize("seed", range(200))
def test_lines_survive_any_split_even_inside_characters(seed):
    data = JSONLINES.encode()
    parts = split_randomly(data, random.Random(seed), most=5)
    assert list(iter_lines(parts)) == JSONLINES.split("\n")[:-1]


def test_every_single_byte_boundary():
    data = JSONLINES.encode()
    for cut in range(len(data) + 1):
        assert list(iter_lines([data[:cut], data[cut:]])) == JSONLINES.split("\n")[:-1]


def test_a_line_is_given_out_as_soon_as_its_newline_arrives():
    assembler = LineAssembler()
    assert assembler.feed(b'data: {"a": "\xc3') == []
    assert assembler.pending == 14
    assert assembler.feed(b'\xa9"}') == []
    assert assembler.feed(b"\r\n\r") == ['data: {"a": "é"}']
    assert assembler.feed(b"\ndata: [DONE]\n") == ["", "data: [DONE]"]
    assert assembler.close() == []


def test_unterminated_last_line_comes_out_at_the_end():
    assert list(iter_lines([b'{"a"', b": 1}\n{", b'"b": 2}'])) == ['{"a": 1}', '{"b": 2}']
    assert list(iter_lines([])) == []
