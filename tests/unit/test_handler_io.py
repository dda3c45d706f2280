import json

import pytest

from lmiserve.handlers.inputs import Input
from lmiserve.handlers.outputs import BatchMismatch, Output, fan_out, split_output


def test_input_properties_are_case_insensitive():
    inp = Input({"Content-Type": "application/json", "X-Foo": "1"}, [("data", b'{"a": 1}')])
    assert inp.get_property("content-type") == "application/json"
    assert inp.get_property("x-foo") == "1"
    assert inp.get_property("missing") is None
    assert inp.get_property("missing", "d") == "d"
    assert inp.get_properties()["X-Foo"] == "1"


def test_input_content_accessors():
    inp = Input({}, [("data", '{"inputs": "héllo"}'.encode())])
    assert inp.get_as_bytes() == '{"inputs": "héllo"}'.encode()
    assert inp.get_as_string() == '{"inputs": "héllo"}'
    assert inp.get_as_json() == {"inputs": "héllo"}
    assert inp.get_data() == inp.get_as_bytes()
    assert inp.contains_key("data") and not inp.contains_key("other")
    assert not inp.is_empty() and not inp.is_batch() and inp.get_batch_size() == 1
    assert inp.get_batches() == [inp]
    with pytest.raises(KeyError):
        inp.get_as_bytes("other")


def test_empty_input_and_batches():
    assert Input({"model_dir": "/m"}).is_empty()
    a, b = Input({}, [("data", b"1")]), Input({}, [("data", b"2")])
    batch = Input({"batch_size": "2"}, batch=[a, b])
    assert batch.is_batch() and batch.get_batch_size() == 2
    assert [x.get_as_json() for x in batch.get_batches()] == [1, 2]
    with pytest.raises(ValueError):
        batch.get_as_bytes()


def test_output_single_json():
    out = Output().add_as_json({"x": 1})
    (resp,) = split_output(out, 1)
    assert (resp.code, resp.message) == (200, "OK")
    assert json.loads(resp.body) == {"x": 1}
    assert resp.headers["Content-Type"] == "application/json"
    assert resp.stream is None


def test_output_text_bytes_and_properties():
    out = Output(201, "Created").add("héllo").add_property("X-Custom", "v")
    (resp,) = split_output(out, 1)
    assert resp.code == 201 and resp.message == "Created"
    assert resp.body == "héllo".encode()
    assert resp.headers == {"X-Custom": "v", "Content-Type": "text/plain; charset=utf-8"}
    out = Output().add(b"\x00\x01").add_property("Content-Type", "image/png")
    (resp,) = split_output(out, 1)
    assert resp.body == b"\x00\x01" and resp.headers["Content-Type"] == "image/png"


def test_output_error_body():
    out = Output().error("boom")
    (resp,) = split_output(out, 1)
    assert resp.code == 424
    assert json.loads(resp.body) == {"code": 424, "message": "invoke handler failure", "error": "boom"}
    out = Output().error("nope", code=400, message="Bad Request")
    (resp,) = split_output(out, 1)
    assert resp.code == 400 and json.loads(resp.body)["message"] == "Bad Request"


def test_batched_output_is_split_by_index_with_per_request_errors():
    out = Output()
    out.add_as_json({"i": 0}, batch_index=0)
    out.error("bad request 1", batch_index=1)
    out.add_as_json({"i": 2}, batch_index=2)
    r0, r1, r2 = split_output(out, 3)
    assert (r0.code, json.loads(r0.body)) == (200, {"i": 0})
    assert r1.code == 424 and json.loads(r1.body)["error"] == "bad request 1"
    assert (r2.code, json.loads(r2.body)) == (200, {"i": 2})


def test_whole_batch_error_reaches_every_request():
    out = Output().error("all failed")
    for resp in split_output(out, 2):
        assert resp.code == 424 and json.loads(resp.body)["error"] == "all failed"


def test_single_output_for_a_batch_is_a_mismatch():
    with pytest.raises(BatchMismatch):
        split_output(Output().add_as_json([1, 2]), 2)


def test_stream_default_formatting():
    out = Output().add_stream_content(iter(["a", b"b", {"c": 1}, None]))
    (resp,) = split_output(out, 1)
    assert resp.headers["Content-Type"] == "application/jsonlines"
    assert list(resp.stream) == [b"a", b"b", b'{"c": 1}\n']


def test_stream_custom_formatter_and_content_type():
    out = Output().add_stream_content(iter([1, 2]), output_formatter=lambda x: f"data: {x}\n\n")
    out.add_property("Content-Type", "text/event-stream")
    (resp,) = split_output(out, 1)
    assert resp.headers["Content-Type"] == "text/event-stream"
    assert list(resp.stream) == [b"data: 1\n\n", b"data: 2\n\n"]


def test_batched_stream_without_index_is_fanned_out():
    steps = [["a0", "b0"], [None, "b1"], ["a2", None]]
    out = Output().add_stream_content(iter(steps))
    r0, r1 = split_output(out, 2)
    # consumed round-robin, as the worker does
    got0, got1 = [], []
    streams = [(r0.stream, got0), (r1.stream, got1)]
    active = list(streams)
    while active:
        for entry in list(active):
            try:
                entry[1].append(next(entry[0]))
            except StopIteration:
                active.remove(entry)
    assert got0 == [b"a0", b"a2"]
    assert got1 == [b"b0", b"b1"]


def test_fan_out_propagates_errors_to_every_view():
    def source():
        yield ["x", "y"]
        raise RuntimeError("generation failed")

    v0, v1 = fan_out(source(), 2)
    assert next(v0) == "x"
    with pytest.raises(RuntimeError):
        next(v0)
    assert next(v1) == "y"
    with pytest.raises(RuntimeError):
        next(v1)


def test_fan_out_rejects_wrong_step_shape():
    (v,) = fan_out(iter(["not a list"]), 1)
    with pytest.raises(BatchMismatch):
        next(v)
