"""A user's model.py served by the real server over HTTP."""

import concurrent.futures
import os
import shutil
import signal
import time
from pathlib import Path

import httpx
import pytest

from tests.server_process import ServerProcess, free_port

pytestmark = pytest.mark.serial

HANDLERS = Path(__file__).parent / "handlers"


def model_dir(tmp_path: Path, handler: str, properties: str = "") -> Path:
    d = tmp_path / "model"
    d.mkdir()
    shutil.copy(HANDLERS / handler, d / "model.py")
    (d / "serving.properties").write_text(properties)
    return d


@pytest.fixture(scope="module")
def echo_server(tmp_path_factory):
    d = model_dir(
        tmp_path_factory.mktemp("echo"),
        "echo_model.py",
        "batch_size=4\nmax_batch_delay=300\njob_queue_size=50\noption.custom_option=hello\npredict_timeout=4\n",
    )
    with ServerProcess(d, env={"SAGEMAKER_MAX_PAYLOAD_IN_MB": "1"}) as server:
        yield server.wait_ready()


def test_ping_maps_model_to_state(echo_server):
    r = httpx.get(echo_server.url + "/ping")
    assert r.status_code == 200
    assert r.json() == {"model": "Healthy"}


def test_invocations_reach_the_handler_with_properties(echo_server):
    with echo_server.client() as c:
        r = c.post(
            "/invocations",
            json={"a": 1},
            headers={
                "X-Amzn-SageMaker-Custom-Attributes": "greeting=hi;x=1",
                "X-Amzn-SageMaker-Inference-Id": "req-42",
            },
        )
    assert r.status_code == 200
    assert r.headers["x-request-id"] == "req-42"
    body = r.json()
    assert body["body"] == {"a": 1}
    assert body["greeting"] == "hi"
    assert body["content_type"] == "application/json"
    assert body["custom_option"] == "hello"  # option.custom_option reached the init call


def test_request_id_is_generated_or_taken_from_x_request_id(echo_server):
    with echo_server.client() as c:
        r1 = c.post("/invocations", json={})
        r2 = c.post("/invocations", json={}, headers={"X-Request-Id": "mine"})
        r3 = c.get("/ping")
    assert len(r1.headers["x-request-id"]) == 32
    assert r2.headers["x-request-id"] == "mine"
    assert "x-request-id" in r3.headers


def test_predictions_route_by_name_and_version(echo_server):
    with echo_server.client() as c:
        assert c.post("/predictions/model", json={"v": 1}).json()["body"] == {"v": 1}
        assert c.post("/predictions/model/1", json={"v": 2}).json()["body"] == {"v": 2}
        assert c.post("/invocations?model_name=model", json={"v": 3}).json()["body"] == {"v": 3}
        r = c.post("/predictions/other", json={})
    assert r.status_code == 404
    assert r.json()["code"] == 404 and "other" in r.json()["error"]


def test_concurrent_requests_are_batched(echo_server):
    def call(i):
        with echo_server.client() as c:
            return c.post("/invocations", json={"i": i}).json()

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(call, range(8)))
    assert sorted(r["body"]["i"] for r in results) == list(range(8))  # each caller got its own answer
    assert max(r["batch_size"] for r in results) > 1
    assert all(r["batch_size"] <= 4 for r in results)
    assert any(r["is_batch"] for r in results)


def test_streaming_handler_output(echo_server):
    with echo_server.client() as c:
        r = c.post("/invocations", json={"stream": 3})
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/jsonlines"
    assert r.text == '{"n": 0}\n{"n": 1}\n{"n": 2}\n'


def test_bad_json_is_400(echo_server):
    with echo_server.client() as c:
        r = c.post("/invocations", content=b'{"inputs": ', headers={"Content-Type": "application/json"})
    assert r.status_code == 400
    body = r.json()
    assert body["code"] == 400 and body["error"].startswith("request body is not valid JSON")


def test_oversize_body_is_413(echo_server):
    big = b'{"x": "' + b"a" * (1024 * 1024 + 10) + b'"}'
    with echo_server.client() as c:
        r = c.post("/invocations", content=big, headers={"Content-Type": "application/json"})
        assert r.status_code == 413
        assert r.json()["code"] == 413

        def chunks():  # no Content-Length: the limit applies while reading
            for _ in range(20):
                yield b"a" * 100_000

        r = c.post("/invocations", content=chunks(), headers={"Content-Type": "application/octet-stream"})
        assert r.status_code == 413
        assert "exceeds max_request_size" in r.json()["error"]


