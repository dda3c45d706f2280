"""The management API: load a model directory at run time, predict, scale, unload."""

import shutil
import time
from pathlib import Path

import httpx
import pytest

from tests.server_process import ServerProcess

from .engine_server import Reference

HANDLERS = Path(__file__).parent / "handlers"
PROMPT = "What is Deep Learning?"


def handler_dir(root: Path, properties: str = "") -> Path:
    root.mkdir(parents=True)
    shutil.copy(HANDLERS / "echo_model.py", root / "model.py")
    (root / "serving.properties").write_text(properties)
    return root


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    base = handler_dir(tmp_path_factory.mktemp("mgmt") / "base", "model_name=base\n")
    # the tests load models from their own temporary directories
    with ServerProcess(base, env={"SERVING_MODEL_ROOTS": str(tmp_path_factory.getbasetemp())}) as s:
        yield s.wait_ready()


@pytest.fixture
def client(server):
    with httpx.Client(base_url=server.url, timeout=120) as c:
        yield c


def describe(client, name):
    r = client.get(f"/models/{name}")
    assert r.status_code == 200
    return r.json()[0]


def test_load_predict_scale_unload_handler_model(client, tmp_path):
    extra = handler_dir(tmp_path / "extra", "option.custom_option=from-file\n")
    r = client.post("/models", params={"url": str(extra), "model_name": "echo", "batch_size": "2"})
    assert r.status_code == 200 and r.json() == {"status": 'Model "echo" registered.'}
    assert {m["modelName"] for m in client.get("/models").json()["models"]} == {"base", "echo"}
    r = client.post("/predictions/echo", json={"x": 1})
    assert r.status_code == 200
    assert r.json()["body"] == {"x": 1} and r.json()["custom_option"] == "from-file"
    assert describe(client, "echo")["batchSize"] == 2

    r = client.put("/models/echo", params={"min_worker": 2, "max_worker": 3})
    assert r.status_code == 200
    assert r.json()["status"] == 'Model "echo" worker scaled. New Worker configuration min workers:2 max workers:3'
    info = describe(client, "echo")
    assert (info["minWorkers"], info["maxWorkers"]) == (2, 3) and len(info["workers"]) == 2
    pids = {client.post("/predictions/echo", json={"sleep": 0.3}).json()["pid"] for _ in range(2)}
    assert pids <= {w["pid"] for w in info["workers"]}

    r = client.put("/models/echo", params={"min_worker": 1, "max_worker": 1})
    assert r.status_code == 200
    assert len(describe(client, "echo")["workers"]) == 1
    assert client.post("/predictions/echo", json={"x": 2}).json()["body"] == {"x": 2}

    r = client.delete("/models/echo")
    assert r.status_code == 200 and r.json() == {"status": 'Model "echo" unregistered'}
    assert client.post("/predictions/echo", json={}).status_code == 404
    assert client.get("/models/echo").status_code == 404
    assert client.post("/predictions/base", json={"x": 3}).json()["body"] == {"x": 3}


def test_load_engine_model_generates_like_transformers(client, tiny_llama_dir, tmp_path):
    d = tmp_path / "tiny"
    d.mkdir()
    (d / "serving.properties").write_text(
        f"option.model_id={tiny_llama_dir}\noption.rolling_batch=lmi\noption.dtype=fp32\noption.max_model_len=128\n"
    )
    r = client.post("/models", params={"url": f"file://{d}", "model_name": "tiny"})
    assert r.status_code == 200
    r = client.post("/predictions/tiny", json={"inputs": PROMPT, "parameters": {"max_new_tokens": 6}})
    assert r.json() == {"generated_text": Reference(tiny_llama_dir).text(PROMPT, 6)}
    r = client.put("/models/tiny", params={"max_worker": 2})
    assert r.status_code == 400 and "engine" in r.json()["error"]
    assert client.delete("/models/tiny").status_code == 200
    assert client.post("/predictions/tiny", json={"inputs": PROMPT}).status_code == 404


def test_asynchronous_registration(client, tmp_path):
    d = handler_dir(tmp_path / "later")
    r = client.post("/models", params={"url": str(d), "model_name": "later", "synchronous": "false"})
    assert r.status_code == 202 and r.json() == {"status": 'Model "later" registration scheduled.'}
    deadline = time.monotonic() + 60
    while describe(client, "later")["status"] != "Healthy":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert client.post("/predictions/later", json={"y": 1}).json()["body"] == {"y": 1}
    assert client.delete("/models/later").status_code == 200


@pytest.mark.parametrize(
    ("method", "path", "params", "status"),
    [
        ("post", "/models", {}, 400),
        ("post", "/models", {"url": "/no/such/dir"}, 403),  # outside model_roots
        ("post", "/models", {"url": "HERE/no-such-dir"}, 400),
        ("post", "/models", {"url": "s3://bucket/model"}, 400),
        ("post", "/models", {"url": "HERE", "model_name": "base"}, 409),
        ("post", "/models", {"url": "HERE", "model_name": "bad name!"}, 400),
        ("post", "/models", {"url": "HERE", "batch_size": "zero"}, 400),
        ("put", "/models/base", {"min_worker": "3", "max_worker": "2"}, 400),
        ("put", "/models/base", {"min_worker": "x"}, 400),
        ("put", "/models/nope", {"min_worker": "1"}, 404),
        ("delete", "/models/nope", {}, 404),
    ],
)
def test_errors(client, server, method, path, params, status):
    params = {k: v.replace("HERE", str(server.model_dir)) for k, v in params.items()}
    r = client.request(method.upper(), path, params=params)
    assert r.status_code == status
    body = r.json()
    assert body["code"] == status and body["error"]
    assert client.post("/predictions/base", json={"ok": True}).status_code == 200


def test_failed_load_is_reported_and_forgotten(client, tmp_path):
    d = tmp_path / "broken"
    d.mkdir()
    (d / "model.py").write_text("raise RuntimeError('cannot import')\n")
    r = client.post("/models", params={"url": str(d), "model_name": "broken"})
    assert r.status_code == 500 and "broken" in r.json()["error"]
    assert "broken" not in {m["modelName"] for m in client.get("/models").json()["models"]}


def test_inference_component_header_and_json_registration(client, tmp_path):
    """SageMaker's JSON load body registers a model; X-Amzn-SageMaker-Inference-Component routes to
    the model it names, and a component the server does not have leaves the choice to the usual rules."""
    d = handler_dir(tmp_path / "component", "option.custom_option=from-component\n")
    r = client.post("/models", json={"model_name": "component", "url": str(d)})
    assert r.status_code == 200 and r.json() == {"status": 'Model "component" registered.'}
    for name, option in (("component", "from-component"), ("base", None)):
        r = client.post("/invocations", json={"x": name}, headers={"X-Amzn-SageMaker-Inference-Component": name})
        assert r.status_code == 200 and r.json()["body"] == {"x": name} and r.json()["custom_option"] == option
    r = client.post("/invocations", json={}, headers={"X-Amzn-SageMaker-Inference-Component": "other"})
    assert r.status_code == 400 and "several models are loaded" in r.json()["error"]
    assert client.delete("/models/component").status_code == 200
    r = client.post("/invocations", json={"x": 1}, headers={"X-Amzn-SageMaker-Inference-Component": "other"})
    assert r.status_code == 200 and r.json()["body"] == {"x": 1}  # the only model
