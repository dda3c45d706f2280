"""Several API processes on one port (api_processes=3) in front of one engine, on a tiny random
Llama: each protocol streams through every process, the management API, adapters and metrics
are one server's worth whichever process a connection lands on, a killed process comes back,
and SIGTERM drains every process. Each request opens a fresh connection, so the kernel spreads
them over the processes; ``X-Api-Process`` says which took it."""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import signal
import time
from pathlib import Path

import httpx
import pytest

from tests.integration.engine_server import start
from tests.lora_adapters import build_adapter

pytestmark = pytest.mark.serial

PROCESSES = 3
PROMPT = "What is Deep Learning?"
N = 16


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    from tests.tiny_models import build_model

    return build_model(tmp_path_factory.mktemp("tiny-llama-2k") / "model", "llama", max_position_embeddings=2048)


@pytest.fixture(scope="module")
def adapter(tmp_path_factory, model_dir) -> Path:
    return build_adapter(model_dir, tmp_path_factory.mktemp("adapters") / "alpha", seed=1, rank=8)


@pytest.fixture(scope="module")
def server(tmp_path_factory, model_dir, adapter):
    root = tmp_path_factory.mktemp("api-processes")
    extra = (
        "option.max_model_len=2048\noption.enable_lora=true\noption.max_loras=2\noption.max_cpu_loras=2\n"
        f"option.max_lora_rank=16\nmodel_roots={root},{adapter.parent},{model_dir.parent}\n"
        # what is tested is the API processes, not admission: a step timed while the machine was
        # busy must not refuse the streams as predicted to miss their deadline
        "option.predictive_admission=false\n"
    )
    env = {"SERVING_API_PROCESSES": str(PROCESSES), "SERVING_DRAIN_TIMEOUT": "300"}
    with start(root / "m", model_dir, extra, env=env) as s:
        s.wait_ready()
        s.root = root
        wait_attached(s)
        yield s


def post(server, path: str, body: dict, **kwargs) -> httpx.Response:
    """On a connection of its own."""
    return httpx.post(server.url + path, json=body, timeout=120, **kwargs)


def process_of(r: httpx.Response) -> int:
    return int(r.headers["x-api-process"])


def wait_attached(server, path: str = "/predictions/tiny", timeout: float = 180) -> None:
    """Until every API process has answered an inference request itself (not passed it on)."""
    seen: set[int] = set()
    deadline = time.monotonic() + timeout
    while seen != set(range(PROCESSES)):
        assert time.monotonic() < deadline, f"only processes {seen} answered themselves:\n{server.log()}"
        r = post(server, path, {"inputs": "Hi", "parameters": {"max_new_tokens": 1}})
        if r.status_code == 200 and "x-api-process-forwarded" not in r.headers:
            seen.add(process_of(r))


def from_every_process(server, call, rounds: int = 60) -> dict[int, list[httpx.Response]]:
    """``call()`` until each process has answered it (fresh connections), by process."""
    answers: dict[int, list[httpx.Response]] = {}
    for _ in range(rounds):
        r = call()
        answers.setdefault(process_of(r), []).append(r)
        if len(answers) == PROCESSES:
            return answers
    raise AssertionError(f"only processes {sorted(answers)} answered in {rounds} requests")


SHAPES = {
    "lmi": ("/invocations", {"inputs": PROMPT, "parameters": {"max_new_tokens": N}, "stream": True}),
    "openai": (
        "/v1/completions",
        {"model": "tiny", "prompt": PROMPT, "max_tokens": N, "temperature": 0, "stream": True},
    ),
    "tgi": ("/generate_stream", {"inputs": PROMPT, "parameters": {"max_new_tokens": N}}),
}


def streamed_text(shape: str, r: httpx.Response) -> str:
    if shape == "lmi":
        lines = [json.loads(x) for x in r.text.splitlines() if x]
        assert lines[-1]["generated_text"] == "".join(line["token"]["text"] for line in lines)
        return lines[-1]["generated_text"]
    events = [e[len("data:") :].strip() for e in r.text.split("\n\n") if e.strip()]
    if shape == "openai":
        assert events[-1] == "[DONE]"
        return "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1])
    parsed = [json.loads(e) for e in events]
    assert parsed[-1]["generated_text"] == "".join(e["token"]["text"] for e in parsed)
    return parsed[-1]["generated_text"]


@pytest.mark.parametrize("shape", SHAPES)
def test_concurrent_streams_over_fresh_connections_complete_on_every_process(server, shape):
    expected = post(server, "/invocations", {"inputs": PROMPT, "parameters": {"max_new_tokens": N}}).json()
    path, body = SHAPES[shape]
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda _: post(server, path, body), range(48)))
    assert all(r.status_code == 200 for r in answers), [r.text for r in answers if r.status_code != 200]
    assert {streamed_text(shape, r) for r in answers} == {expected["generated_text"]}
    assert {process_of(r) for r in answers} == set(range(PROCESSES))
    ids = [r.headers["x-request-id"] for r in answers]
    assert len(set(ids)) == len(ids)


