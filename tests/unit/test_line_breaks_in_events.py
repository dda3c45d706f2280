"""Generated text with U+0085, U+2028 or U+2029 keeps every stream event on one line.

SSE and JSON Lines break lines at CR and LF only, but Python's ``str.splitlines`` (which httpx's
``iter_lines`` follows) also breaks at these three. Each protocol's stream is read here as such a
client reads it: every line must be a whole JSON value, and the text must come through unchanged.
"""

from __future__ import annotations

import json

import pytest

from lmiserve.formatters import bedrock, databricks, kserve_generate, lmi_rolling, lmi_rolling_output, mindie_tgi, tgi
from lmiserve.formatters.openai_common import JSONLINES_FRAMING, Style
from lmiserve.generation.request import RequestOutput, SequenceOutput, TokenOutput
from lmiserve.handlers.outputs import Output, default_stream_formatter, split_output

from .test_protocol_golden import chat, completion, replay

BREAKS = "\x85\u2028\u2029"
PIECES = ["a\u2028b", " c\x85", "\u2029d", " e"]
MESSAGES = [{"role": "user", "content": "x"}]


def output() -> RequestOutput:
    toks = [TokenOutput(100 + i, piece, -0.5) for i, piece in enumerate(PIECES)]
    seq = SequenceOutput(0, "".join(PIECES), toks, list(toks), "length", cumulative_logprob=-2.0)
    out = RequestOutput("r", "x", [1, 2, 3], [seq], seed=7)
    out.batch_sizes, out.queue_us = [1] * len(PIECES), [10] * len(PIECES)
    return out


def tgi_stream(mindie: bool):
    parsed = tgi.parse(json.dumps({"inputs": "x", "stream": True}).encode(), True, mindie=mindie)
    parsed.seed = 7
    return mindie_tgi.MindieResponder(parsed) if mindie else tgi.TgiResponder(parsed)


STREAMS = {
    "tgi": lambda: tgi_stream(False),
    "mindie": lambda: tgi_stream(True),
    "openai-completions": lambda: completion({"prompt": "x", "stream": True}),
    "openai-chat": lambda: chat({"messages": MESSAGES, "stream": True}),
    "lmi-chat-jsonlines": lambda: chat(
        {"messages": MESSAGES, "stream": True}, Style("chat.completion", framing=JSONLINES_FRAMING, mindie_usage=False)
    ),
    "databricks-chat": lambda: chat({"messages": MESSAGES, "stream": True}, databricks.CHAT),
    "kserve-generate": lambda: kserve_generate.GenerateResponder(
        "tiny", kserve_generate.parse_generate({"text_input": "x"})[1], stream=True
    ),
    "lmi": lambda: lmi_rolling_output.LmiResponder(
        lmi_rolling.parse_request(b'{"inputs": "x", "stream": true}', lmi_rolling.Defaults())
    ),
    "bedrock": lambda: bedrock.BedrockResponder(bedrock.parse_request(b'{"prompt": "x"}', True)),
}


def values_per_line(data: bytes) -> list:
    """Each non-empty line as a line reader hands it over, decoded as JSON (after an SSE ``data:``)."""
    values = []
    for line in data.decode("utf-8").splitlines():
        if not line.strip():
            continue
        if line.startswith("data:"):
            line = line[len("data:") :].strip()
            if line == "[DONE]":
                continue
        values.append(json.loads(line))
    return values


@pytest.mark.parametrize("protocol", sorted(STREAMS))
def test_each_event_stays_one_line_and_the_text_comes_through(protocol):
    data = replay(STREAMS[protocol](), output())
    for ch in BREAKS:
        assert ch.encode("utf-8") not in data, f"{ch!r} written raw"
    seen = json.dumps(values_per_line(data), ensure_ascii=False)
    for piece in PIECES:
        assert piece in seen


@pytest.mark.parametrize("protocol", ["openai-completions", "tgi"])
def test_whole_bodies_escape_them_too(protocol):
    body = (completion({"prompt": "x"}) if protocol == "openai-completions" else tgi_stream(False)).body([output()])
    assert all(ch.encode() not in body for ch in BREAKS)
    assert "".join(PIECES) in json.dumps(json.loads(body), ensure_ascii=False)


def test_a_handlers_json_lines_escape_them():
    line = default_stream_formatter({"text": "".join(PIECES)})
    assert len(line.decode().splitlines()) == 1 and json.loads(line) == {"text": "".join(PIECES)}
    (whole,) = split_output(Output().add_as_json({"generated_text": "a\u2028b"}), 1)
    assert whole.body == b'{"generated_text": "a\\u2028b"}'
    (streamed,) = split_output(Output().add_stream_content(iter([{"t": "\x85"}])), 1)
    assert b"".join(streamed.stream) == b'{"t": "\\u0085"}\n'
