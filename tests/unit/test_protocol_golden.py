"""Every protocol's bytes on the wire against golden fixtures: a success, a stream, a stream
that fails part-way, and the error body of each error class.

``LMISERVE_UPDATE_GOLDEN=1`` rewrites the fixtures (review the diff before committing).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import orjson
import pytest

from lmiserve import errors as E
from lmiserve.formatters import databricks, embeddings, errors, openai_chat, openai_completions, tgi
from lmiserve.formatters.openai_chat_responder import ChatResponder
from lmiserve.formatters.openai_common import JSONLINES_FRAMING, Style
from lmiserve.generation.request import RequestOutput, SequenceOutput, TokenOutput

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "protocols"
PROMPT = "What is Deep Learning?"
TOKENS = [(29602, "Deep", -0.0524), (5663, " Learning", -1.2865), (314, " is", -0.0074), (253, " a", -0.25)]
ERRORS = [
    E.BadRequest("request body is not valid JSON"),
    E.ValidationFailed("temperature must be at most 2"),
    E.NotFound("model 'x' is not loaded"),
    E.Conflict("model 'x' is already registered"),
    E.PayloadTooLarge("request body of 9 bytes exceeds max_request_size (8 bytes)"),
    E.Overloaded("job queue is full"),
    E.ModelNotReady("model m is not ready"),
    E.HandlerFailure("the handler raised ValueError"),
    E.PredictTimeout("no answer within 120 s"),
    E.WorkerDied("the engine exited"),
    E.GenerationError("the engine failed on this request"),
]


def golden(name: str, data: bytes) -> None:
    path = FIXTURES / name
    if os.environ.get("LMISERVE_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    assert path.exists(), f"missing fixture {name}"
    assert data == path.read_bytes(), f"{name} changed"


def output(finish: str | None = "length", logprobs: bool = False) -> RequestOutput:
    toks = [
        TokenOutput(i, t, lp, top=[TokenOutput(i, t, lp, token=t)] if logprobs else None, token=t if logprobs else None)
        for i, t, lp in TOKENS
    ]
    text = "".join(t.text for t in toks)
    seq = SequenceOutput(0, text, toks, list(toks), finish, cumulative_logprob=sum(t.logprob for t in toks))
    out = RequestOutput("r", PROMPT, [1780, 314, 12584, 5663, 47], [seq], seed=42)
    out.batch_sizes, out.queue_us = [1, 2, 2, 3], [1500, 20, 18, 25]
    return out


def replay(responder, out: RequestOutput, fail_after: int | None = None) -> bytes:
    """Feed ``out`` one token per update, as the server does (optionally failing part-way)."""
    seq = out.sequences[0]
    tokens, final, text = list(seq.tokens), seq.finish_reason, seq.text
    if hasattr(responder, "start"):
        responder.start([out])
    chunks = []
    for i, token in enumerate(tokens):
        if fail_after is not None and i == fail_after:
            chunks.append(responder.error_chunk("the engine failed on this request"))
            return b"".join(chunks)
        seq.new_tokens, seq.tokens = [token], tokens[: i + 1]
        seq.text = "".join(t.text for t in seq.tokens)
        seq.finish_reason = final if i == len(tokens) - 1 else None
        chunks.append(responder.chunk(0, out))
    seq.text = text
    chunks.append(responder.end([out]))
    return b"".join(chunks)


def fixed(responder):
    responder.id, responder.created = "id-1", 1700000000
    return responder


def pretty(obj) -> bytes:
    return json.dumps(obj, indent=2, sort_keys=True).encode() + b"\n"


# --- each protocol's error bodies ------------------------------------------------------------


@pytest.mark.parametrize("protocol", sorted(errors.PROTOCOLS))
def test_error_bodies(protocol):
    table = {type(err).__name__: list(errors.PROTOCOLS[protocol](err)) for err in ERRORS}
    golden(f"errors/{protocol}.json", pretty(table))


# --- TGI ----------------------------------------------------------------------------------------


def tgi_parsed(body: dict, stream: bool | None = None):
    parsed = tgi.parse(orjson.dumps(body), stream)
    parsed.seed = 42
    return parsed


def test_tgi_generate():
    """TGI's own GenerateResponse on /generate (MindIE's / is in test_spec_examples)."""
    parsed = tgi_parsed({"inputs": PROMPT, "parameters": {"details": True}}, stream=False)
    golden("tgi/generate.json", tgi.TgiResponder(parsed).body([output()]))


def test_tgi_stream_and_failure():
    """TGI's own StreamResponse on /generate_stream: ``data:`` with no space, an int id, an index."""
    parsed = tgi_parsed({"inputs": PROMPT, "parameters": {"details": True}}, stream=True)
    golden("tgi/stream.sse", replay(tgi.TgiResponder(parsed), output()))
    golden("tgi/stream_error.sse", replay(tgi.TgiResponder(parsed), output(), fail_after=2))


# --- OpenAI -------------------------------------------------------------------------------------


def completion(body: dict, style=None):
    req = openai_completions.parse(body)
    return fixed(openai_completions.CompletionResponder(req, "tiny", *(style and [style] or [])))


def chat(body: dict, style=None):
    req = openai_chat.parse(body)
    return fixed(ChatResponder(req, "tiny", *(style and [style] or [])))


MESSAGES = [{"role": "user", "content": PROMPT}]


