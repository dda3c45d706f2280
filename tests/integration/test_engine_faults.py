"""Faults of the rolling-batch engine behind the real server: a killed or hung engine process,
request deadlines and overload. Waits are bounded; nothing here asserts a timing figure."""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import time

import httpx
import pytest

from tests.integration.engine_server import start

pytestmark = pytest.mark.serial

LONG = {"max_new_tokens": 15000, "ignore_eos_token": True}
ERROR_WAIT = 5.0
"""Seconds within which each request in flight must have received its error."""


@pytest.fixture(scope="module")
def server(tiny_llama_dir, tmp_path_factory):
    # requests end with the crash here (option.max_replays=0); tests/integration/test_engine_replay.py
    # has the replays
    extra = "option.max_model_len=16000\noption.engine_heartbeat_timeout=2\noption.max_replays=0\n"
    with start(tmp_path_factory.mktemp("faults") / "m", tiny_llama_dir, extra) as s:
        yield s.wait_ready()


def engine_pid(c: httpx.Client) -> int:
    return c.get("/models/tiny").json()[0]["enginePid"]


def wait_for(predicate, timeout: float = 120.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def ping(s) -> int:
    try:
        return httpx.get(s.url + "/ping", timeout=5).status_code
    except httpx.HTTPError:
        return 0


def stream_lines(c: httpx.Client, url: str, body: dict, started: concurrent.futures.Future) -> list[str]:
    """Every non-empty line of a streamed answer; ``started`` is set once the first one arrived."""
    lines = []
    with c.stream("POST", url, json=body) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line:
                lines.append(line)
                if not started.done():
                    started.set_result(None)
    return lines


def events(lines: list[str]) -> list:
    """The JSON of each SSE ``data:`` line (``[DONE]`` kept as the string)."""
    out = []
    for line in lines:
        if line.startswith("data:"):
            data = line[len("data:") :].strip()
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


STREAMS = {
    "lmi": ("/invocations", {"inputs": "What is Deep Learning?", "parameters": LONG, "stream": True}),
    "tgi": ("/generate_stream", {"inputs": "The quick brown fox", "parameters": LONG}),
    "openai": (
        "/v1/completions",
        {"model": "tiny", "prompt": "Numbers: 1 2 3", "max_tokens": 15000, "ignore_eos": True, "stream": True},
    ),
}


def assert_stream_errors(results: dict[str, list[str]]) -> None:
    """Each protocol's stream ended with its own in-stream error event."""
    lmi = [json.loads(x) for x in results["lmi"]]
    assert lmi[-1]["details"]["finish_reason"] == "error" and lmi[-1]["token"]["id"] == -1
    tgi = events(results["tgi"])
    assert "error" in tgi[-1] and tgi[-1]["error_type"]
    openai = events(results["openai"])
    assert openai[-1] == "[DONE]" and "error" in openai[-2]


def run_fault(s, fault) -> tuple[httpx.Response, dict[str, list[str]]]:
    """Start a blocking request and one stream per protocol, wait until each streams, apply
    ``fault(pid)``, and return what each got, every one within ERROR_WAIT seconds of the others."""
    with s.client() as c, concurrent.futures.ThreadPoolExecutor(len(STREAMS) + 1) as pool:
        pid = engine_pid(c)
        blocking = pool.submit(c.post, "/invocations", json={"inputs": "Hello there", "parameters": LONG})
        started = {name: concurrent.futures.Future() for name in STREAMS}
        futures = {
            name: pool.submit(stream_lines, c, url, body, started[name]) for name, (url, body) in STREAMS.items()
        }
        concurrent.futures.wait(started.values(), timeout=60)
        assert all(f.done() for f in started.values()) and not blocking.done()
        fault(pid)
        results = {name: f.result(timeout=60) for name, f in futures.items()}
        response = blocking.result(timeout=ERROR_WAIT)
        return response, results


def test_killed_engine_ends_every_request_with_an_error_then_recovers(server):
    with server.client() as c:
        old = engine_pid(c)
        seen_unhealthy = []

        def kill(pid: int) -> None:
            os.kill(pid, signal.SIGKILL)
            seen_unhealthy.append(wait_for(lambda: ping(server) == 503, 30))

        r, results = run_fault(server, kill)
        assert r.status_code == 503 and r.json()["details"]["finish_reason"] == "error"
        assert_stream_errors(results)
        assert seen_unhealthy == [True]
        assert wait_for(lambda: ping(server) == 200)
        assert engine_pid(c) != old
        ok = c.post("/invocations", json={"inputs": "Hi", "parameters": {"max_new_tokens": 3}})
        assert ok.status_code == 200 and ok.json()["generated_text"]


def test_hung_engine_is_detected_killed_and_restarted(server):
    with server.client() as c:
        old = engine_pid(c)
        seen_unhealthy = []

        def hang(pid: int) -> None:
            os.kill(pid, signal.SIGSTOP)  # alive, but no step will ever finish
            seen_unhealthy.append(wait_for(lambda: ping(server) == 503, 60))

        try:
            r, results = run_fault(server, hang)
        finally:
            try:
                os.kill(old, signal.SIGKILL)
            except ProcessLookupError:
                pass
        assert r.status_code == 503 and r.json()["details"]["finish_reason"] == "error"
        assert_stream_errors(results)
        assert seen_unhealthy == [True]
        assert wait_for(lambda: ping(server) == 200)
        assert engine_pid(c) != old
        assert f"engine process (pid {old}) is stalled" in server.log()
        # greedy: the default temperature samples, and a sampled EOS would end it early
        ok = c.post("/v1/completions", json={"model": "tiny", "prompt": "Hi", "max_tokens": 3, "temperature": 0})
        assert ok.status_code == 200 and ok.json()["choices"][0]["finish_reason"] == "length"


def test_idle_engine_is_not_taken_for_hung(server):
    assert wait_for(lambda: ping(server) == 200)
    with server.client() as c:
        pid = engine_pid(c)
        time.sleep(3)  # longer than the heartbeat timeout, with nothing to do
        assert ping(server) == 200 and engine_pid(c) == pid
