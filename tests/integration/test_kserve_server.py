"""KServe V2 over REST and gRPC with Triton's own client (tritonclient), and the generate
extension over raw HTTP."""

import json
import socket

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from .engine_server import Reference, start

PROMPTS = ["What is Deep Learning?", "The quick brown fox"]
N = 8
GREEDY = {"max_tokens": N, "temperature": 0.0}


@pytest.fixture(scope="module")
def reference(tiny_llama_dir):
    return Reference(tiny_llama_dir)


@pytest.fixture(scope="module")
def server(engine_server):
    return engine_server


@pytest.fixture(scope="module")
def http_client(server):
    return httpclient.InferenceServerClient(server.http_address, network_timeout=120)


@pytest.fixture(scope="module")
def grpc_client(server):
    return grpcclient.InferenceServerClient(server.grpc_address)


def texts(array) -> list[str]:
    return [x.decode() if isinstance(x, bytes) else x for x in array.reshape(-1)]


def prompts_input(module, prompts=PROMPTS, binary: bool | None = None):
    tensor = module.InferInput("text_input", [len(prompts)], "BYTES")
    data = np.array(prompts, dtype=np.object_)
    if binary is None:
        tensor.set_data_from_numpy(data)
    else:
        tensor.set_data_from_numpy(data, binary_data=binary)
    return tensor


# --- health and metadata -----------------------------------------------------------------


@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_health_and_metadata(kind, http_client, grpc_client):
    client = http_client if kind == "http" else grpc_client
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("tiny") and client.is_model_ready("tiny", "1")
    json_kw = {"as_json": True} if kind == "grpc" else {}
    server_meta = client.get_server_metadata(**json_kw)
    model_meta = client.get_model_metadata("tiny", **json_kw)
    for t in model_meta["inputs"] + model_meta["outputs"]:
        t["shape"] = [int(d) for d in t["shape"]]  # int64 values are strings in protobuf's JSON
    assert server_meta["name"] == "lmiserve" and "generate" in server_meta["extensions"]
    assert model_meta["name"] == "tiny" and model_meta["versions"] == ["1"]
    assert model_meta["platform"] == "pytorch_torchscript"  # one of the names the protocol allows
    assert model_meta["inputs"] == [{"name": "text_input", "datatype": "BYTES", "shape": [-1]}]
    assert model_meta["outputs"] == [{"name": "text_output", "datatype": "BYTES", "shape": [-1]}]


def test_rest_health_bodies(server):
    with server.client() as c:
        assert c.get("/v2/health/live").json() == {"live": True}
        assert c.get("/v2/health/ready").json() == {"ready": True}
        assert c.get("/v2/models/tiny/versions/1/ready").json() == {"name": "tiny", "ready": True}
        r = c.get("/v2/models/tiny/versions/2/ready")
        assert r.status_code == 404 and "version" in r.json()["error"]
        r = c.get("/v2/models/nope")
        assert r.status_code == 404 and set(r.json()) == {"error"}


# --- inference ---------------------------------------------------------------------------


@pytest.mark.parametrize("binary", [True, False])
def test_http_infer_matches_transformers(binary, http_client, reference):
    outputs = [httpclient.InferRequestedOutput("text_output", binary_data=binary)]
    result = http_client.infer(
        "tiny", [prompts_input(httpclient, binary=binary)], outputs=outputs, request_id="req-7", parameters=GREEDY
    )
    response = result.get_response()
    assert response["id"] == "req-7" and response["model_name"] == "tiny" and response["model_version"] == "1"
    output = response["outputs"][0]
    assert output["shape"] == [2] and output["datatype"] == "BYTES"
    assert ("binary_data_size" in output.get("parameters", {})) is binary
    assert texts(result.as_numpy("text_output")) == [reference.text(p, N) for p in PROMPTS]


def test_http_infer_without_outputs_answers_binary(http_client, reference):
    result = http_client.infer("tiny", [prompts_input(httpclient)], model_version="1", parameters=GREEDY)
    assert "binary_data_size" in result.get_response()["outputs"][0]["parameters"]
    assert texts(result.as_numpy("text_output")) == [reference.text(p, N) for p in PROMPTS]


def test_grpc_infer_raw_contents(grpc_client, reference):
    params = {"max_tokens": N, "do_sample": False}
    result = grpc_client.infer("tiny", [prompts_input(grpcclient)], request_id="g-1", parameters=params)
    response = result.get_response()
    assert response.id == "g-1" and response.model_name == "tiny" and len(response.raw_output_contents) == 1
    assert list(response.outputs[0].shape) == [2]
    assert texts(result.as_numpy("text_output")) == [reference.text(p, N) for p in PROMPTS]


