"""``GET /metrics`` of the real server on a tiny random Llama: request counts, generation
histograms and token counters against what the responses reported, engine state, restarts."""

import json
import os
import signal
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from .engine_server import start

pytestmark = pytest.mark.serial

PROMPTS = ["What is Deep Learning?", "The quick brown fox jumps over the lazy dog.", "Numbers: 1 2 3"]
LONG_PROMPT = "A paged KV cache shares the blocks of a common prompt prefix between requests. " * 4
GENERATION_FAMILIES = (
    "lmiserve_time_to_first_token_seconds",
    "lmiserve_e2e_request_latency_seconds",
    "lmiserve_queue_time_seconds",
)


@pytest.fixture(scope="module")
def server(tiny_llama_dir, tmp_path_factory):
    with start(tmp_path_factory.mktemp("metrics") / "m", tiny_llama_dir) as s:
        yield s.wait_ready()


def scrape(client, path: str = "/metrics") -> dict:
    r = client.get(path)
    assert r.status_code == 200
    assert r.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    return {f.name: f for f in text_string_to_metric_families(r.text)}


def value(families: dict, family: str, sample: str | None = None, **labels) -> float:
    """The sample of ``family`` (named ``sample``, default the family's own) with exactly ``labels``."""
    name = sample or family
    for s in families[family].samples:
        if s.name == name and s.labels == labels:
            return s.value
    return 0.0


def total(families: dict, family: str, sample: str, **labels) -> float:
    """Sum of the samples named ``sample`` whose labels include ``labels``."""
    return sum(
        s.value
        for s in families[family].samples
        if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items())
    )


