"""Speculative decoding over the real server: the text of every protocol is the text without it,
a request can opt out, and the counts reach /metrics and the model's description."""

from __future__ import annotations

import json

import pytest

from tests.integration.engine_server import Reference, start

NGRAM = {
    "method": "ngram",
    "num_speculative_tokens": 3,
    "prompt_lookup_min": 1,
    "prompt_lookup_max": 2,
    "adaptive": False,
}
PROMPT = "the cat sat on the mat . the cat sat on the mat . the cat sat on the"


@pytest.fixture(scope="module")
def server(tiny_llama_dir, tmp_path_factory):
    extra = f"option.speculative_config={json.dumps(NGRAM)}\n"
    with start(tmp_path_factory.mktemp("spec") / "m", tiny_llama_dir, extra) as s:
        yield s.wait_ready()


@pytest.fixture(scope="module")
def reference(tiny_llama_dir):
    return Reference(tiny_llama_dir)


def _described(server) -> dict:
    with server.client() as c:
        body = c.get("/models/tiny").json()
    models = body if isinstance(body, list) else [body]
    return models[0]["speculative"]


def test_texts_equal_greedy_without_speculation_and_counts_reported(server, reference):
    before = _described(server)
    assert before["method"] == "ngram" and before["num_speculative_tokens"] == 3
    expected = reference.text(PROMPT, 24)
    with server.client() as c:
        lmi = c.post("/invocations", json={"inputs": PROMPT, "parameters": {"max_new_tokens": 24}})
        assert lmi.status_code == 200, lmi.text
        assert lmi.json()["generated_text"] == expected
        tgi = c.post("/generate", json={"inputs": PROMPT, "parameters": {"max_new_tokens": 24}})
        assert tgi.json()["generated_text"] == expected
        chunks = c.post(
            "/v1/completions",
            json={"model": "tiny", "prompt": PROMPT, "max_tokens": 24, "temperature": 0, "stream": True},
        )
        text = "".join(
            json.loads(line[6:])["choices"][0]["text"]
            for line in chunks.text.splitlines()
            if line.startswith("data: {")
        )
        assert text == expected
        metrics = c.get("/metrics").text
    after = _described(server)
    assert after["drafts"] > before["drafts"]
    assert after["proposed_tokens"] >= after["accepted_tokens"] > before["accepted_tokens"]
    assert after["mean_accepted_length"] == pytest.approx(1 + after["accepted_tokens"] / after["drafts"])
    lines = [ln for ln in metrics.splitlines() if ln.startswith("lmiserve_spec_")]
    assert any(ln.startswith('lmiserve_spec_drafts_total{model="tiny"}') for ln in lines), lines


def test_a_request_opts_out(server, reference):
    before = _described(server)["drafts"]
    with server.client() as c:
        r = c.post("/invocations", json={"inputs": PROMPT, "parameters": {"max_new_tokens": 16, "speculate": False}})
        assert r.json()["generated_text"] == reference.text(PROMPT, 16)
        bad = c.post("/invocations", json={"inputs": PROMPT, "parameters": {"speculate": "sometimes"}})
        assert bad.status_code == 424 and "speculate" in bad.text  # LMI's status for a refused input
    assert _described(server)["drafts"] == before
