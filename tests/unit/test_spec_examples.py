"""The examples of the API documents in shared/specs, replayed through our formatters and
compared byte for byte with golden fixtures (``LMISERVE_UPDATE_GOLDEN=1`` rewrites them).

Where a document's example shows ``null`` for something it says is "not supported yet"
(MindIE's token ``logprob``/``special``/``text``), ours carries the real value.
"""

from __future__ import annotations

import re

import orjson
import pytest

from lmiserve.errors import ValidationFailed
from lmiserve.formatters import mindie_tgi, tgi
from lmiserve.generation.request import RequestOutput, SequenceOutput, TokenOutput

from .test_protocol_golden import golden

# --- MindIE mindie-tgi-text-and-stream-inference: POST / -----------------------------------------

MINDIE_REQUEST = {
    "inputs": "My name is Olivier and I",
    "parameters": {
        "decoder_input_details": True,
        "details": True,
        "do_sample": True,
        "max_new_tokens": 20,
        "repetition_penalty": 1.03,
        "return_full_text": False,
        "seed": None,
        "temperature": 0.5,
        "top_k": 10,
        "top_p": 0.95,
        "truncate": None,
        "typical_p": 0.5,
        "watermark": False,
        "stop": ["stop1", "stop2"],
        "adapter_id": "None",
    },
    "stream": False,
}
PREFILL = [(5050, "My"), (829, " name"), (374, " is"), (77018, " Olivier"), (323, " and"), (358, " I")]
TEXT_IDS = [
    2776,
    264,
    3162,
    23576,
    504,
    9625,
    13,
    358,
    2948,
    311,
    1936,
    2513,
    11,
    5310,
    3482,
    8357,
    323,
    6371,
    10500,
    13,
]
TEXT_PIECES = ["'m", " a", " software", " engineer", " from", " France", ".", " I", " love", " to", " build"]
TEXT_PIECES += [" things", ",", " especially", " web", " applications", " and", " mobile", " apps", "."]
STREAM_IDS = [29915, 29885, 263, 5176, 1410, 29891, 1058, 338, 3063, 363, 263, 2058, 304, 5735, 297, 29889, 306]
STREAM_IDS += [29915, 29885, 263]
STREAM_PIECES = ["'", "m", " a", " French", " gu", "y", " who", " is", " looking", " for", " a", " place", " to"]
STREAM_PIECES += [" live", " in", ".", " I", "'", "m", " a"]


def mindie_output(ids, pieces, prompt_ids, seed, prefill=None) -> RequestOutput:
    toks = [TokenOutput(i, t, None) for i, t in zip(ids, pieces)]
    seq = SequenceOutput(0, "".join(pieces), toks, list(toks), "length")
    out = RequestOutput("r", MINDIE_REQUEST["inputs"], prompt_ids, [seq], seed=seed)
    if prefill is not None:
        out.prompt_tokens = [TokenOutput(i, t, None) for i, t in prefill]
    return out


def mindie_parse(body: dict, seed: int):
    parsed = tgi.parse(orjson.dumps(body), None, mindie=True)
    parsed.seed = seed
    return parsed


def replay_all(responder, out: RequestOutput) -> bytes:
    seq = out.sequences[0]
    tokens, final = list(seq.tokens), seq.finish_reason
    chunks = []
    for i, token in enumerate(tokens):
        seq.new_tokens, seq.tokens = [token], tokens[: i + 1]
        seq.text = "".join(t.text for t in seq.tokens)
        seq.finish_reason = final if i == len(tokens) - 1 else None
        chunks.append(responder.chunk(0, out))
    return b"".join(chunks)