def test_a_model_loaded_or_unloaded_through_one_process_is_seen_by_all(server, model_dir):
    d = server.root / "second"
    d.mkdir()
    (d / "serving.properties").write_text(
        f"option.model_id={model_dir}\noption.rolling_batch=lmi\noption.dtype=fp32\noption.max_model_len=128\n"
    )
    r = httpx.post(server.url + "/models", params={"url": f"file://{d}", "model_name": "second"}, timeout=300)
    assert r.status_code == 200, r.text
    body = {"inputs": PROMPT, "parameters": {"max_new_tokens": 6}}
    answers = from_every_process(server, lambda: post(server, "/predictions/second", body))
    texts = {r.json()["generated_text"] for rs in answers.values() for r in rs}
    assert len(texts) == 1 and all(r.status_code == 200 for rs in answers.values() for r in rs)
    described = from_every_process(server, lambda: httpx.get(server.url + "/models/second"))
    assert all(r.status_code == 200 for rs in described.values() for r in rs)
    wait_attached(server, "/predictions/second")  # every process serves it itself too

    r = httpx.delete(server.url + "/models/second", timeout=120)
    assert r.status_code == 200
    gone = from_every_process(server, lambda: post(server, "/predictions/second", body))
    assert all(r.status_code == 404 for rs in gone.values() for r in rs)
    wait_attached(server)


def test_an_adapter_registered_through_one_process_is_used_by_all(server, adapter):
    r = httpx.post(server.url + "/models/tiny/adapters", params={"name": "alpha", "src": str(adapter)}, timeout=120)
    assert r.status_code == 200, r.text
    base = post(server, "/invocations", {"inputs": PROMPT, "parameters": {"max_new_tokens": N}}).json()
    body = {"inputs": PROMPT, "parameters": {"max_new_tokens": N}, "adapters": "alpha"}
    answers = from_every_process(server, lambda: post(server, "/invocations", body))
    texts = {r.json()["generated_text"] for rs in answers.values() for r in rs}
    assert len(texts) == 1 and texts != {base["generated_text"]}
    listed = from_every_process(server, lambda: httpx.get(server.url + "/models/tiny/adapters"))
    assert all("alpha" in r.text for rs in listed.values() for r in rs)

    assert httpx.delete(server.url + "/models/tiny/adapters/alpha", timeout=120).status_code == 200
    refused = from_every_process(server, lambda: post(server, "/invocations", body))
    assert all(r.status_code == 400 for rs in refused.values() for r in rs)


def _generate_count(server) -> float:
    text = httpx.get(server.url + "/metrics").text
    found = re.findall(r'^lmiserve_requests_total\{[^}]*route="/generate",status="200"[^}]*\} (\S+)$', text, re.M)
    return sum(float(v) for v in found)


def test_metrics_add_up_the_requests_of_every_process(server):
    before = _generate_count(server)
    sent = 30
    body = {"inputs": PROMPT, "parameters": {"max_new_tokens": 2}}
    answers = [post(server, "/generate", body) for _ in range(sent)]
    assert all(r.status_code == 200 for r in answers)
    assert len({process_of(r) for r in answers}) > 1
    # scraped through every process, the same totals
    for _ in range(6):
        assert _generate_count(server) == before + sent


def _api_process_pid(server, index: int) -> int:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == server.proc.pid and b"lmiserve.server.api_process" in cmdline:
            if cmdline[cmdline.index(b"--index") + 1] == str(index).encode():
                return int(entry.name)
    raise AssertionError(f"no API process {index}")


def test_a_killed_api_process_is_started_again_and_no_request_is_lost_after(server):
    old = _api_process_pid(server, 1)
    os.kill(old, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while True:
        try:
            if _api_process_pid(server, 1) != old:
                break
        except AssertionError:
            pass
        assert time.monotonic() < deadline, server.log()
        time.sleep(0.2)
    wait_attached(server)
    body = {"inputs": PROMPT, "parameters": {"max_new_tokens": 4}}
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: post(server, "/invocations", body), range(40)))
    assert all(r.status_code == 200 for r in answers)
    assert {process_of(r) for r in answers} == set(range(PROCESSES))
    assert f"API process 1 (pid {old}) exited" in server.log()


def test_sigterm_drains_the_streams_of_every_process(server):
    """Last: the server stops."""
    tokens = 600
    body = {"inputs": "Hello", "parameters": {"max_new_tokens": tokens, "ignore_eos_token": True}, "stream": True}
    first_lines = concurrent.futures.Future

    def stream(started: concurrent.futures.Future) -> tuple[int, int, int]:
        with httpx.Client(timeout=300) as c, c.stream("POST", server.url + "/invocations", json=body) as r:
            lines = r.iter_lines()
            count = 1 if next(lines) else 0
            started.set_result(True)
            count += sum(1 for line in lines if line)
            return r.status_code, process_of(r), count

    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        started = [first_lines() for _ in range(12)]
        futures = [pool.submit(stream, s) for s in started]
        concurrent.futures.wait(started, timeout=120)
        server.proc.send_signal(signal.SIGTERM)
        results = [f.result(timeout=300) for f in futures]
    assert all(status == 200 and count == tokens for status, _, count in results), results
    assert len({process for _, process, _ in results}) > 1
    assert server.proc.wait(120) == 0
    log = server.log()
    assert "cut off" not in log
    assert log.count("SIGTERM received") >= PROCESSES
