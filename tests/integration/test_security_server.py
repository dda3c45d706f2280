"""A real server with an API key: keys asked for, handlers not chosen by requests, and no key,
credential or prompt in the logs."""

import grpc
import pytest

from lmiserve.server.kserve_grpc import grpc_predict_v2_pb2 as pb
from lmiserve.server.kserve_grpc import grpc_predict_v2_pb2_grpc as pb_grpc
from tests.server_process import ServerProcess, free_port

KEY = "sk-live-7c1e93b2a4d54f0e"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
PROMPT = "confidential-prompt-4242 about the merger"

MODEL_PY = """
from lmiserve.handlers.outputs import Output

STARTED = []


def handle(inputs):
    if not STARTED:
        STARTED.append(True)
        return None
    out = Output()
    for i, item in enumerate(inputs.get_batches()):
        out.add_as_json({"handler": "handle", "size": len(item.get_as_bytes())}, batch_index=i)
    return out


def evil(inputs):
    out = Output()
    out.add_as_json({"handler": "evil"})
    return out
"""


def model_dir(root, properties=""):
    root.mkdir(parents=True)
    (root / "model.py").write_text(MODEL_PY)
    (root / "serving.properties").write_text("model_name=sec\n" + properties)
    return root


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = model_dir(tmp_path_factory.mktemp("security") / "sec")
    env = {"SERVING_API_KEYS": KEY, "AWS_SECRET_ACCESS_KEY": AWS_SECRET, "AWS_ACCESS_KEY_ID": "AKIAEXAMPLE"}
    with ServerProcess(d, env=env, args=["--log-level", "debug", "--grpc-port", str(free_port())]) as s:
        yield s.wait_ready()


def test_grpc_needs_the_key(server):
    grpc_port = server.proc.args[server.proc.args.index("--grpc-port") + 1]
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        assert stub.ServerReady(pb.ServerReadyRequest(), timeout=30).ready
        for metadata in [None, (("authorization", "Bearer wrong"),), (("x-api-key", KEY[:-1]),)]:
            with pytest.raises(grpc.RpcError) as err:
                stub.ModelReady(pb.ModelReadyRequest(name="sec"), metadata=metadata, timeout=30)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert KEY not in (err.value.details() or "")
        for metadata in [(("authorization", f"Bearer {KEY}"),), (("x-api-key", KEY),)]:
            assert stub.ModelReady(pb.ModelReadyRequest(name="sec"), metadata=metadata, timeout=30).ready


def test_requests_need_the_key_and_cannot_pick_a_handler(server):
    with server.client() as c:
        assert c.get("/ping").status_code == 200
        r = c.post("/predictions/sec", json={"inputs": PROMPT})
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        r = c.post("/invocations", json={"inputs": PROMPT}, headers={"Authorization": "Bearer sk-live-wrong"})
        assert r.status_code == 401 and "sk-live" not in r.text
        auth = {"Authorization": f"Bearer {KEY}"}
        for body, headers, params in [
            ({"inputs": PROMPT, "handler": "evil"}, {}, {}),
            ({"inputs": PROMPT}, {"X-Handler": "evil", "X-Amzn-SageMaker-Custom-Attributes": "handler=evil"}, {}),
            ({"inputs": PROMPT}, {}, {"handler": "evil", "entryPoint": "evil"}),
        ]:
            r = c.post("/invocations", json=body, headers={**auth, **headers}, params=params)
            assert r.status_code == 200 and r.json()["handler"] == "handle"
        r = c.post(
            "/models",
            params={"url": str(server.model_dir), "model_name": "again", "handler": "evil", "entryPoint": "x.py"},
            headers=auth,
        )
        assert r.status_code == 200
        assert c.post("/predictions/again", json={"inputs": PROMPT}, headers=auth).json()["handler"] == "handle"
        r = c.post("/models", params={"url": "/etc", "model_name": "etc"}, headers=auth)
        assert r.status_code == 403 and "model_roots" in r.json()["error"]
        r = c.post("/models", params={"url": f"{server.model_dir}/../..", "model_name": "up"}, headers=auth)
        assert r.status_code == 403
        assert c.delete("/models/again", headers=auth).status_code == 200
        r = c.post("/invocations", content=b"{" + PROMPT.encode(), headers={**auth, "Content-Type": "application/json"})
        assert KEY not in r.text


def test_no_key_credential_or_prompt_in_the_logs(server):
    with server.client() as c:
        assert c.post("/invocations", json={"inputs": PROMPT}, headers={"X-Api-Key": KEY}).status_code == 200
    server.stop()
    log = server.log()
    assert "POST /invocations" in log or "model sec" in log  # the log was captured
    for secret in (KEY, AWS_SECRET, PROMPT):
        assert secret not in log, secret


def test_request_bodies_logged_only_when_asked(tmp_path):
    d = model_dir(tmp_path / "logged", "log_request_bodies=true\n")
    with ServerProcess(d, args=["--grpc-port", "0"]) as s:
        s.wait_ready()
        with s.client() as c:
            assert c.post("/invocations", json={"inputs": PROMPT}).status_code == 200
        s.stop()
        assert PROMPT in s.log()
