"""KServe V2 parsing, parameter mapping, binary tensors and response shapes."""

import json
import struct

import numpy as np
import orjson
import pytest
from tritonclient.utils import deserialize_bytes_tensor, serialize_byte_tensor

from lmiserve.errors import BadRequest, NotFound, ValidationFailed
from lmiserve.formatters import errors, kserve, kserve_generate, kserve_infer
from lmiserve.generation.request import RequestOutput, SequenceOutput, TokenOutput


def text_input(data, shape=None, **extra):
    return {"name": "text_input", "datatype": "BYTES", "shape": shape or [len(data)], "data": data, **extra}


def plan_of(body, binary=b""):
    return kserve_infer.plan(kserve.parse_infer(body, binary))


# --- parsing -----------------------------------------------------------------------------


def test_a_batch_of_prompts_keeps_its_shape_and_id():
    p = plan_of({"id": "42", "inputs": [text_input([["a"], ["b"]], shape=[2, 1])]})
    assert p.prompts == ["a", "b"] and p.shape == [2, 1]
    assert p.outputs == [("text_output", False)]
    reqs = p.generation_requests()
    assert [r.prompt for r in reqs] == ["a", "b"]
    assert reqs[0].params.max_new_tokens == kserve.DEFAULT_MAX_TOKENS and not reqs[0].params.do_sample
    resp = p.response("tiny", ["x", "y"])
    assert (resp.model_name, resp.model_version, resp.id) == ("tiny", "1", "42")
    assert resp.outputs[0].shape == [2, 1] and resp.outputs[0].data == ["x", "y"]


