"""Requests that outlive a killed engine, behind the real server: every request in flight when
the engine is SIGKILLed ends complete, with the very tokens of a run without the crash (greedy
and seeded), whether it had streamed already or not. Waits are bounded; no timing is asserted."""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import signal
import time

import httpx
import pytest

from tests.integration.engine_server import start

pytestmark = pytest.mark.serial

TOKENS = 300
GREEDY = {"max_new_tokens": TOKENS, "ignore_eos_token": True, "details": True}
SEEDED = {**GREEDY, "do_sample": True, "temperature": 0.9, "top_k": 40, "top_p": 0.95, "seed": 11}
PENALIZED = {**GREEDY, "repetition_penalty": 1.3}


@pytest.fixture(scope="module")
def server(tiny_llama_dir, tmp_path_factory):
    with start(tmp_path_factory.mktemp("replay") / "m", tiny_llama_dir, "option.max_model_len=1024\n") as s:
        yield s.wait_ready()


def engine_pid(c: httpx.Client) -> int:
    return c.get("/models/tiny").json()[0]["enginePid"]


def lmi_stream(c: httpx.Client, body: dict, started: concurrent.futures.Future) -> list[dict]:
    lines = []
    with c.stream("POST", "/invocations", json={**body, "stream": True}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line:
                lines.append(json.loads(line))
                if not started.done():
                    started.set_result(None)
    return lines


def openai_stream(c: httpx.Client, body: dict, started: concurrent.futures.Future) -> list[dict]:
    events = []
    with c.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data:"):
                data = line[len("data:") :].strip()
                events.append(data if data == "[DONE]" else json.loads(data))
                if not started.done():
                    started.set_result(None)
    return events


def metric(c: httpx.Client, name: str, labels: str) -> float:
    match = re.search(rf"^{name}\{{{labels}\}} (\S+)$", c.get("/metrics").text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def run_all(c: httpx.Client, kill_mid_way: bool) -> dict:
    """Three LMI streams (greedy, seeded, penalized), an OpenAI stream and a plain request at
    once; with ``kill_mid_way``, the engine is SIGKILLed once every stream has sent something
    (it is frozen first, so that all are still in flight then)."""
    openai_body = {"model": "tiny", "prompt": "Numbers: 1 2 3", "max_tokens": TOKENS, "ignore_eos": True}
    openai_body |= {"temperature": 0}
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        pid = engine_pid(c)
        plain = pool.submit(c.post, "/invocations", json={"inputs": "Hello there", "parameters": GREEDY})
        started = [concurrent.futures.Future() for _ in range(4)]
        streams = {
            "greedy": pool.submit(
                lmi_stream, c, {"inputs": "What is Deep Learning?", "parameters": GREEDY}, started[0]
            ),
            "seeded": pool.submit(lmi_stream, c, {"inputs": "Once upon a time", "parameters": SEEDED}, started[1]),
            "penalized": pool.submit(
                lmi_stream, c, {"inputs": "The quick brown fox", "parameters": PENALIZED}, started[2]
            ),
            "openai": pool.submit(openai_stream, c, openai_body, started[3]),
        }
        concurrent.futures.wait(started, timeout=120)
        assert all(f.done() for f in started)
        if kill_mid_way:
            os.kill(pid, signal.SIGSTOP)
            assert not plain.done() and not any(f.done() for f in streams.values())
            os.kill(pid, signal.SIGKILL)
        results = {name: f.result(timeout=240) for name, f in streams.items()}
        response = plain.result(timeout=240)
    assert response.status_code == 200, response.text
    results["plain"] = response.json()
    return results


def lmi_tokens(lines: list[dict]) -> list[int]:
    assert lines[-1]["details"]["finish_reason"] == "length", lines[-1]
    assert all(line["token"]["id"] >= 0 for line in lines)
    return [line["token"]["id"] for line in lines]


def test_requests_in_flight_when_the_engine_dies_finish_as_if_it_had_not(server):
    with server.client(timeout=300) as c:
        clean = run_all(c, kill_mid_way=False)
        old = engine_pid(c)
        replayed = run_all(c, kill_mid_way=True)
        assert engine_pid(c) != old
        for name in ("greedy", "seeded", "penalized"):
            tokens = lmi_tokens(replayed[name])
            assert len(tokens) == TOKENS and tokens == lmi_tokens(clean[name]), name
            assert replayed[name][-1]["generated_text"] == clean[name][-1]["generated_text"]
        assert replayed["openai"][-1] == "[DONE]" and not any("error" in e for e in replayed["openai"][:-1])
        text = "".join(e["choices"][0]["text"] for e in replayed["openai"][:-1] if e["choices"])
        assert text == "".join(e["choices"][0]["text"] for e in clean["openai"][:-1] if e["choices"])
        assert replayed["plain"]["generated_text"] == clean["plain"]["generated_text"]
        assert replayed["plain"]["details"]["generated_tokens"] == TOKENS
        continued = metric(c, "lmiserve_requests_replayed_total", 'how="continued",model="tiny"')
        from_prompt = metric(c, "lmiserve_requests_replayed_total", 'how="prompt",model="tiny"')
        assert continued >= 4 and continued + from_prompt == 5
    assert "handed to the restarted engine (continuing after" in server.log()


def test_a_request_sent_while_the_engine_restarts_waits_for_it(server):
    with server.client(timeout=300) as c:
        pid = engine_pid(c)
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while c.get("/ping").status_code == 200:  # until the server has seen the engine die
            assert time.monotonic() < deadline
            time.sleep(0.01)
        r = c.post("/invocations", json={"inputs": "Hi", "parameters": {"max_new_tokens": 5}})
        assert r.status_code == 200 and r.json()["generated_text"]
        assert engine_pid(c) != pid
