"""Every protocol parser, fed arbitrary JSON and arbitrary bytes, either builds a request the
engine can take or raises the protocol's typed validation error, never anything else."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lmiserve import wire
from lmiserve.errors import BadRequest, ValidationFailed
from lmiserve.formatters import (
    databricks,
    embeddings,
    kserve,
    lmi_dynamic,
    lmi_rolling,
    openai_chat,
    openai_completions,
    shapes,
    tgi,
)
from lmiserve.formatters import kserve_generate as generate_extension
from lmiserve.formatters import kserve_infer as infer_extension
from lmiserve.generation import limits
from lmiserve.generation.request import GenerationRequest

pytestmark = pytest.mark.fuzz

REFUSALS = (BadRequest, ValidationFailed)
MAX_MODEL_LEN = 256
LIMITS = limits.RequestLimits(max_new_tokens=MAX_MODEL_LEN, max_new_tokens_name="max_model_len")

# values parsers meet in practice, plus the ones that break them: huge and negative numbers,
# floats where integers belong, empty and non-ASCII strings, nulls
scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.sampled_from([0, -1, 1, 2, 5, 2**31, 2**63, 2**64, 10**30, -(2**63)])
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
    | st.sampled_from(["", "user", "json", "sse", "text_input", "BYTES", "auto", "none", "\ud7ff", "x" * 2000])
)
json_values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5)
)

KEYS = {
    "common": ["inputs", "prompt", "messages", "input", "parameters", "stream", "model", "n", "best_of", "stop"],
    "params": [
        "max_new_tokens", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "min_p",
        "typical_p", "repetition_penalty", "presence_penalty", "frequency_penalty", "seed", "n", "best_of",
        "stop", "stop_sequences", "stop_token_ids", "do_sample", "details", "decoder_input_details",
        "top_n_tokens", "truncate", "return_full_text", "logprobs", "top_logprobs", "echo", "suffix",
        "use_beam_search", "num_beams", "length_penalty", "early_stopping", "min_tokens", "ignore_eos",
        "response_format", "tools", "tool_choice", "grammar", "watermark", "adapter_id", "output_formatter",
        "stream_options", "error_behavior", "use_raw_prompt", "encoding_format", "dimensions", "instruction",
        "text_input", "id", "outputs", "datatype", "shape", "data", "name", "role", "content",
    ],
}  # fmt: skip
keys = st.sampled_from(KEYS["common"] + KEYS["params"]) | st.text(max_size=6)
messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "user", "assistant", "tool", "developer", "x"]), "content": json_values}
    ),
    max_size=3,
)
tensors = st.lists(
    st.fixed_dictionaries(
        {
            "name": st.sampled_from(["text_input", "max_tokens", "temperature", "sampling_parameters", "x"]),
            "datatype": st.sampled_from(["BYTES", "INT32", "FP32", "BOOL", "UINT64", "FP16", "nope"]),
            "shape": st.lists(st.integers(-2, 4), max_size=3),
            "data": json_values,
        },
        optional={"parameters": json_values},
    ),
    max_size=3,
)
bodies = st.dictionaries(keys, json_values | messages | tensors, max_size=8) | st.fixed_dictionaries(
    {"inputs": st.text(max_size=10) | tensors},
    optional={"parameters": st.dictionaries(st.sampled_from(KEYS["params"]), json_values, max_size=8)},
)
# near-valid bodies of each protocol, with a few fuzzed parameters: they reach past the shape
# checks into value validation and request building
small = st.sampled_from([None, True, False, 0, 1, 2, 3, 16, 17, 257, -1, 0.5, 2.0, 2**64, 10**30, "x", [], {}])
param_values = small | st.lists(st.text(max_size=3) | st.integers(-1, 2**33), max_size=20)
params = st.dictionaries(st.sampled_from(KEYS["params"]), param_values, max_size=3)
text = st.text(min_size=1, max_size=12)
user = st.just([{"role": "user", "content": "hi"}])
tensor = st.fixed_dictionaries({"name": st.just("text_input"), "datatype": st.just("BYTES"), "shape": st.just([1])})
skeletons = st.one_of(
    st.builds(lambda p, t: {"inputs": t, "parameters": p}, params, text),
    st.builds(lambda p, t: {"prompt": t, **p}, params, text | st.lists(st.integers(-1, 500), max_size=4)),
    st.builds(lambda p, m: {"messages": m, **p}, params, user | messages),
    st.builds(lambda p, t: {"text_input": t, "parameters": p}, params, text),
    st.builds(lambda p, t, x: {"inputs": [{**x, "data": [t]}], "parameters": p}, params, text, tensor),
)
documents = skeletons | bodies | json_values


def engine_ready(requests: list[GenerationRequest]) -> None:
    """What the server does next with a parsed request: the limits, then the engine's wire."""
    for req in requests:
        assert isinstance(req, GenerationRequest)
        assert isinstance(req.prompt, str)
        limits.check(req, LIMITS)
        wire.decode(wire.encode(wire.GenerateRequest(request_id="r", prompt_ids=[1], params=req.params)))


def lmi(body: bytes) -> None:
    for defaults in (lmi_rolling.Defaults(), lmi_rolling.Defaults(tgi_compat=True, enable_streaming=True)):
        engine_ready([lmi_rolling.parse_request(body, defaults).generation])


