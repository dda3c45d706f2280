"""Multi-model mode (a SageMaker multi-model endpoint) through the real server on 127.0.0.1.

Three tiny random models, a handler that answers when told to, and SmolLM2 under one model root;
a budget that holds two tiny models, or SmolLM2 alone. Greedy outputs are checked against
transformers generate on the same weights.
"""

import os
import re
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from lmiserve.model_store import DEFAULT_MODEL_ID
from tests.server_process import ServerProcess
from tests.tiny_models import build_model

from .engine_server import Reference

pytestmark = pytest.mark.serial

HANDLERS = Path(__file__).parent / "handlers"
PROMPT = "What is Deep Learning?"
TOKENS = 6
TINY = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}
ENGINE = "option.rolling_batch=lmi\noption.dtype=fp32\noption.max_model_len=256\n"
BODY = {"inputs": PROMPT, "parameters": {"max_new_tokens": TOKENS, "do_sample": False}}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    for name, arch in TINY.items():
        # qwen2 in SageMaker's layout (ROOT/NAME/model), the others as plain directories
        directory = root / name / "model" if name == "qwen2" else root / name
        build_model(directory, arch=arch, seed=len(name))
        (directory / "serving.properties").write_text(ENGINE + "required_memory_mb=100\n")
    smol = root / "smollm2"
    smol.mkdir()
    (smol / "serving.properties").write_text(
        f"option.model_id={DEFAULT_MODEL_ID}\noption.rolling_batch=lmi\noption.max_model_len=256\nrequired_memory_mb=250\n"
    )
    (root / "slow").mkdir()
    shutil.copy(HANDLERS / "gate_model.py", root / "slow" / "model.py")
    (root / "slow" / "serving.properties").write_text("required_memory_mb=100\n")
    (root / "broken").mkdir()
    (root / "broken" / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    return root


@pytest.fixture(scope="module")
def references(root):
    return {
        "llama": Reference(root / "llama").text(PROMPT, TOKENS),
        "qwen2": Reference(root / "qwen2" / "model").text(PROMPT, TOKENS),
        "qwen3": Reference(root / "qwen3").text(PROMPT, TOKENS),
    }


@pytest.fixture(scope="module")
def server(root, tmp_path_factory):
    env = {
        "SAGEMAKER_MULTI_MODEL": "true",
        "SERVING_MULTI_MODEL_ROOT": str(root),
        "SERVING_MULTI_MODEL_MEMORY_MB": "250",
        "HF_HUB_OFFLINE": "1",
    }
    home = tmp_path_factory.mktemp("home")
    with ServerProcess(home, env=env, args=["--grpc-port", "0"]) as s:
        yield s.wait_ready()


@pytest.fixture
def client(server):
    """The tests run in order on one server, each from the models the one before left loaded."""
    with httpx.Client(base_url=server.url, timeout=300) as c:
        yield c


def generate(client, name, path="/invocations"):
    r = client.post(path, json=BODY, headers={"X-Amzn-SageMaker-Target-Model": name} if path == "/invocations" else {})
    assert r.status_code == 200, r.text
    return r.json()["generated_text"]


def loaded(client):
    return sorted(m["modelName"] for m in client.get("/models").json()["models"])


def metric(client, name, **labels):
    text = client.get("/metrics").text
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        m = re.match(rf"^{name}(?:\{{(.*)\}})? (\S+)$", line)
        if m and ",".join(sorted((m.group(1) or "").split(","))).strip(",") == want:
            return float(m.group(2))
    return 0.0


def test_each_model_answers_by_target_model(client, references):
    assert client.get("/ping").status_code == 200  # ready with nothing loaded
    assert generate(client, "llama") == references["llama"]
    assert generate(client, "qwen2.tar.gz") == references["qwen2"]  # a target-model name of an archive
    assert loaded(client) == ["llama", "qwen2"]
    # /predictions/{name} and the inference-component header reach the same models
    assert client.post("/predictions/llama", json=BODY).json()["generated_text"] == references["llama"]
    headers = {"X-Amzn-SageMaker-Inference-Component": "qwen2"}
    assert client.post("/invocations", json=BODY, headers=headers).json()["generated_text"] == references["qwen2"]


def test_missing_and_unnamed_models(client):
    r = client.post("/invocations", json=BODY, headers={"X-Amzn-SageMaker-Target-Model": "nope.tar.gz"})
    assert r.status_code == 404
    assert "model 'nope.tar.gz' is not under" in r.json()["error"] and "llama" in r.json()["error"]
    assert (
        client.post("/invocations", json=BODY, headers={"X-Amzn-SageMaker-Target-Model": "../llama"}).status_code == 404
    )
    r = client.post("/invocations", json=BODY)  # no model named, two loaded
    assert r.status_code == 400 and "name one with the X-Amzn-SageMaker-Target-Model header" in r.json()["error"]
    r = client.post("/invocations", json=BODY, headers={"X-Amzn-SageMaker-Target-Model": "broken"})
    assert r.status_code == 424 and "failed to load" in r.json()["error"]
    assert loaded(client) == ["llama", "qwen2"]
    assert metric(client, "lmiserve_model_loads_total", model="broken", outcome="failed") == 1


def test_sagemaker_load_list_get_invoke_unload(client, root, references):
    url = str(root / "qwen3")
    r = client.post("/models", json={"model_name": "q3", "url": url})  # llama, least recently used, goes
    assert r.status_code == 200 and r.json() == {"status": 'Model "q3" registered.'}
    assert client.post("/models", json={"model_name": "q3", "url": url}).status_code == 409
    assert loaded(client) == ["q3", "qwen2"]
    assert {"modelName": "q3", "modelUrl": url, "status": "Healthy"} in client.get("/models").json()["models"]
    assert client.get("/models/q3").json() == {"modelName": "q3", "modelUrl": url}
    assert client.get("/models/llama").status_code == 404
    r = client.post("/models/q3/invoke", json=BODY, headers={"X-Amzn-SageMaker-Target-Model": "qwen3.tar.gz"})
    assert r.status_code == 200 and r.json()["generated_text"] == references["qwen3"]
    assert client.post("/models/llama/invoke", json=BODY).status_code == 404  # not loaded: no load on invoke
    assert client.delete("/models/q3").status_code == 200
    assert client.delete("/models/q3").status_code == 404
    assert client.post("/models/q3/invoke", json=BODY).status_code == 404
    assert loaded(client) == ["qwen2"]
    # a load outside the model roots, and a body without a url
    assert client.post("/models", json={"model_name": "x", "url": "/etc"}).status_code == 403
    assert client.post("/models", json={"model_name": "x"}).status_code == 400


def test_lru_unload_and_reload(client, references):
    assert generate(client, "llama") == references["llama"]
    assert generate(client, "qwen2") == references["qwen2"]  # llama is now the least recently used
    assert generate(client, "qwen3") == references["qwen3"]
    assert loaded(client) == ["qwen2", "qwen3"]
    assert metric(client, "lmiserve_model_unloads_total", model="llama", reason="lru") == 2
    assert generate(client, "llama") == references["llama"]  # loaded again, same answer
    assert loaded(client) == ["llama", "qwen3"]
    assert metric(client, "lmiserve_model_memory_bytes", model="llama") == 100 * 1024 * 1024
    assert metric(client, "lmiserve_model_memory_budget_bytes") == 250 * 1024 * 1024
    assert metric(client, "lmiserve_requests_total", model="llama", route="/invocations", status="200") >= 3


def test_in_flight_request_keeps_its_model(client, server, tmp_path):
    """A request in flight holds its model: a load that needs its memory gets 507 instead."""
    gate = tmp_path / "gate"
    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(
            httpx.post,
            f"{server.url}/invocations",
            json={"gate": str(gate)},
            headers={"X-Amzn-SageMaker-Target-Model": "slow"},
            timeout=300,
        )
        while metric(client, "lmiserve_model_requests_in_flight", model="slow") != 1:
            assert not held.done(), held.result().text
        # llama is idle and goes; slow is busy and stays; SmolLM2 needs the whole budget: 507
        r = client.post("/invocations", json=BODY, headers={"X-Amzn-SageMaker-Target-Model": "smollm2"})
        assert r.status_code == 507 and "held by models in use" in r.json()["error"]
        assert loaded(client) == ["slow"]
        gate.touch()
        assert held.result().status_code == 200 and held.result().json() == {"opened": True}
    r = client.post("/invocations", json=BODY, headers={"X-Amzn-SageMaker-Target-Model": "smollm2"})
    assert r.status_code == 200 and r.json()["generated_text"]
    assert loaded(client) == ["smollm2"]


def test_concurrent_first_requests_load_once(client, server, references):
    assert "qwen3" not in loaded(client)
    before = metric(client, "lmiserve_model_loads_total", model="qwen3", outcome="loaded")
    barrier = threading.Barrier(6)

    def one(_):
        with httpx.Client(base_url=server.url, timeout=300) as c:
            barrier.wait()
            return generate(c, "qwen3")

    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(one, range(6)))
    assert answers == [references["qwen3"]] * 6
    assert metric(client, "lmiserve_model_loads_total", model="qwen3", outcome="loaded") == before + 1
    assert server.log().count("loading model qwen3 from") == int(before) + 1


def unix_sockets(pid: int) -> int:
    """How many Unix-domain sockets the process holds open."""
    with open(f"/proc/{pid}/net/unix") as f:
        inodes = {line.split()[6] for line in f.readlines()[1:]}
    links = (os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd"))
    return sum(link.startswith("socket:[") and link[8:-1] in inodes for link in links)


def test_an_unloaded_model_leaves_no_connection_open(client, server, root, references):
    """Each engine's connection closes with its model: a server that loads and unloads models for
    days holds no more sockets than it started with (a connection left to the garbage collector
    is closed twice, the second time perhaps a request's)."""
    assert loaded(client) == ["qwen3"]
    pid = server.proc.pid
    before = unix_sockets(pid)
    for _ in range(3):
        assert client.post("/models", json={"model_name": "extra", "url": str(root / "llama")}).status_code == 200
        r = client.post("/models/extra/invoke", json=BODY)
        assert r.status_code == 200 and r.json()["generated_text"] == references["llama"]
        assert client.delete("/models/extra").status_code == 200
    deadline = time.monotonic() + 30
    while unix_sockets(pid) > before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert unix_sockets(pid) == before