@pytest.mark.parametrize(
    "body,fragment",
    [
        ({"inputs": []}, "'inputs'"),
        ({"inputs": "hello"}, "'inputs'"),
        ({"id": 42, "inputs": [text_input(["a"])]}, "'id'"),
        ({"inputs": [{"datatype": "BYTES", "shape": [1], "data": ["a"]}]}, "'name'"),
        ({"inputs": [text_input(["a"], datatype="STRING")]}, "datatype 'STRING'"),
        ({"inputs": [text_input(["a"], datatype="INT32")]}, "not a valid INT32"),
        ({"inputs": [text_input([1], datatype="INT32")]}, "must be BYTES"),
        ({"inputs": [text_input(["a", "b"], shape=[3])]}, "needs 3 elements"),
        ({"inputs": [text_input(["a"], shape=[-1])]}, "non-negative"),
        ({"inputs": [text_input(["a"], shape="1")]}, "shape"),
        ({"inputs": [text_input([7])]}, "BYTES elements must be strings"),
        ({"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1]}]}, "no 'data'"),
        ({"inputs": [text_input([], shape=[0])]}, "no prompts"),
        ({"inputs": [{"name": "prompt", "datatype": "BYTES", "shape": [1], "data": ["a"]}]}, "no 'text_input'"),
        ({"inputs": [text_input(["a"]), text_input(["b"])]}, "more than once"),
        ({"inputs": [text_input(["a"]), {"name": "x", "datatype": "INT32", "shape": [1], "data": [1]}]}, "'x'"),
        ({"inputs": [text_input(["a"])], "outputs": [{"name": "logits"}]}, "unknown output 'logits'"),
        ({"inputs": [text_input(["a"])], "parameters": [1]}, "'parameters' must be an object"),
    ],
)
def test_bad_requests_are_refused_with_a_reason(body, fragment):
    with pytest.raises(BadRequest) as info:
        plan_of(body)
    assert fragment in info.value.detail
    assert info.value.status == 400


def test_integer_ranges_are_checked():
    tensor = kserve.make_tensor("x", "UINT8", [2], [0, 255])
    assert tensor.data == [0, 255]
    with pytest.raises(BadRequest, match="not a valid UINT8"):
        kserve.make_tensor("x", "UINT8", [1], [256])
    with pytest.raises(BadRequest, match="not a valid INT8"):
        kserve.make_tensor("x", "INT8", [1], [True])


# --- parameters --------------------------------------------------------------------------


def test_parameters_map_to_sampling_params():
    params = {
        "max_new_tokens": 7,
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 20,
        "seed": 3,
        "stop": "\n",
        "ignore_eos": True,
        "repetition_penalty": 1.2,
        "min_tokens": 2,
        "bad_words": ["a b", "", "c"],
    }
    p = plan_of({"inputs": [text_input(["a"])], "parameters": params})
    r = p.generation_requests()[0]
    sp = r.params
    assert (sp.max_new_tokens, sp.do_sample, sp.temperature, sp.top_p, sp.top_k) == (7, True, 0.5, 0.9, 20)
    assert (sp.seed, sp.ignore_eos, sp.repetition_penalty, sp.min_new_tokens) == (3, True, 1.2, 2)
    assert r.stop == ["\n"] and sp.bad_words == ["a b", "c"]
    for given, words in (("a b,c", ["a b", "c"]), ("", [])):  # TensorRT-LLM's comma-separated string
        assert kserve.parameters({"bad_words": given}).request("a").params.bad_words == words


@pytest.mark.parametrize(
    "params,sampling",
    [
        ({}, False),
        ({"temperature": 0}, False),
        ({"temperature": 0, "do_sample": True}, False),
        ({"temperature": 0.7}, True),
        ({"temperature": 0.7, "do_sample": False}, False),
        ({"do_sample": True}, True),
        ({"top_k": -1}, False),
        ({"top_p": 0.5}, True),
    ],
)
def test_greedy_unless_sampling_is_asked_for(params, sampling):
    sp = kserve.parameters(params).request("a").params
    assert sp.do_sample is sampling
    if not sampling:
        assert sp.temperature == 1.0


def test_later_parameter_sources_win():
    body = {
        "parameters": {"max_tokens": 1, "temperature": 0.1, "top_k": 5, "binary_data_output": True},
        "inputs": [
            text_input(["a"], parameters={"max_tokens": 2, "temperature": 0.2}),
            {"name": "max_tokens", "datatype": "INT32", "shape": [1, 1], "data": [[3]]},
            {"name": "stop_words", "datatype": "BYTES", "shape": [2], "data": ["x", "y"]},
            {"name": "sampling_parameters", "datatype": "BYTES", "shape": [1], "data": ['{"seed": 9}']},
        ],
    }
    p = plan_of(body)
    sp = p.generation_requests()[0].params
    assert (sp.max_new_tokens, sp.temperature, sp.top_k, sp.seed) == (3, 0.2, 5, 9)
    assert p.params.stop == ("x", "y")
    assert p.outputs == [("text_output", True)]  # binary_data_output


@pytest.mark.parametrize(
    "params,fragment",
    [
        ({"temperature": -1}, "parameters.temperature"),
        ({"max_tokens": 0}, "parameters.max_tokens"),
        ({"max_tokens": "many"}, "parameters.max_tokens"),
        ({"top_p": 1.5}, "parameters.top_p"),
        ({"seed": -1}, "parameters.seed"),
        ({"stop": [1]}, "parameters.stop"),
        ({"bad_words": [1]}, "parameters.bad_words"),
    ],
)
def test_bad_parameter_values_are_validation_errors(params, fragment):
    with pytest.raises(ValidationFailed) as info:
        plan_of({"inputs": [text_input(["a"])], "parameters": params})
    assert fragment in info.value.detail
    status, body = errors.kserve(info.value)
    assert status == 400 and body == {"error": info.value.detail}


def test_parameter_inputs_must_hold_one_value():
    body = {
        "inputs": [text_input(["a"]), {"name": "temperature", "datatype": "FP32", "shape": [2], "data": [0.1, 0.2]}]
    }
    with pytest.raises(BadRequest, match="one value"):
        plan_of(body)
    bad_json = {"name": "sampling_parameters", "datatype": "BYTES", "shape": [1], "data": ["[1]"]}
    with pytest.raises(BadRequest, match="JSON object"):
        plan_of({"inputs": [text_input(["a"]), bad_json]})


def test_return_full_text_prefixes_the_prompt():
    p = plan_of({"inputs": [text_input(["Hi"])], "parameters": {"exclude_input_in_output": False}})
    out = RequestOutput("r", "Hi", [1], [SequenceOutput(0, text=" there", finish_reason="length")])
    assert p.text(out) == "Hi there"
    assert plan_of({"inputs": [text_input(["Hi"])]}).text(out) == " there"


# --- binary tensors ----------------------------------------------------------------------


def test_bytes_round_trip_matches_tritonclient():
    elements = ["", "héllo", "a\x00b", "x" * 300]
    raw = kserve.encode_bytes(elements)
    assert raw == serialize_byte_tensor(np.array(elements, dtype=np.object_)).item()
    assert kserve.decode_bytes(raw) == [e.encode() for e in elements]
    assert [x.decode() for x in deserialize_bytes_tensor(raw)] == elements


@pytest.mark.parametrize("raw", [b"\x05\x00", b"\x05\x00\x00\x00abc"])
def test_truncated_bytes_are_refused(raw):
    with pytest.raises(BadRequest, match="raw BYTES"):
        kserve.decode_bytes(raw, "text_input")


@pytest.mark.parametrize(
    "datatype,values,dtype",
    [
        ("INT32", [1, -2, 3], np.int32),
        ("UINT64", [0, 2**64 - 1], np.uint64),
        ("FP32", [0.5, -1.25], np.float32),
        ("FP16", [0.5, 2.0], np.float16),
        ("FP64", [0.1], np.float64),
        ("BOOL", [True, False], np.bool_),
    ],
)
def test_raw_numeric_tensors_are_little_endian(datatype, values, dtype):
    raw = kserve.encode_raw(datatype, values)
    assert raw == np.array(values, dtype=dtype).astype(np.dtype(dtype).newbyteorder("<")).tobytes()
    assert kserve.decode_raw(datatype, raw) == pytest.approx(values)


@pytest.mark.parametrize("datatype", ["INT32", "UINT64", "FP16", "FP64"])
def test_raw_data_must_hold_whole_values(datatype):
    with pytest.raises(BadRequest, match="whole number"):
        kserve.decode_raw(datatype, b"\x00")
    with pytest.raises(BadRequest, match="STRING"):
        kserve.decode_raw("STRING", b"")


def binary_body(prompts, extra_inputs=(), trailing=b""):
    raw = kserve.encode_bytes(prompts)
    header = {
        "inputs": [
            {
                "name": "text_input",
                "datatype": "BYTES",
                "shape": [len(prompts)],
                "parameters": {"binary_data_size": len(raw)},
            },
            *extra_inputs,
        ],
        "outputs": [{"name": "text_output", "parameters": {"binary_data": True}}],
    }
    head = json.dumps(header).encode()
    return head + raw + trailing, str(len(head))


def test_binary_request_body_is_split_and_decoded():
    body, length = binary_body(["one", "twö"])
    data, binary = kserve.split_binary(body, length)
    p = kserve_infer.plan(kserve.parse_infer(data, binary))
    assert p.prompts == ["one", "twö"] and p.outputs == [("text_output", True)]
    assert "binary_data_size" not in p.request.inputs[0].parameters


def test_binary_errors():
    body, length = binary_body(["one"], trailing=b"junk")
    with pytest.raises(BadRequest, match="belong to no input"):
        kserve.parse_infer(*kserve.split_binary(body, length))
    with pytest.raises(BadRequest, match="Inference-Header-Content-Length"):
        kserve.split_binary(body, str(len(body) + 1))
    with pytest.raises(BadRequest, match="Inference-Header-Content-Length"):
        kserve.split_binary(body, "abc")
    data, binary = kserve.split_binary(*binary_body(["one"]))
    with pytest.raises(BadRequest, match="runs past"):
        kserve.parse_infer(data, binary[:-1])
    with pytest.raises(BadRequest, match="not valid JSON"):
        kserve.split_binary(b"{", None)


# --- responses ---------------------------------------------------------------------------


def test_json_response_body():
    p = plan_of({"id": "7", "inputs": [text_input(["a", "b"])], "outputs": [{"name": "text_output"}]})
    body, length = kserve_infer.rest_body(p.response("tiny", ["x", "ÿ"]))
    assert length is None
    assert orjson.loads(body) == {
        "model_name": "tiny",
        "model_version": "1",
        "id": "7",
        "outputs": [{"name": "text_output", "datatype": "BYTES", "shape": [2], "data": ["x", "ÿ"]}],
    }


def test_binary_response_body():
    p = plan_of({"inputs": [text_input(["a", "b"])], "parameters": {"binary_data_output": True}})
    body, length = kserve_infer.rest_body(p.response("tiny", ["x", "ÿ"]))
    header = orjson.loads(body[:length])
    assert len(header["id"]) == 32  # the protocol always answers an id
    out = header["outputs"][0]
    raw = body[length:]
    assert out["parameters"] == {"binary_data_size": len(raw)} and "data" not in out
    assert [x.decode() for x in deserialize_bytes_tensor(raw)] == ["x", "ÿ"]
    assert struct.unpack_from("<I", raw)[0] == 1


def test_metadata_shapes():
    assert kserve.server_metadata("0.1.0") == {
        "name": "lmiserve",
        "version": "0.1.0",
        "extensions": ["generate", "binary_tensor_data"],
    }
    meta = kserve.model_metadata("tiny", True)
    assert meta["versions"] == ["1"] and meta["platform"]
    assert meta["inputs"] == [{"name": "text_input", "datatype": "BYTES", "shape": [-1]}]
    assert meta["outputs"] == [{"name": "text_output", "datatype": "BYTES", "shape": [-1]}]
    assert kserve.model_metadata("h", False)["inputs"] == []


# --- the generate extension --------------------------------------------------------------


def test_generate_body_parameters_inline_or_nested():
    prompt, params = kserve_generate.parse_generate(
        {"text_input": "Hi", "max_tokens": 4, "parameters": {"temperature": 0, "max_tokens": 9}, "stream": False}
    )
    assert prompt == "Hi" and params.max_tokens == 4 and not params.sampling


@pytest.mark.parametrize(
    "body,error,fragment",
    [
        ({}, BadRequest, "'text_input'"),
        ({"text_input": ["a"]}, BadRequest, "'text_input'"),
        ({"text_input": "a", "max_token": 3}, BadRequest, "unknown field 'max_token'"),
        ({"text_input": "a", "parameters": {"top_k": "x"}}, ValidationFailed, "parameters.top_k"),
        ([], BadRequest, "JSON object"),
    ],
)
def test_generate_errors(body, error, fragment):
    with pytest.raises(error, match=fragment):
        kserve_generate.parse_generate(body)


def _output(prompt, new, text, finished):
    seq = SequenceOutput(0, text=text, finish_reason="length" if finished else None)
    seq.new_tokens = [TokenOutput(i, t, None) for i, t in enumerate(new)]
    return RequestOutput("r", prompt, [1], [seq])


def test_generate_responder_stream_and_body():
    params = kserve.parameters({"return_full_text": True})
    r = kserve_generate.GenerateResponder("tiny", params, stream=True)
    assert r.media_type == "text/event-stream"
    first = r.chunk(0, _output("Hi", [" a"], " a", False))
    assert first == b'data: {"model_name":"tiny","model_version":"1","text_output":"Hi a"}\n\n'
    assert r.chunk(0, _output("Hi", [], " a", False)) == b""
    assert r.chunk(0, _output("Hi", [" b"], " a b", True)).startswith(b"data: ")
    assert r.end([]) == b""
    assert r.error_chunk("boom") == b'data: {"error":"boom"}\n\n'
    body = kserve_generate.GenerateResponder("tiny", kserve.parameters({}), stream=False).body(
        [_output("Hi", [], " a", True)]
    )
    assert orjson.loads(body) == {"model_name": "tiny", "model_version": "1", "text_output": " a"}
    assert r.error_body(NotFound("no model")) == (404, b'{"error":"no model"}')
    assert r.error_body(BadRequest("bad"))[0] == 400
