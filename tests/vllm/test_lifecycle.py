"""A real vLLM in bf16 with tgi_compat, eager (``option.enforce_eager=true`` reaches vLLM: no
compilation at each of its starts, a minute less each): TGI's shapes from the LMI routes, then
vLLM's engine processes killed under a request: the request fails in its protocol's shape, the
model reports Unhealthy, lmiserve starts vLLM again and serves. The protocols' module runs vLLM
as it runs by default, compiled."""

from __future__ import annotations

import contextlib
import json
import signal
import time

import psutil
import pytest

from .real_vllm import NAME, START_TIMEOUT_S, needs_vllm, sse_data, start

pytestmark = needs_vllm

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def server(smollm2_dir, tmp_path_factory):
    with start(
        tmp_path_factory.mktemp("vllm") / "m",
        smollm2_dir,
        "option.dtype=bf16\noption.tgi_compat=true\noption.enforce_eager=true\n",
    ) as s:
        yield s


def test_tgi_compat_shapes(server):
    assert "enforce_eager=True" in server.log()  # vLLM's own account of its configuration
    with server.client() as c:
        r = c.post("/invocations", json={"inputs": PROMPT, "parameters": {"max_new_tokens": 5}})
        assert r.status_code == 200
        [body] = r.json()
        assert body["details"]["finish_reason"] == "length" and body["details"]["generated_tokens"] == 5
        with c.stream(
            "POST", "/invocations", json={"inputs": PROMPT, "parameters": {"max_new_tokens": 4}, "stream": True}
        ) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            events = [json.loads(d) for d in sse_data(r.read(), space=True)]  # the document: data: {
    assert (
        len(events) == 4 and events[-1]["generated_text"] == body["generated_text"][: len(events[-1]["generated_text"])]
    )
    assert events[-1]["details"]["finish_reason"] == "length"


def vllm_processes(server) -> list[psutil.Process]:
    return psutil.Process(server.proc.pid).children(recursive=True)


def vllm_engines(server) -> list[psutil.Process]:
    """The server's ``VLLM::`` processes; a child that exits while they are listed (vLLM starts
    short-lived helpers) is none of them."""
    found = []
    for process in vllm_processes(server):
        try:
            if process.name().startswith("VLLM"):
                found.append(process)
        except psutil.NoSuchProcess:
            pass
    return found


def wait_for_ping(c, status: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while c.get("/ping").status_code != status and time.monotonic() < deadline:
        time.sleep(0.2)


def test_engine_death_fails_the_request_then_vllm_starts_again(server):
    body = {"inputs": PROMPT, "parameters": {"max_new_tokens": 900, "ignore_eos_token": True}}
    with server.client() as c:
        with c.stream("POST", "/generate_stream", json=body) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            assert next(lines).startswith("data:")
            children = vllm_processes(server)
            assert children, "vLLM runs its engine in processes of its own"
            for child in children:
                with contextlib.suppress(psutil.NoSuchProcess):  # a helper that has exited meanwhile
                    child.send_signal(signal.SIGKILL)
            rest = [line for line in lines if line]
        last = json.loads(rest[-1].removeprefix("data:"))
        assert "error" in last and last["error_type"] == "generation"
        assert "the vLLM engine died" in last["error"]
        assert len(rest) < 900

        wait_for_ping(c, 503, 60)
        assert c.get("/ping").json() == {NAME: "Unhealthy"}
        refused = c.post("/generate", json={"inputs": PROMPT, "parameters": {"max_new_tokens": 2}})
        assert refused.status_code == 503 and refused.json()["error_type"] == "unhealthy"

        wait_for_ping(c, 200, START_TIMEOUT_S)
        assert c.get("/ping").json() == {NAME: "Healthy"}
        r = c.post("/generate", json={"inputs": PROMPT, "parameters": {"max_new_tokens": 3}})
        assert r.status_code == 200 and r.json()["generated_text"]
    assert "the vLLM engine died" in server.log()


def test_a_server_stopped_while_vllm_starts_leaves_none_of_its_processes(smollm2_dir, tmp_path):
    from tests.server_process import ServerProcess

    from .real_vllm import serving_dir

    server = ServerProcess(serving_dir(tmp_path / "m", smollm2_dir, "option.dtype=bf16\n"))
    try:
        deadline = time.monotonic() + 120
        started = []
        while not started and time.monotonic() < deadline and server.proc.poll() is None:
            started = vllm_engines(server)
            time.sleep(0.2)
        assert started, "vLLM started no engine process"
        server.proc.send_signal(signal.SIGTERM)
        server.wait_exit(60)
    finally:
        server.stop()
    gone, alive = psutil.wait_procs(started, timeout=30)
    assert alive == [] and len(gone) == len(started)
