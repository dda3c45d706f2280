"""SageMaker-style handlers (model_fn, input_fn, predict_fn, output_fn) served over HTTP."""

import concurrent.futures
import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.server_process import ServerProcess

HANDLERS = Path(__file__).parent / "handlers"


def model_dir(root: Path, handler: str, filename: str, properties: str) -> Path:
    d = root / "model"
    (d / filename).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(HANDLERS / handler, d / filename)
    (d / "serving.properties").write_text(properties)
    return d


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = model_dir(
        tmp_path_factory.mktemp("sagemaker"),
        "sagemaker_model.py",
        "model.py",
        "batch_size=4\nmax_batch_delay=2000\nmaxWorkers=1\n",
    )
    (d / "factor.txt").write_text("2.5")
    with ServerProcess(d) as s:
        yield s.wait_ready()


@pytest.fixture(scope="module")
def inference_server(tmp_path_factory):
    d = model_dir(tmp_path_factory.mktemp("inference"), "sagemaker_torch_inference.py", "inference.py", "")
    with ServerProcess(d) as s:
        yield s.wait_ready()


def test_json_in_json_out(server):
    with server.client() as c:
        r = c.post("/invocations", json={"instances": [[1, 2], [3, 4]]}, headers={"Accept": "application/json"})
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    assert r.json()["outputs"] == [[2.5, 5.0], [7.5, 10.0]]  # the factor model_fn read from model_dir


def test_csv_in_csv_out(server):
    with server.client() as c:
        r = c.post("/invocations", content="1,2\n3,4\n", headers={"Content-Type": "text/csv", "Accept": "text/csv"})
    assert r.status_code == 200
    assert r.headers["content-type"] == "text/csv"
    assert r.text == "2.5,5.0\n7.5,10.0\n"


def test_accept_header_picks_the_encoding(server):
    with server.client() as c:
        r = c.post("/invocations", content="1\n", headers={"Content-Type": "text/csv", "Accept": "application/json"})
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    assert r.json()["outputs"] == [[2.5]]


def test_a_failing_request_fails_alone_in_its_batch(server):
    bodies = [{"instances": [[1]]}, {"fail": True}, {"instances": [[2]]}, {"instances": [[3]]}]

    def post(body):
        with server.client() as c:
            return c.post("/invocations", json=body)

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        responses = list(pool.map(post, bodies))
    assert [r.status_code for r in responses] == [200, 500, 200, 200]
    assert "asked to fail" in responses[1].json()["error"]
    assert [r.json()["outputs"] for r in responses if r.status_code == 200] == [[[2.5]], [[5.0]], [[7.5]]]
    with server.client() as c:  # the worker is still serving
        assert c.post("/invocations", json={"instances": [[4]]}).json()["outputs"] == [[10.0]]


def test_inference_py_with_default_json(inference_server):
    with inference_server.client() as c:
        r = c.post("/invocations", json=[[1, 2, 3], [0, 1, 0]])
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    assert r.json() == [[1.0, 6.0], [0.0, 1.0]]


def test_inference_py_with_default_csv_and_npy(inference_server):
    with inference_server.client() as c:
        r = c.post("/invocations", content="1,2,3\n", headers={"Content-Type": "text/csv", "Accept": "text/csv"})
        assert r.status_code == 200 and r.headers["content-type"] == "text/csv"
        assert [float(x) for x in r.text.strip().split(",")] == [1.0, 6.0]
        buf = io.BytesIO()
        np.save(buf, np.array([[2.0, 2.0, 2.0]], dtype=np.float32))
        r = c.post(
            "/invocations",
            content=buf.getvalue(),
            headers={"Content-Type": "application/x-npy", "Accept": "application/x-npy"},
        )
    assert r.status_code == 200 and r.headers["content-type"] == "application/x-npy"
    assert np.load(io.BytesIO(r.content)).tolist() == [[2.0, 6.0]]


def test_inference_py_refuses_unsupported_types_with_415(inference_server):
    with inference_server.client() as c:
        r = c.post("/invocations", content=b"abc", headers={"Content-Type": "image/png"})
        assert r.status_code == 415 and "image/png" in r.json()["error"]
        r = c.post("/invocations", json=[[1, 2, 3]], headers={"Accept": "application/xml"})
        assert r.status_code == 415 and "application/xml" in r.json()["error"]
        r = c.post("/invocations", json=[[1, 2]])  # wrong shape for the model: a 500 for this request
        assert r.status_code == 500
        assert json.loads(c.post("/invocations", json=[[0, 0, 1]]).content) == [[0.0, 1.0]]