def test_mindie_text_inference_example():
    parsed = mindie_parse(MINDIE_REQUEST, 789070824)
    assert parsed.generation.cap_max_new_tokens and parsed.generation.stop == ["stop1", "stop2"]
    out = mindie_output(TEXT_IDS, TEXT_PIECES, [i for i, _ in PREFILL], 789070824, PREFILL)
    body = mindie_tgi.MindieResponder(parsed).body([out])
    golden("mindie/text.json", body)
    answer = orjson.loads(body)
    assert isinstance(answer, list) and list(answer[0]) == ["details", "generated_text"]
    details = answer[0]["details"]
    assert list(details) == ["prompt_tokens", "finish_reason", "generated_tokens", "prefill", "seed", "tokens"]
    assert (details["prompt_tokens"], details["generated_tokens"], details["seed"]) == (6, 20, 789070824)
    assert [t["id"] for t in details["prefill"]] == [i for i, _ in PREFILL]
    assert all(list(t) == ["id", "logprob", "special", "text"] for t in details["prefill"] + details["tokens"])
    expected = (
        "'m a software engineer from France. I love to build things, especially web applications and mobile apps."
    )
    assert answer[0]["generated_text"] == expected


def test_mindie_stream_inference_example():
    body = {**MINDIE_REQUEST, "stream": True, "parameters": {**MINDIE_REQUEST["parameters"]}}
    body["parameters"]["decoder_input_details"] = False
    parsed = mindie_parse(body, 218884523)
    out = mindie_output(STREAM_IDS, STREAM_PIECES, list(range(8)), 218884523)
    data = replay_all(mindie_tgi.MindieResponder(parsed), out)
    golden("mindie/stream.sse", data)
    events = data.split(b"\n\n")[:-1]
    assert all(e.startswith(b"data: {") for e in events) and len(events) == 20
    first = orjson.loads(events[0][len(b"data: ") :])
    assert first["token"]["id"] == [29915] and first["generated_text"] is None and first["details"] is None
    last = orjson.loads(events[-1][len(b"data: ") :])
    assert last["generated_text"] == "'m a French guy who is looking for a place to live in. I'm a"
    assert last["details"] == {"prompt_tokens": 8, "finish_reason": "length", "generated_tokens": 20, "seed": 218884523}


def test_mindie_stream_example_with_full_text_enabled():
    """The document's second stream (fullTextEnabled=true): each token.text is the text so far."""
    body = {"inputs": "I", "stream": True, "parameters": {"details": True, "decoder_input_details": False}}
    parsed = mindie_parse(body, 1621189503)
    pieces = [(11, ","), (600, " i"), (1184, " need"), (498, " you"), (151645, "")]
    toks = [TokenOutput(i, t, None, special=i == 151645) for i, t in pieces]
    seq = SequenceOutput(0, ", i need you", toks, list(toks), "eos_token")
    out = RequestOutput("r", "I", [40], [seq], seed=1621189503)
    data = replay_all(mindie_tgi.MindieResponder(parsed, full_text=True), out)
    document = [
        '{"token":{"id":[11],"text":",","logprob":null,"special":null},"generated_text":null,"details":null}',
        '{"token":{"id":[600],"text":", i","logprob":null,"special":null},"generated_text":null,"details":null}',
        '{"token":{"id":[1184],"text":", i need","logprob":null,"special":null},"generated_text":null,"details":null}',
        '{"token":{"id":[498],"text":", i need you","logprob":null,"special":null},"generated_text":null,"details":null}',
    ]
    document_eos = (
        '{"token":{"id":[151645],"text":", i need you","logprob":null,"special":null},"generated_text":", i need you",'
        '"details":{"prompt_tokens":1,"finish_reason":"eos_token","generated_tokens":5,"seed":1621189503}}'
    )
    # "special": the token's flag where the document prints null (as the golden stream above does)
    document = [line.replace('"special":null', '"special":false') for line in document[:4]]
    document.append(document_eos.replace('"special":null', '"special":true'))
    assert data == "".join(f"data: {line}\n\n" for line in document).encode()
    plain = replay_all(mindie_tgi.MindieResponder(parsed), out)
    assert b'"text":" need"' in plain and b'"text":", i need"' not in plain


