"""Overload through the real server: a flood of requests with short deadlines is refused with 503
and Retry-After in each protocol's error shape while the admitted requests complete, the refusals
are counted by reason, and with tenants configured the refusals fall on the tenant that floods."""

from __future__ import annotations

import concurrent.futures
import re

import pytest

from tests.integration.engine_server import start
from tests.integration.test_engine_faults import wait_for

pytestmark = pytest.mark.serial

LONG = {"max_new_tokens": 15000, "ignore_eos_token": True}
"""Long enough to hold the one batch slot for as long as a test needs it."""
SHORT = {"X-Request-Timeout": "2"}
SMALL = "option.max_model_len=16000\noption.max_rolling_batch_size=1\n"


@pytest.fixture(scope="module")
def server(tiny_llama_dir, tmp_path_factory):
    with start(tmp_path_factory.mktemp("overload") / "m", tiny_llama_dir, SMALL + "job_queue_size=2\n") as s:
        yield s.wait_ready()


@pytest.fixture(scope="module")
def tenants(tiny_llama_dir, tmp_path_factory):
    # the queue limit alone decides here, whatever the engine has measured
    extra = SMALL + "job_queue_size=3\ntenant_header=X-Tenant-Id\noption.predictive_admission=false\n"
    with start(tmp_path_factory.mktemp("tenants") / "m", tiny_llama_dir, extra) as s:
        yield s.wait_ready()


def stats(c) -> dict:
    return c.get("/models/tiny").json()[0]["stats"] or {}


def idle(c) -> bool:
    s = stats(c)
    return s.get("running") == 0 and s.get("waiting") == 0


def refusals(c) -> dict[str, float]:
    found = re.findall(
        r'^lmiserve_requests_refused_total\{model="tiny",reason="(\w+)"\} (\S+)$', c.get("/metrics").text, re.M
    )
    return {reason: float(value) for reason, value in found}


def assert_lmi_refusal(r) -> None:
    assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1
    body = r.json()
    assert body["generated_text"] == "" and body["details"]["finish_reason"] == "error"


def assert_openai_refusal(r) -> None:
    assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1
    error = r.json()["error"]
    assert error["code"] == 503 and error["type"] == "server_overloaded" and "retry later" in error["message"]


def test_a_flood_with_short_deadlines_gets_503_and_retry_after_while_the_admitted_complete(server):
    with server.client() as c, concurrent.futures.ThreadPoolExecutor(6) as pool:
        body = {"inputs": "Busy", "parameters": LONG, "stream": True}
        with c.stream("POST", "/invocations", json=body) as holder:  # the one batch slot
            lines = holder.iter_lines()  # kept: a dropped iterator closes the stream
            next(lines)
            next(lines)
            lmi = [
                pool.submit(
                    c.post,
                    "/invocations",
                    json={"inputs": f"Flood {i}", "parameters": {"max_new_tokens": 4}},
                    headers=SHORT,
                )
                for i in range(3)
            ]
            openai = [
                pool.submit(
                    c.post,
                    "/v1/completions",
                    json={"model": "tiny", "prompt": f"Flood {i}", "max_tokens": 4},
                    headers=SHORT,
                )
                for i in range(3)
            ]
            lmi_answers = [f.result(timeout=60) for f in lmi]
            openai_answers = [f.result(timeout=60) for f in openai]
            assert holder.status_code == 200
        # the batch slot stayed busy: refused at once, or (at most job_queue_size of them) shed from
        # the queue at their deadline; either way 503 with Retry-After
        for r in lmi_answers:
            assert_lmi_refusal(r)
        for r in openai_answers:
            assert_openai_refusal(r)
        counted = refusals(c)
        assert set(counted) <= {"queue_full", "predicted_delay"}
        assert sum(counted.values()) >= 4
        assert wait_for(lambda: idle(c), 30)
        # ignore_eos: the completion samples (temperature 1), and the tiny model may draw its EOS early
        after = {"model": "tiny", "prompt": "After", "max_tokens": 4, "ignore_eos": True}
        done = c.post("/v1/completions", json=after, headers=SHORT)
        assert done.status_code == 200 and done.json()["usage"]["completion_tokens"] == 4


def test_the_flooding_tenant_gets_503_while_another_tenant_is_admitted(tenants):
    # a deadline far shorter than the 15,000 tokens take: every flood request ends at it
    flood = {"X-Tenant-Id": "flood", "X-Request-Timeout": "4"}
    with tenants.client() as c, concurrent.futures.ThreadPoolExecutor(4) as pool:
        held = [
            pool.submit(c.post, "/invocations", json={"inputs": f"Flood {i}", "parameters": LONG}, headers=flood)
            for i in range(4)
        ]
        assert wait_for(lambda: stats(c).get("running", 0) + stats(c).get("waiting", 0) == 4, 30)
        assert_lmi_refusal(
            c.post("/invocations", json={"inputs": "More", "parameters": {"max_new_tokens": 4}}, headers=flood)
        )
        more = {"model": "tiny", "prompt": "More", "max_tokens": 4}
        assert_openai_refusal(c.post("/v1/completions", json=more, headers=flood))
        # the queue is full, but this tenant holds none of it: admitted, and served after the
        # flood's requests reach their deadline
        light = c.post(
            "/invocations",
            json={"inputs": "Light", "parameters": {"max_new_tokens": 4, "details": True}},
            headers={"X-Tenant-Id": "light"},
        )
        assert light.status_code == 200 and light.json()["details"]["generated_tokens"] == 4
        for f in held:
            assert f.result(timeout=60).status_code in (503, 504)
        assert refusals(c)["queue_full"] >= 2