def lmi_dynamic_(body: bytes) -> None:
    lmi_dynamic.parse_request(body)


def tgi_(body: bytes) -> None:
    for stream in (None, True, False):
        engine_ready([tgi.parse(body, stream).generation])


def completions(body: bytes) -> None:
    req = openai_completions.parse(shapes.json_object(body))
    engine_ready(openai_completions.generation_requests(req))


def chat(body: bytes) -> None:
    req = openai_chat.parse(shapes.json_object(body))
    engine_ready([openai_chat.generation_request(req, "prompt", MAX_MODEL_LEN)])


def databricks_(body: bytes) -> None:
    data = shapes.json_object(body)
    task = databricks.task_of(data)
    if task == "completions":
        engine_ready(databricks.completion_requests(databricks.parse_completion(data), MAX_MODEL_LEN))
    elif task == "chat":
        engine_ready([openai_chat.generation_request(databricks.parse_chat(data), "prompt", MAX_MODEL_LEN)])
    else:
        embeddings.parse(data)


def embeddings_(body: bytes) -> None:
    embeddings.parse(shapes.json_object(body))


def kserve_infer(body: bytes) -> None:
    data, binary = kserve.split_binary(body, None)
    engine_ready(infer_extension.plan(kserve.parse_infer(data, binary)).generation_requests())


def kserve_generate(body: bytes) -> None:
    prompt, params = generate_extension.parse_generate(shapes.json_object(body))
    engine_ready([params.request(prompt)])


def invocation_shape(body: bytes) -> None:
    assert shapes.invocation_shape(shapes.json_object(body)) in (
        "lmi", "kserve", "chat", "completions", "embeddings"
    )  # fmt: skip


PARSERS = [lmi, lmi_dynamic_, tgi_, completions, chat, databricks_, embeddings_, kserve_infer, kserve_generate]
PARSERS.append(invocation_shape)
fuzz = settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


def refused_or_built(parser, body: bytes) -> None:
    try:
        parser(body)
    except REFUSALS as err:
        assert err.status in (400, 424) and str(err.detail)


@pytest.mark.parametrize("parser", PARSERS, ids=lambda p: p.__name__.rstrip("_"))
@fuzz
@given(doc=documents)
def test_arbitrary_json(parser, doc):
    refused_or_built(parser, json.dumps(doc).encode())


@pytest.mark.parametrize("parser", PARSERS, ids=lambda p: p.__name__.rstrip("_"))
@fuzz
@given(raw=st.binary(max_size=200) | documents.map(lambda d: json.dumps(d).encode()[:-1] + b"\xff\xfe"))
def test_arbitrary_bytes(parser, raw):
    refused_or_built(parser, raw)


@pytest.mark.parametrize(
    "params,fragment",
    [
        ({"max_new_tokens": 257}, "max_model_len (256)"),
        ({"n": 129}, "max_n (128)"),
        ({"best_of": 129, "n": 1}, "max_best_of (128)"),
        ({"num_beams": 400}, "max_best_of (128)"),
        ({"stop_token_ids": [2**40]}, "token ids"),
    ],
)
def test_limits_refuse_what_is_beyond_them(params, fragment):
    req = GenerationRequest("x", wire.SamplingParams(**params))
    with pytest.raises(ValidationFailed, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        limits.check(req, LIMITS)


def test_stop_sequence_limits_and_configured_values(tmp_path):
    tight = limits.RequestLimits(max_new_tokens=8, max_stop_sequences=2, max_stop_sequence_length=3)
    limits.check(GenerationRequest("x", wire.SamplingParams(max_new_tokens=8), stop=["a", "abc"]), tight)
    with pytest.raises(ValidationFailed, match="3 stop sequences"):
        limits.check(GenerationRequest("x", wire.SamplingParams(max_new_tokens=1), stop=["a"] * 3), tight)
    with pytest.raises(ValidationFailed, match="4 characters"):
        limits.check(GenerationRequest("x", wire.SamplingParams(max_new_tokens=1), stop=["abcd"]), tight)
    with pytest.raises(ValidationFailed, match=r"max_new_tokens_limit \(8\)"):
        limits.check(GenerationRequest("x", wire.SamplingParams(max_new_tokens=9)), tight)
    from lmiserve.config import load_settings

    configured = load_settings(tmp_path, env={"OPTION_MAX_NEW_TOKENS_LIMIT": "64", "OPTION_MAX_N": "2"}).engine
    got = limits.RequestLimits.from_settings(configured, 4096)
    assert (got.max_new_tokens, got.max_n, got.max_best_of, got.max_stop_sequences) == (64, 2, 128, 1024)
    assert got.max_stop_sequence_length == 32768
    # the documents' largest stop lists are allowed; more characters than 32768 in all are not
    limits.check(GenerationRequest("x", wire.SamplingParams(max_new_tokens=1), stop=["s" * 32] * 1024), got)
    with pytest.raises(ValidationFailed, match="32769 characters in all"):
        limits.check(GenerationRequest("x", wire.SamplingParams(max_new_tokens=1), stop=["s" * 33] * 993), got)
    assert limits.RequestLimits.from_settings(load_settings(tmp_path, env={}).engine, 4096).max_new_tokens == 4096