def test_mindie_multimodal_inputs():
    parts = [{"type": "text", "text": "My name is Olivier and I"}, {"type": "text", "text": "tell me more"}]
    parsed = tgi.parse(orjson.dumps({"inputs": parts}), None, mindie=True)
    assert parsed.generation.prompt == "My name is Olivier and I\ntell me more"
    example = [
        {"type": "text", "text": "My name is Olivier and I"},
        {"type": "image_url", "image_url": "/xxxx/test.png"},
    ]
    parsed = tgi.parse(orjson.dumps({"inputs": example, "parameters": MINDIE_REQUEST["parameters"]}), None, mindie=True)
    generation = parsed.generation
    assert generation.prompt == "My name is Olivier and I\n" and generation.media_at == [25]
    assert [(m.kind, m.source, m.where) for m in generation.media] == [("image", "/xxxx/test.png", "inputs[1]")]
    for bad in ([], [{"type": "audio"}], [{"type": "text", "text": ""}]):
        with pytest.raises(ValidationFailed):
            tgi.parse(orjson.dumps({"inputs": bad}), None, mindie=True)


def test_mindie_stop_lists_up_to_1024():
    stops = [f"s{i}" for i in range(1024)]
    parsed = tgi.parse(orjson.dumps({"inputs": "x", "parameters": {"stop": stops}}), None, mindie=True)
    assert parsed.generation.stop == stops
    with pytest.raises(ValidationFailed, match="at most 1024"):
        tgi.parse(orjson.dumps({"inputs": "x", "parameters": {"stop": stops + ["t"]}}), None, mindie=True)


def test_max_new_tokens_above_the_limits_is_lowered_on_mindie_routes_only():
    from lmiserve import wire
    from lmiserve.generation import limits
    from lmiserve.generation.request import GenerationRequest

    tight = limits.RequestLimits(max_new_tokens=64)
    parsed = tgi.parse(orjson.dumps({"inputs": "x", "parameters": {"max_new_tokens": 2147483647}}), None, mindie=True)
    limits.check(parsed.generation, tight)  # lowered later, when the prompt's length is known
    with pytest.raises(ValidationFailed, match="max_new_tokens"):
        limits.check(GenerationRequest("x", wire.SamplingParams(max_new_tokens=65)), tight)
    with pytest.raises(ValidationFailed):
        tgi.parse(orjson.dumps({"inputs": "x", "parameters": {"max_new_tokens": 2147483648}}), None, mindie=True)


# --- MindIE mindie-v1-completions: POST /v1/completions -----------------------------------------

COMPLETION_CHOICES = [
    [
        ("\n", -1.8828125, {"\n\n": -2.0}),
        ("I", -0.018310546875, {"Hello": -4.53125}),
        (" am", -0.054931640625, {"'m": -2.9375}),
        (" a", -0.435546875, {" Q": -1.1875}),
        (" large", -0.0286865234375, {" language": -4.78125}),
    ],
    [
        ("\n\n", -2.0, {"\n": -1.8828125}),
        ("I", -0.031494140625, {"Hello": -4.28125}),
        (" am", -0.0791015625, {"'m": -2.578125}),
        (" a", -0.5546875, {" Q": -1.0546875}),
        (" large", -0.01092529296875, {" language": -6.375}),
    ],
]


def completion_output() -> RequestOutput:
    seqs = []
    for index, choice in enumerate(COMPLETION_CHOICES):
        toks = []
        for n, (text, lp, alts) in enumerate(choice):
            top = [TokenOutput(100 + n, text, lp, token=text)] + [
                TokenOutput(200 + n, alt, alp, token=alt) for alt, alp in alts.items()
            ]
            toks.append(TokenOutput(100 + n, text, lp, top=top, token=text))
        text = "".join(t.text for t in toks)
        seqs.append(SequenceOutput(index, text, toks, [], "length", cumulative_logprob=sum(t.logprob for t in toks)))
    out = RequestOutput("r", "who are you", [1, 2, 3], seqs)
    out.batch_sizes, out.queue_us = [1] * 10, [5496, 146, 65, 60, 111, 42, 27, 70, 64, 51]
    return out


def completion_responder(body: dict):
    from lmiserve.formatters import openai_completions

    req = openai_completions.parse(body)
    responder = openai_completions.CompletionResponder(req, body["model"])
    responder.id, responder.created = "endpoint_common_1", 1744948803
    return req, responder


