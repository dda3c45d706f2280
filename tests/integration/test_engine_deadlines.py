"""Request deadlines and overload on the rolling-batch path, through the real server: a deadline
aborts generation and frees its KV blocks, a request still queued at its deadline is shed with
503, and beyond ``job_queue_size`` waiting requests the answer is 503 at once."""

from __future__ import annotations

import concurrent.futures
import json
import re

import pytest

from tests.integration.engine_server import start
from tests.integration.test_engine_faults import wait_for

pytestmark = pytest.mark.serial

LONG = {"max_new_tokens": 15000, "ignore_eos_token": True}
"""Long enough to outlast every deadline below on a fast machine."""


@pytest.fixture(scope="module")
def server(tiny_llama_dir, tmp_path_factory):
    # queueing itself is under test here: no request is refused for its predicted wait
    extra = (
        "option.max_model_len=16000\noption.max_rolling_batch_size=1\njob_queue_size=1\npredict_timeout=60\n"
        "option.predictive_admission=false\n"
    )
    with start(tmp_path_factory.mktemp("deadlines") / "m", tiny_llama_dir, extra) as s:
        yield s.wait_ready()


def stats(c) -> dict:
    return c.get("/models/tiny").json()[0]["stats"] or {}


def gauge(c, name: str) -> float:
    match = re.search(rf'^{name}\{{model="tiny"\}} (\S+)$', c.get("/metrics").text, re.M)
    return float(match.group(1))


def idle(c) -> bool:
    s = stats(c)
    return s.get("running") == 0 and s.get("waiting") == 0 and s.get("kv_blocks_used") == 0


def test_deadline_aborts_generation_and_frees_its_blocks(server):
    with server.client() as c:
        r = c.post("/invocations", json={"inputs": "Hello", "parameters": LONG}, headers={"X-Request-Timeout": "1"})
        assert r.status_code == 504
        assert r.json()["details"]["finish_reason"] == "error"
        assert wait_for(lambda: idle(c), 30)
        assert gauge(c, "lmiserve_kv_cache_blocks_used") == 0


def test_deadline_mid_stream_ends_with_the_protocols_error_event(server):
    with server.client() as c:
        body = {"inputs": "Hello", "parameters": LONG}
        with c.stream("POST", "/generate_stream", json=body, headers={"X-Request-Timeout": "1"}) as r:
            assert r.status_code == 200
            lines = [x for x in r.iter_lines() if x.startswith("data:")]
        last = json.loads(lines[-1][len("data:") :])
        assert "deadline" in last["error"] and len(lines) > 1
        assert wait_for(lambda: idle(c), 30)


def test_request_still_queued_at_its_deadline_is_shed_with_503(server):
    with server.client() as c:
        body = {"inputs": "Busy", "parameters": LONG, "stream": True}
        with c.stream("POST", "/invocations", json=body) as running:  # the one batch slot
            lines = running.iter_lines()  # kept: a dropped iterator closes the stream
            next(lines)
            r = c.post(
                "/invocations",
                json={"inputs": "Hi", "parameters": {"max_new_tokens": 2}},
                headers={"X-Request-Timeout": "1"},
            )
        assert r.status_code == 503 and r.headers["retry-after"]
        assert wait_for(lambda: idle(c), 30)


def test_beyond_the_job_queue_requests_get_503_at_once(server):
    with server.client() as c, concurrent.futures.ThreadPoolExecutor(1) as pool:
        body = {"inputs": "Busy", "parameters": LONG, "stream": True}
        with c.stream("POST", "/invocations", json=body) as running:
            lines = running.iter_lines()  # kept: a dropped iterator closes the stream
            next(lines)
            queued = pool.submit(
                c.post, "/invocations", json={"inputs": "Next", "parameters": LONG}, headers={"X-Request-Timeout": "2"}
            )
            assert wait_for(lambda: stats(c).get("waiting") == 1, 30)
            r = c.post("/v1/completions", json={"model": "tiny", "prompt": "More", "max_tokens": 2})
            assert r.status_code == 503 and r.headers["retry-after"]
            assert "job_queue_size" in r.text
            shed = queued.result(timeout=60)  # never scheduled: the one slot stays busy
        assert shed.status_code == 503 and shed.headers["retry-after"]
        assert wait_for(lambda: idle(c), 30)
        ok = c.post("/v1/completions", json={"model": "tiny", "prompt": "More", "max_tokens": 2})
        assert ok.status_code == 200


@pytest.mark.parametrize("value", ["soon", "-1", "0", "nan", "inf"])
def test_a_bad_request_timeout_header_is_400(server, value):
    with server.client() as c:
        body = {"model": "tiny", "prompt": "Hi", "max_tokens": 2}
        r = c.post("/v1/completions", json=body, headers={"X-Request-Timeout": value})
    assert r.status_code == 400 and "X-Request-Timeout" in r.json()["error"]["message"]