def _typed_request(**overrides):
    request = service_pb2.ModelInferRequest(model_name="tiny", id="typed")
    tensor = request.inputs.add(name="text_input", datatype="BYTES", shape=[1])
    tensor.contents.bytes_contents.append(PROMPTS[0].encode())
    request.parameters["max_new_tokens"].int64_param = N
    request.parameters["temperature"].double_param = 0.0
    for key, value in overrides.items():
        setattr(request, key, value)
    return request


def test_grpc_infer_typed_contents(server, reference):
    with grpc.insecure_channel(server.grpc_address) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        response = stub.ModelInfer(_typed_request(), timeout=120)
    assert response.id == "typed" and not response.raw_output_contents
    assert [b.decode() for b in response.outputs[0].contents.bytes_contents] == [reference.text(PROMPTS[0], N)]


def _http_error(call) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        call()
    return info.value


def test_http_errors_then_the_server_still_answers(server, http_client, reference):
    wrong = httpclient.InferInput("text_input", [1], "INT32")
    wrong.set_data_from_numpy(np.array([1], dtype=np.int32), binary_data=False)
    err = _http_error(lambda: http_client.infer("tiny", [wrong]))
    assert err.status() == "400" and "BYTES" in err.message()
    other = httpclient.InferInput("prompt", [1], "BYTES")
    other.set_data_from_numpy(np.array(["hi"], dtype=np.object_), binary_data=False)
    assert _http_error(lambda: http_client.infer("tiny", [other])).status() == "400"
    assert _http_error(lambda: http_client.infer("nope", [prompts_input(httpclient)])).status() == "404"
    err = _http_error(lambda: http_client.infer("tiny", [prompts_input(httpclient)], parameters={"temperature": -1}))
    assert err.status() == "400" and "temperature" in err.message()
    err = _http_error(lambda: http_client.infer("tiny", [prompts_input(httpclient)], parameters={"n": 3}))
    assert err.status() == "400" and "parameters.n: not applied" in err.message()

    with server.client() as c:
        body = {"inputs": [{"name": "text_input", "datatype": "FP32", "shape": [1], "data": [1.0]}]}
        r = c.post("/v2/models/tiny/infer", json=body)
        assert r.status_code == 400 and set(r.json()) == {"error"}
        r = c.post("/v2/models/tiny/infer", content=b"{not json")
        assert r.status_code == 400 and "JSON" in r.json()["error"]
        r = c.post("/v2/models/tiny/versions/3/infer", json={"inputs": []})
        assert r.status_code == 404 and set(r.json()) == {"error"}

    result = http_client.infer("tiny", [prompts_input(httpclient)], parameters=GREEDY)
    assert texts(result.as_numpy("text_output")) == [reference.text(p, N) for p in PROMPTS]


def _grpc_error(call) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        call()
    return info.value


def test_grpc_errors_then_the_server_still_answers(server, grpc_client, reference):
    wrong = grpcclient.InferInput("text_input", [1], "INT32")
    wrong.set_data_from_numpy(np.array([1], dtype=np.int32))
    err = _grpc_error(lambda: grpc_client.infer("tiny", [wrong]))
    assert err.status() == "StatusCode.INVALID_ARGUMENT" and "BYTES" in err.message()
    other = grpcclient.InferInput("prompt", [1], "BYTES")
    other.set_data_from_numpy(np.array(["hi"], dtype=np.object_))
    err = _grpc_error(lambda: grpc_client.infer("tiny", [other]))
    assert err.status() == "StatusCode.INVALID_ARGUMENT" and "text_input" in err.message()
    err = _grpc_error(lambda: grpc_client.infer("tiny", [prompts_input(grpcclient)], parameters={"top_p": 2.0}))
    assert err.status() == "StatusCode.INVALID_ARGUMENT" and "top_p" in err.message()
    err = _grpc_error(lambda: grpc_client.infer("nope", [prompts_input(grpcclient)]))
    assert err.status() == "StatusCode.NOT_FOUND"
    for unapplied in ({"n": 2}, {"logprobs": 1}, {"details": True}, {"best_of": 2}):  # never ignored
        err = _grpc_error(lambda u=unapplied: grpc_client.infer("tiny", [prompts_input(grpcclient)], parameters=u))
        assert err.status() == "StatusCode.INVALID_ARGUMENT" and f"parameters.{next(iter(unapplied))}" in err.message()
    assert _grpc_error(lambda: grpc_client.is_model_ready("nope")).status() == "StatusCode.NOT_FOUND"
    with grpc.insecure_channel(server.grpc_address) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(_typed_request(model_version="9"), timeout=60)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND

    result = grpc_client.infer("tiny", [prompts_input(grpcclient)], parameters=GREEDY)
    assert texts(result.as_numpy("text_output")) == [reference.text(p, N) for p in PROMPTS]