def test_mindie_completions_fake_streaming_example():
    body = {
        "model": "Qwen2.5-7B-Instruct",
        "prompt": "who are you",
        "temperature": 1,
        "max_tokens": 5,
        "use_beam_search": True,
        "ignore_eos": True,
        "n": 2,
        "best_of": 2,
        "stream": True,
        "logprobs": 2,
    }
    req, responder = completion_responder(body)
    out = completion_output()
    responder.start([out])
    chunks = []
    for seq in out.sequences:  # the engine's updates: none of them is sent on its own
        seq.new_tokens = list(seq.tokens)
        out.last_index = seq.index
        chunks.append(responder.chunk(0, out))
    assert chunks == [b"", b""]
    data = responder.end([out])
    golden("mindie/completions_fake_stream.sse", data)
    events = data.split(b"\n\n")[:-1]
    assert events[-1] == b"data: [DONE]" and len(events) == 2
    event = orjson.loads(events[0][len(b"data: ") :])
    assert [c["index"] for c in event["choices"]] == [0, 1]
    assert [c["text"] for c in event["choices"]] == ["\nI am a large", "\n\nI am a large"]
    # the document's offsets: the second choice's count on from the first choice's 13 characters
    assert [c["logprobs"]["text_offset"] for c in event["choices"]] == [[0, 1, 2, 5, 7], [13, 15, 16, 19, 21]]
    assert event["usage"]["completion_tokens"] == 10 and event["usage"]["total_tokens"] == 13


def test_mindie_completions_text_example_and_defaults():
    body = {"model": "llama", "prompt": "who are you", "temperature": 1, "max_tokens": 5, "ignore_eos": True}
    body.update({"n": 2, "best_of": 2, "stream": False, "logprobs": 2})
    req, responder = completion_responder(body)
    gen = req and __import__("lmiserve.formatters.openai_completions", fromlist=["x"]).generation_requests(req)[0]
    assert (gen.params.max_new_tokens, gen.params.n, gen.cap_max_new_tokens, gen.max_new_tokens_omitted) == (
        5,
        2,
        True,
        False,
    )
    golden("mindie/completions_text.json", responder.body([completion_output()]))


def test_mindie_completions_ranges():
    from lmiserve.formatters import openai_completions as oc

    def gen(**fields):
        return oc.generation_requests(oc.parse({"model": "m", "prompt": "x", **fields}))[0]

    omitted = gen()  # max_tokens left out: max_iter_times when tokenized, not 16
    assert omitted.max_new_tokens_omitted and omitted.cap_max_new_tokens
    assert gen(temperature=7.5).params.temperature == 7.5
    assert gen(temperature=0).params.do_sample is False
    assert gen(n=128, best_of=128, temperature=1).params.n == 128
    assert gen(stop_token_ids=[5, 2**31, -(2**40), 2**31 - 1]).params.stop_token_ids == [5, 2**31 - 1]
    assert gen(stop=["a" * 32768]).stop == ["a" * 32768]
    assert gen(max_tokens=2**31 - 1).params.max_new_tokens == 2**31 - 1
    mindie = {"model": "m", "prompt": "x"}
    for fields, fragment in (
        ({"model": None}, "'model' is required"),
        ({"seed": 0}, "seed must be in (0, 18446744073709551615]"),
        ({"top_k": 0}, "top_k must be -1 or in (0, 2147483647]"),
        ({"n": 2, "temperature": 0}, "n or best_of above 1 needs temperature above 0"),
    ):
        with pytest.raises(ValidationFailed, match=re.escape(fragment)):
            oc.parse({**mindie, **fields}, mindie=True)
        oc.parse({**mindie, **fields, "model": "m"} if "model" in fields else {**mindie, **fields})  # not MindIE's
    assert oc.parse({**mindie, "seed": 1, "top_k": -1}, mindie=True).seed == 1
    for bad in (
        {"temperature": -0.5},
        {"n": 129},
        {"best_of": 129},
        {"stop": ["a" * 32768, "b"]},
        {"max_tokens": 2**31},
        {"max_tokens": 0},
    ):
        with pytest.raises(ValidationFailed):
            gen(**bad)
