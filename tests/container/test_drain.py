"""SIGTERM, as SageMaker / Kubernetes / ``docker stop`` send it to ``container/serve``: the requests in
flight finish, new ones are refused, the model's child processes exit, and so does the server, with 0."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time

import httpx
import pytest

from tests.container.serve_process import ContainerServe, wait_gone

pytestmark = pytest.mark.serial

SLOW_HANDLER = """
import time
from pathlib import Path

from lmiserve.handlers.outputs import Output


def wait_for(path):
    while not Path(path).exists():
        time.sleep(0.01)


def handle(inputs):
    if inputs.is_empty():
        return None
    body = inputs.get_as_json()
    out = Output()
    if body.get("chunks"):
        def chunks():
            for n in range(body["chunks"]):
                if n:
                    wait_for(body["until"])
                yield {"n": n}
        return out.add_stream_content(chunks())
    if "until" in body:
        wait_for(body["until"])
        return out.add_as_json({"released": True})
    time.sleep(body["sleep"])
    return out.add_as_json({"slept": body["sleep"]})
"""


def _running(client: httpx.Client, model: str) -> float:
    text = client.get("/metrics").text
    match = re.search(rf'^lmiserve_requests_running\{{model="{model}"\}} (\S+)$', text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def _wait_running(client: httpx.Client, model: str, count: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while _running(client, model) < count:
        assert time.monotonic() < deadline, f"{count} requests never ran at once"
        time.sleep(0.02)


class Refusals(threading.Thread):
    """Polls ``/ping`` from before SIGTERM is sent; at the first 503 it posts one late request, so
    both land inside the drain however briefly the machine lets this process run. ``connected``
    is set once its connection is open (the first ping answered): send SIGTERM after it, since
    the server stops accepting connections when the drain starts."""

    def __init__(self, url: str, timeout: float = 60):
        super().__init__(daemon=True)
        self.url, self.timeout = url, timeout
        self.connected = threading.Event()
        self.ping: httpx.Response | None = None
        self.late: httpx.Response | None = None
        self.error: Exception | None = None

    def run(self) -> None:
        deadline = time.monotonic() + self.timeout
        try:
            # one client, its connection kept open: a ping costs a round trip, not a connect
            with httpx.Client(base_url=self.url, timeout=10) as client:
                while time.monotonic() < deadline:
                    ping = client.get("/ping")
                    self.connected.set()
                    if ping.status_code == 503:
                        self.ping = ping
                        self.late = client.post("/invocations", json={"inputs": "late"})
                        return
                    time.sleep(0.005)
        except Exception as exc:  # noqa: BLE001 - reported by the test
            self.error = exc
        finally:
            self.connected.set()


class Call(threading.Thread):
    """One request on its own thread; ``first`` is set when the first streamed line arrives."""

    def __init__(self, url: str, body: dict, stream: bool):
        super().__init__(daemon=True)
        self.url, self.body, self.stream = url, body, stream
        self.first = threading.Event()
        self.status: int | None = None
        self.lines: list[dict] = []
        self.json: dict | None = None
        self.error: Exception | None = None

    def run(self) -> None:
        try:
            with httpx.Client(base_url=self.url, timeout=300) as client:
                if not self.stream:
                    answer = client.post("/invocations", json=self.body)
                    self.status, self.json = answer.status_code, answer.json()
                    return
                with client.stream("POST", "/invocations", json=self.body) as answer:
                    self.status = answer.status_code
                    for line in answer.iter_lines():
                        if line:
                            self.lines.append(json.loads(line))
                            self.first.set()
        except Exception as exc:  # noqa: BLE001 - reported by the test
            self.error = exc
        finally:
            self.first.set()


def test_sigterm_drains_streaming_and_plain_engine_requests(tmp_path):
    from tests.tiny_models import build_model

    long_context = build_model(tmp_path / "tiny-llama-4k", "llama", max_position_embeddings=4096)
    model_dir = tmp_path / "opt-ml-model"
    model_dir.mkdir()
    (model_dir / "serving.properties").write_text(
        f"model_name=tiny\noption.model_id={long_context}\noption.rolling_batch=lmi\noption.dtype=fp32\n"
        # generation continues after the drain began: however slowly a loaded machine runs it, the
        # requests' own deadline is not what ends them
        "option.max_model_len=4096\npredict_timeout=1800\n"
    )
    tokens = 2000
    params = {"max_new_tokens": tokens, "ignore_eos_token": True, "details": True}
    # a drain longer than the requests can take on a busy machine: it ends when they do
    with ContainerServe(model_dir, tmp_path, SERVING_DRAIN_TIMEOUT="600") as serve:
        serve.wait_ready()
        with serve.client() as client:
            engine_pid = client.get("/models/tiny").json()[0]["enginePid"]
            plain = Call(serve.url, {"inputs": "What is Deep Learning?", "parameters": params}, stream=False)
            streamed = Call(serve.url, {"inputs": "Hello", "parameters": params, "stream": True}, stream=True)
            plain.start()
            streamed.start()
            assert streamed.first.wait(60) and streamed.error is None
            _wait_running(client, "tiny", 2)
            # the engine is frozen until the drain has begun, so that however slowly the machine
            # lets this test run, both requests are still in flight when SIGTERM arrives
            os.kill(engine_pid, signal.SIGSTOP)
            try:
                assert plain.is_alive() and streamed.is_alive()
                refusals = Refusals(serve.url)
                refusals.start()
                assert refusals.connected.wait(60)
                serve.sigterm()
                refusals.join(90)
            finally:
                os.kill(engine_pid, signal.SIGCONT)
        assert refusals.error is None and refusals.ping is not None, "/ping never answered 503 after SIGTERM"
        assert refusals.ping.json()["code"] == 503 and "shutting down" in refusals.ping.json()["error"]
        assert refusals.late.status_code == 503 and refusals.late.headers["connection"] == "close"

        for call in (plain, streamed):
            call.join(300)
            assert not call.is_alive() and call.error is None and call.status == 200, serve.log()
        assert plain.json["details"]["generated_tokens"] == tokens
        assert plain.json["details"]["finish_reason"] == "length"
        assert len(streamed.lines) == tokens
        assert streamed.lines[-1]["details"]["finish_reason"] == "length"
        assert "".join(line["token"]["text"] for line in streamed.lines) == streamed.lines[-1]["generated_text"]

        assert serve.proc.wait(timeout=120) == 0
        log = serve.log()
    assert "SIGTERM received: draining 2 request(s) in flight" in log
    assert "drained in" in log and "cut off" not in log
    assert wait_gone(engine_pid), "the engine process outlived the server"


@pytest.fixture
def slow_handler_dir(tmp_path):
    d = tmp_path / "opt-ml-model"
    d.mkdir()
    (d / "model.py").write_text(SLOW_HANDLER)
    (d / "serving.properties").write_text("model_name=slow\nminWorkers=2\nmaxWorkers=2\n")
    return d


def test_sigterm_to_the_process_group_drains_handler_workers(tmp_path, slow_handler_dir):
    with ContainerServe(slow_handler_dir, tmp_path, SERVING_DRAIN_TIMEOUT="600") as serve:
        serve.wait_ready()
        with serve.client() as client:
            # /ping is 200 once one worker is ready; the second may still be starting
            deadline = time.monotonic() + 120
            while len(workers := [w["pid"] for w in client.get("/models/slow").json()[0]["workers"]]) < 2:
                assert time.monotonic() < deadline, "the second worker never started"
                time.sleep(0.05)
            # both wait for a file the test writes once the drain has begun, so that however slowly
            # the machine lets this test run, both are still in flight when SIGTERM arrives
            release = tmp_path / "release"
            plain = Call(serve.url, {"until": str(release)}, stream=False)
            streamed = Call(serve.url, {"chunks": 8, "until": str(release)}, stream=True)
            plain.start()
            streamed.start()
            assert streamed.first.wait(60) and streamed.error is None
            _wait_running(client, "slow", 2)

        # the workers get SIGTERM too, and keep working until the server stops them
        refusals = Refusals(serve.url)
        refusals.start()
        assert refusals.connected.wait(60)
        serve.sigterm_group()
        refusals.join(90)
        release.touch()
        assert refusals.ping is not None and refusals.late.status_code == 503, refusals.error
        for call in (plain, streamed):
            call.join(60)
            assert not call.is_alive() and call.error is None and call.status == 200
        assert plain.json == {"released": True}
        assert streamed.lines == [{"n": n} for n in range(8)]
        assert serve.proc.wait(timeout=60) == 0
        assert "SIGTERM received: draining 2 request(s) in flight" in serve.log()
    assert all(wait_gone(pid) for pid in workers), "a worker process outlived the server"


def test_drain_timeout_cuts_off_what_is_still_running_and_exits_0(tmp_path, slow_handler_dir):
    with ContainerServe(slow_handler_dir, tmp_path, SERVING_DRAIN_TIMEOUT="1") as serve:
        serve.wait_ready()
        stuck = Call(serve.url, {"sleep": 600}, stream=False)
        stuck.start()
        with serve.client() as client:
            _wait_running(client, "slow", 1)
        serve.sigterm()
        assert serve.proc.wait(timeout=60) == 0
        stuck.join(30)
        assert not stuck.is_alive() and stuck.status != 200
        assert "drain_timeout (1 s) reached: 1 request(s) still in flight are cut off" in serve.log()