# --- the generate extension --------------------------------------------------------------


def test_generate(server, reference):
    body = {"text_input": PROMPTS[0], "parameters": {"max_tokens": 6, "temperature": 0}}
    r = httpx.post(server.url + "/v2/models/tiny/generate", json=body, timeout=120)
    assert r.status_code == 200
    assert r.json() == {"model_name": "tiny", "model_version": "1", "text_output": reference.text(PROMPTS[0], 6)}
    full = httpx.post(
        server.url + "/v2/models/tiny/versions/1/generate",
        json={"text_input": PROMPTS[0], "max_tokens": 6, "return_full_text": True},
        timeout=120,
    ).json()
    assert full["text_output"] == PROMPTS[0] + reference.text(PROMPTS[0], 6)


def test_generate_stream(server, reference):
    body = {"text_input": PROMPTS[1], "parameters": {"max_tokens": 6, "do_sample": False}}
    r = httpx.post(server.url + "/v2/models/tiny/generate_stream", json=body, timeout=120)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = [json.loads(e.removeprefix("data: ")) for e in r.text.split("\n\n") if e.strip()]
    assert events and all(set(e) == {"model_name", "model_version", "text_output"} for e in events)
    assert all(e["model_name"] == "tiny" and e["model_version"] == "1" for e in events)
    assert "".join(e["text_output"] for e in events) == reference.text(PROMPTS[1], 6)


@pytest.mark.parametrize(
    "path,body,status,fragment",
    [
        ("/v2/models/tiny/generate", {"parameters": {}}, 400, "text_input"),
        ("/v2/models/tiny/generate", {"text_input": "hi", "max_token": 3}, 400, "max_token"),
        (
            "/v2/models/tiny/generate_stream",
            {"text_input": "hi", "parameters": {"temperature": -2}},
            400,
            "temperature",
        ),
        ("/v2/models/nope/generate", {"text_input": "hi"}, 404, "nope"),
    ],
)
def test_generate_errors(server, path, body, status, fragment):
    r = httpx.post(server.url + path, json=body, timeout=60)
    assert r.status_code == status
    assert set(r.json()) == {"error"} and fragment in r.json()["error"]


def test_http_infer_with_a_gzip_body(http_client, reference):
    result = http_client.infer(
        "tiny", [prompts_input(httpclient)], parameters=GREEDY, request_compression_algorithm="gzip"
    )
    assert texts(result.as_numpy("text_output")) == [reference.text(p, N) for p in PROMPTS]


def test_a_configured_grpc_port_that_is_taken_stops_start_up(tiny_llama_dir, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with start(tmp_path / "m", tiny_llama_dir, env={"SERVING_GRPC_PORT": str(port)}) as s:
            assert s.wait_exit(120) != 0
            assert f"cannot serve gRPC on 127.0.0.1:{port}" in s.log()


def test_invocations_takes_a_v2_inference_body(server, reference):
    body = {
        "id": "sm-1",
        "inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": [PROMPTS[0]]}],
        "parameters": GREEDY,
    }
    r = httpx.post(server.url + "/invocations", json=body, timeout=120)
    assert r.status_code == 200
    out = r.json()
    assert out["id"] == "sm-1" and out["model_name"] == "tiny"
    assert out["outputs"][0]["data"] == [reference.text(PROMPTS[0], N)]
    bad = {"inputs": [{"name": "text_input", "datatype": "FP32", "shape": [1], "data": [1.0]}]}
    r = httpx.post(server.url + "/invocations", json=bad, timeout=60)
    assert r.status_code == 400 and set(r.json()) == {"error"}


def test_infer_over_both_transports_is_counted_in_metrics(server, http_client, grpc_client):
    from prometheus_client.parser import text_string_to_metric_families

    def e2e_count():
        text = httpx.get(server.url + "/metrics", timeout=30).text
        family = next(
            f for f in text_string_to_metric_families(text) if f.name == "lmiserve_e2e_request_latency_seconds"
        )
        return next(s.value for s in family.samples if s.name.endswith("_count") and s.labels.get("model") == "tiny")

    before = e2e_count()
    outputs = [httpclient.InferRequestedOutput("text_output")]
    http_client.infer("tiny", [prompts_input(httpclient, PROMPTS[:1])], outputs=outputs, parameters=GREEDY)
    grpc_client.infer("tiny", [prompts_input(grpcclient, PROMPTS[:1])], parameters=GREEDY)
    assert e2e_count() == before + 2