def test_handler_exception_is_424_and_worker_survives(echo_server):
    with echo_server.client() as c:
        pid = c.post("/invocations", json={}).json()["pid"]
        r = c.post("/invocations", json={"raise": "no way"})
        assert r.status_code == 424
        assert r.json() == {"code": 424, "message": "invoke handler failure", "error": "ValueError: no way"}
        assert c.post("/invocations", json={}).json()["pid"] == pid


def test_predict_timeout_answers_504_and_restarts_the_worker(echo_server):
    with echo_server.client() as c:
        pid = c.post("/invocations", json={}).json()["pid"]
        started = time.monotonic()
        r = c.post("/invocations", json={"sleep": 30})
        assert r.status_code == 504
        assert time.monotonic() - started < 15
        assert "predict_timeout" in r.json()["error"]
        r = c.post("/invocations", json={"after": "timeout"})
        assert r.status_code == 200 and r.json()["pid"] != pid


def test_killed_worker_fails_its_request_and_the_next_one_succeeds(echo_server):
    with echo_server.client() as c:
        pid = c.post("/invocations", json={}).json()["pid"]
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            slow = pool.submit(c.post, "/invocations", json={"sleep": 3})
            time.sleep(0.8)
            os.kill(pid, signal.SIGKILL)
            r = slow.result(timeout=10)
        assert 500 <= r.status_code < 600
        assert r.json()["code"] == r.status_code and "exited" in r.json()["error"]
        r = c.post("/invocations", json={"after": "kill"})
        assert r.status_code == 200 and r.json()["pid"] != pid


def test_full_queue_is_503(tmp_path):
    d = model_dir(tmp_path, "echo_model.py", "job_queue_size=1\n")
    with ServerProcess(d) as server:
        server.wait_ready()

        def call(_):
            with server.client() as c:
                return c.post("/invocations", json={"sleep": 1.5})

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            codes = sorted(r.status_code for r in pool.map(call, range(4)))
    assert codes.count(200) >= 2 and 503 in codes


def test_raising_handler_body(tmp_path):
    with ServerProcess(model_dir(tmp_path, "raising_model.py")) as server:
        server.wait_ready()
        with server.client() as c:
            r = c.post("/invocations", json={"inputs": "x"})
    assert r.status_code == 424
    assert r.json() == {"code": 424, "message": "invoke handler failure", "error": "RuntimeError: the model refuses"}


def test_kserve_v2_infer_reaches_a_users_handler(tmp_path):
    """KServe V2 inference on a model.py: the handler gets the V2 request and its tensors come
    back as the V2 response, with the request's id (or a new one)."""
    d = model_dir(tmp_path, "v2_model.py")
    request = {
        "id": "42",
        "inputs": [{"name": "input0", "shape": [2, 2], "datatype": "FP32", "data": [1, 2, 3, 4]}],
        "outputs": [{"name": "output0"}],
    }
    grpc_port = free_port()
    with ServerProcess(d, env={"SERVING_GRPC_PORT": str(grpc_port)}) as server:
        server.wait_ready()
        _grpc_infer_reaches_the_handler(f"127.0.0.1:{grpc_port}")
        with server.client() as c:
            r = c.post("/v2/models/model/infer", json=request)
            assert r.status_code == 200, r.text
            assert r.json() == {
                "model_name": "model",
                "model_version": "1",
                "id": "42",
                "outputs": [{"name": "output0", "datatype": "FP32", "shape": [2, 2], "data": [2, 4, 6, 8]}],
            }
            r = c.post("/v2/models/model/infer", json={k: v for k, v in request.items() if k != "id"})
            assert r.status_code == 200 and len(r.json()["id"]) == 32
            r = c.post("/v2/models/model/infer", json={"inputs": "nope"})
            assert r.status_code == 400 and set(r.json()) == {"error"}


def _grpc_infer_reaches_the_handler(address: str) -> None:
    """The same over gRPC with Triton's client (raw tensor contents in and out)."""
    import numpy as np
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(address)
    tensor = grpcclient.InferInput("input0", [2, 2], "FP32")
    tensor.set_data_from_numpy(np.array([[1, 2], [3, 4]], dtype=np.float32))
    result = client.infer("model", [tensor], request_id="7", outputs=[grpcclient.InferRequestedOutput("output0")])
    response = result.get_response()
    assert (response.model_name, response.model_version, response.id) == ("model", "1", "7")
    assert result.as_numpy("output0").tolist() == [[2.0, 4.0], [6.0, 8.0]]