def test_openai_completion():
    golden("openai/completion.json", completion({"prompt": PROMPT}).body([output()]))
    r = completion({"prompt": PROMPT, "logprobs": 1, "echo": False, "suffix": "!"})
    golden("openai/completion_logprobs.json", r.body([output(logprobs=True)]))


def test_openai_completion_stream_and_failure():
    body = {"prompt": PROMPT, "stream": True, "stream_options": {"include_usage": True}}
    golden("openai/completion_stream.sse", replay(completion(body), output()))
    golden("openai/completion_stream_error.sse", replay(completion(body), output(), fail_after=2))
    # without include_usage the chunk that ends the last sequence carries the usage (as MindIE does)
    golden("openai/completion_stream_usage_last.sse", replay(completion({"prompt": PROMPT, "stream": True}), output()))


def test_openai_chat():
    golden("openai/chat.json", chat({"messages": MESSAGES}).body([output(finish="eos_token")]))
    body = {"messages": MESSAGES, "logprobs": True, "top_logprobs": 1}
    golden("openai/chat_logprobs.json", chat(body).body([output(logprobs=True)]))


def test_openai_chat_stream_and_failure():
    body = {"messages": MESSAGES, "stream": True}
    golden("openai/chat_stream.sse", replay(chat(body), output(finish="eos_token")))
    golden("openai/chat_stream_error.sse", replay(chat(body), output(), fail_after=2))


def test_openai_embeddings(monkeypatch):
    vectors = np.array([[0.5, -0.25, 0.125], [1.0, 0.0, -1.0]], dtype=np.float32)
    req = embeddings.parse({"input": ["a", "b"]})
    golden("openai/embeddings.json", orjson.dumps(embeddings.response(req, vectors, [3, 4], "minilm")))
    req = embeddings.parse({"input": "a", "encoding_format": "base64"})
    golden("openai/embeddings_base64.json", orjson.dumps(embeddings.response(req, vectors[:1], [3], "minilm")))


# --- LMI chat and completions on /invocations (JSON lines) --------------------------------------


def test_lmi_chat_jsonlines():
    style = Style("chat.completion", framing=JSONLINES_FRAMING, mindie_usage=False)
    golden("lmi/chat_stream.jsonl", replay(chat({"messages": MESSAGES, "stream": True}, style), output()))
    golden("lmi/chat_stream_error.jsonl", replay(chat({"messages": MESSAGES, "stream": True}, style), output(), 2))


# --- Databricks ---------------------------------------------------------------------------------


def test_databricks_chat_and_stream():
    golden("databricks/chat.json", chat({"messages": MESSAGES}, databricks.CHAT).body([output(finish="eos_token")]))
    stream = chat({"messages": MESSAGES, "stream": True}, databricks.CHAT)
    golden("databricks/chat_stream.sse", replay(stream, output(finish="eos_token")))
    failing = chat({"messages": MESSAGES, "stream": True}, databricks.CHAT)
    golden("databricks/chat_stream_error.sse", replay(failing, output(), fail_after=2))


def test_databricks_completions(monkeypatch):
    golden("databricks/completion.json", completion({"prompt": PROMPT}, databricks.COMPLETIONS).body([output()]))
    stream = completion({"prompt": PROMPT, "stream": True}, databricks.COMPLETIONS)
    golden("databricks/completion_stream.sse", replay(stream, output()))


def test_databricks_embeddings(monkeypatch):
    import uuid

    monkeypatch.setattr(embeddings.uuid, "uuid4", lambda: uuid.UUID(int=7))
    vectors = np.array([[0.5, -0.25, 0.125]], dtype=np.float32)
    req = embeddings.parse({"input": "a", "instruction": "Represent this:", "_with_id": True})
    assert req.texts == ["Represent this: a"]
    golden("databricks/embeddings.json", orjson.dumps(embeddings.response(req, vectors, [5], "minilm")))


# --- KServe V2 ----------------------------------------------------------------------------------


def v2_request(binary_output: bool):
    from lmiserve.formatters import kserve, kserve_infer

    data = {
        "id": "req-7",
        "inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": [PROMPT]}],
        "outputs": [{"name": "text_output", "parameters": {"binary_data": binary_output}}],
        "parameters": {"max_tokens": 4},
    }
    return kserve_infer.plan(kserve.parse_infer(data))


def test_kserve_infer_json_and_binary():
    from lmiserve.formatters import kserve, kserve_infer

    text = output().sequences[0].text
    body, header = kserve_infer.rest_body(v2_request(False).response("tiny", [text]))
    assert header is None
    golden("kserve/infer.json", body)
    body, header = kserve_infer.rest_body(v2_request(True).response("tiny", [text]))
    golden("kserve/infer_binary.bin", body)
    assert body[header:] == kserve.encode_bytes([text.encode()])


def test_kserve_generate_and_stream():
    from lmiserve.formatters import kserve_generate

    prompt, params = kserve_generate.parse_generate({"text_input": PROMPT, "parameters": {"max_tokens": 4}})
    golden("kserve/generate.json", kserve_generate.GenerateResponder("tiny", params, stream=False).body([output()]))
    golden(
        "kserve/generate_stream.sse", replay(kserve_generate.GenerateResponder("tiny", params, stream=True), output())
    )
    failing = kserve_generate.GenerateResponder("tiny", params, stream=True)
    golden("kserve/generate_stream_error.sse", replay(failing, output(), fail_after=2))