def test_metrics_mirror_the_requests_served(server, tiny_tokenizer):
    generated, prompt_tokens, reasons = [], [], []
    with server.client() as c:
        for prompt in PROMPTS[:2]:
            r = c.post("/invocations", json={"inputs": prompt, "parameters": {"max_new_tokens": 8, "details": True}})
            assert r.status_code == 200
            assert int(r.headers["x-generated-tokens"]) == r.json()["details"]["generated_tokens"]
            generated.append(r.json()["details"]["generated_tokens"])
            reasons.append(r.json()["details"]["finish_reason"])
            prompt_tokens.append(len(tiny_tokenizer(prompt)["input_ids"]))
        r = c.post(
            "/predictions/tiny", json={"inputs": PROMPTS[2], "parameters": {"max_new_tokens": 8, "details": True}}
        )
        assert r.status_code == 200
        generated.append(r.json()["details"]["generated_tokens"])
        reasons.append(r.json()["details"]["finish_reason"])
        prompt_tokens.append(len(tiny_tokenizer(PROMPTS[2])["input_ids"]))
        with c.stream(
            "POST",
            "/invocations",
            json={"inputs": PROMPTS[0], "parameters": {"max_new_tokens": 8, "details": True}, "stream": True},
        ) as r:
            assert r.status_code == 200
            lines = [json.loads(x) for x in r.iter_lines() if x]
        generated.append(lines[-1]["details"]["generated_tokens"])
        reasons.append(lines[-1]["details"]["finish_reason"])
        prompt_tokens.append(len(tiny_tokenizer(PROMPTS[0])["input_ids"]))
        # a bad parameter value: LMI's documented error response, 400
        assert c.post("/invocations", json={"inputs": "x", "parameters": {"top_p": 2}}).status_code == 400
        assert c.get("/no/such/path").status_code == 404
        families = scrape(c)
        again = scrape(c, "/server/metrics")

    finished = len(generated)
    requests = families["lmiserve_requests"]
    assert (
        value(
            families, "lmiserve_requests", "lmiserve_requests_total", model="tiny", route="/invocations", status="200"
        )
        == 3
    )
    assert (
        value(
            families, "lmiserve_requests", "lmiserve_requests_total", model="tiny", route="/invocations", status="400"
        )
        == 1
    )
    assert (
        value(
            families,
            "lmiserve_requests",
            "lmiserve_requests_total",
            model="tiny",
            route="/predictions/{model_name}",
            status="200",
        )
        == 1
    )
    assert (
        value(families, "lmiserve_requests", "lmiserve_requests_total", model="", route="unmatched", status="404") == 1
    )
    assert total(families, "lmiserve_requests", "lmiserve_requests_total", route="/ping", status="200") >= 1
    assert not any("/no/such/path" in s.labels.get("route", "") for s in requests.samples)
    assert (
        value(
            families,
            "lmiserve_request_duration_seconds",
            "lmiserve_request_duration_seconds_count",
            model="tiny",
            route="/invocations",
        )
        == 4
    )

    for family in GENERATION_FAMILIES:
        assert value(families, family, family + "_count", model="tiny") == finished, family
    itl = value(
        families, "lmiserve_inter_token_latency_seconds", "lmiserve_inter_token_latency_seconds_count", model="tiny"
    )
    assert 0 < itl <= sum(generated) - finished
    assert value(families, "lmiserve_generation_tokens", "lmiserve_generation_tokens_total", model="tiny") == sum(
        generated
    )
    assert value(families, "lmiserve_prompt_tokens", "lmiserve_prompt_tokens_total", model="tiny") == sum(prompt_tokens)
    for reason in set(reasons):
        assert value(
            families, "lmiserve_request_success", "lmiserve_request_success_total", model="tiny", finish_reason=reason
        ) == reasons.count(reason)
    assert total(families, "lmiserve_request_success", "lmiserve_request_success_total", model="tiny") == finished

    usage = value(families, "lmiserve_kv_cache_usage_ratio", model="tiny")
    assert "lmiserve_kv_cache_usage_ratio" in families and 0 <= usage <= 1
    assert value(families, "lmiserve_kv_cache_blocks_total", model="tiny") > 0
    assert value(families, "lmiserve_requests_running", model="tiny") == 0
    assert value(families, "lmiserve_requests_waiting", model="tiny") == 0
    assert "lmiserve_preemptions" in families and "lmiserve_prefix_cache_hit_tokens" in families
    steps = "lmiserve_engine_steps", "lmiserve_engine_steps_total"
    assert value(families, *steps, model="tiny", mode="eager") > 0  # the CPU runs no graphs
    assert value(families, *steps, model="tiny", mode="graph") == 0

    # /server/metrics: the same families; only the HTTP request series and the API process's CPU
    # moved (the scrape itself)
    assert {(f.name, f.type) for f in again.values()} == {(f.name, f.type) for f in families.values()}
    cpu = "lmiserve_api_cpu_seconds", "lmiserve_api_cpu_seconds_total"
    assert 0 < value(families, *cpu, model="") <= value(again, *cpu, model="")
    for name, family in families.items():
        if not name.startswith(("lmiserve_requests", "lmiserve_request_duration", "lmiserve_api_cpu")):
            assert again[name].samples == family.samples, name


def hits(client) -> float:
    return value(
        scrape(client), "lmiserve_prefix_cache_hit_tokens", "lmiserve_prefix_cache_hit_tokens_total", model="tiny"
    )


def test_engine_counters_survive_an_engine_restart(server):
    body = {"inputs": LONG_PROMPT, "parameters": {"max_new_tokens": 2, "details": True}}
    with server.client() as c:
        for _ in range(2):
            assert c.post("/invocations", json=body).status_code == 200
        before = hits(c)
        assert before > 0  # the second request found the prompt's blocks in the prefix cache
        generated = value(scrape(c), "lmiserve_generation_tokens", "lmiserve_generation_tokens_total", model="tiny")

        pid = c.get("/models/tiny").json()[0]["enginePid"]
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            described = c.get("/models/tiny").json()[0]
            if described["status"] == "Healthy" and described["enginePid"] not in (None, pid):
                break
            time.sleep(0.2)
        assert described["enginePid"] != pid and described["status"] == "Healthy"
        assert hits(c) == before  # the new engine counts from zero; the counter does not

        after_restart = [c.post("/invocations", json=body) for _ in range(2)]
        assert all(r.status_code == 200 for r in after_restart)
        families = scrape(c)
    assert (
        value(families, "lmiserve_prefix_cache_hit_tokens", "lmiserve_prefix_cache_hit_tokens_total", model="tiny")
        > before
    )
    assert value(
        families, "lmiserve_generation_tokens", "lmiserve_generation_tokens_total", model="tiny"
    ) == generated + sum(r.json()["details"]["generated_tokens"] for r in after_restart)
