"""option.rolling_batch=vllm behind the real server, with the fake vllm package on the server
process's path only (see vllm_server): bytes on the wire, status codes and what vLLM was asked."""

from __future__ import annotations

import importlib.util
import json
import time

import httpx
import pytest

from tests.server_process import ServerProcess

from .vllm_server import (
    OTHER,
    PROMPT,
    FakeLog,
    fake_ids,
    fake_logprob,
    running_gauge,
    server_env,
    serving_dir,
    sse_data,
)

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is not None, reason="a real vllm is installed; these tests need it absent"
)


@pytest.fixture(scope="module")
def vocab_size(tiny_llama_dir) -> int:
    return int(json.loads((tiny_llama_dir / "config.json").read_text())["vocab_size"])


@pytest.fixture(scope="module")
def expected(tiny_tokenizer, vocab_size):
    """What the fake generates for a prompt: (token ids, text)."""

    def make(prompt: str | list[int], count: int, seed: int = 0) -> tuple[list[int], str]:
        prompt_ids = tiny_tokenizer(prompt)["input_ids"] if isinstance(prompt, str) else prompt
        ids = fake_ids(prompt_ids, count, vocab_size, seed)
        return ids, tiny_tokenizer.decode(ids, skip_special_tokens=True)

    return make


# --- one server for the protocols, parameters, refusals and disconnects ------------------------


@pytest.fixture(scope="module")
def fake_log(tmp_path_factory) -> FakeLog:
    return FakeLog(tmp_path_factory.mktemp("vllm-log") / "events.jsonl")


@pytest.fixture(scope="module")
def server(tiny_llama_dir, tmp_path_factory, fake_log):
    extra = (
        "option.dtype=fp16\noption.max_model_len=256\noption.max_rolling_batch_size=8\n"
        "option.max_rolling_batch_prefill_tokens=64\noption.block_size=32\noption.gpu_memory_utilization=0.5\n"
        "option.enable_prefix_caching=false\n"
    )
    root = serving_dir(tmp_path_factory.mktemp("vllm") / "m", tiny_llama_dir, extra)
    with ServerProcess(root, env=server_env(log=fake_log.path, delay=0.02)) as s:
        yield s.wait_ready()


def post(server: ServerProcess, path: str, body: dict) -> httpx.Response:
    with server.client() as c:
        return c.post(path, json=body)


def test_settings_become_vllm_engine_args_and_engine_info(server, fake_log, tiny_llama_dir):
    [event] = fake_log.events("engine_args")
    args = event["args"]
    assert args["model"] == args["tokenizer"] == str(tiny_llama_dir)
    assert (args["dtype"], args["max_model_len"], args["max_num_seqs"]) == ("float16", 256, 8)
    assert (args["max_num_batched_tokens"], args["block_size"]) == (64, 32)
    assert (args["gpu_memory_utilization"], args["enable_prefix_caching"]) == (0.5, False)
    assert args["tensor_parallel_size"] == 1
    [model] = httpx.get(server.url + "/models/tiny").json()
    assert model["status"] == "Healthy" and model["backend"] == "vllm"
    engine = model["engine"]
    assert engine["backend"] == "vllm" and engine["vllm_version"] == "0.0.0+fake"
    wanted = {"dtype": "float16", "max_model_len": 256, "max_num_seqs": 8, "block_size": 32}
    assert {k: engine[k] for k in wanted} == wanted
    assert httpx.get(server.url + "/info").json()["max_total_tokens"] == 256


def test_lmi_invocations(server, fake_log, expected, tiny_tokenizer):
    mark = fake_log.mark()
    r = post(server, "/invocations", {"inputs": PROMPT, "parameters": {"max_new_tokens": 8, "details": True}})
    ids, text = expected(PROMPT, 8)
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    body = r.json()
    assert body["generated_text"] == text == "`abcdefg"
    details = body["details"]
    assert (details["finish_reason"], details["generated_tokens"]) == ("length", 8)
    assert [t["id"] for t in details["tokens"]] == ids
    assert [t["log_prob"] for t in details["tokens"]] == [fake_logprob(t) for t in ids]
    [generate] = fake_log.events("generate", mark)
    assert generate["prompt_token_ids"] == tiny_tokenizer(PROMPT)["input_ids"]
    wanted = {"n": 1, "max_tokens": 8, "temperature": 0.0, "top_k": -1, "top_p": 1.0, "seed": None, "stop": None}
    assert {k: generate["params"][k] for k in wanted} == wanted
    assert (generate["params"]["detokenize"], generate["params"]["output_kind"]) == (False, "DELTA")


def test_lmi_jsonlines_stream(server, expected):
    with server.client() as c:
        with c.stream(
            "POST", "/invocations", json={"inputs": PROMPT, "parameters": {"max_new_tokens": 5}, "stream": True}
        ) as r:
            assert r.status_code == 200 and r.headers["content-type"] == "application/jsonlines"
            raw = r.read()
    ids, text = expected(PROMPT, 5)
    assert raw.endswith(b"\n")
    lines = [json.loads(line) for line in raw.decode().splitlines()]
    assert [line["token"]["id"] for line in lines] == ids
    assert "".join(line["token"]["text"] for line in lines) == lines[-1]["generated_text"] == text
    assert all("generated_text" not in line for line in lines[:-1])


def test_openai_completions_stream(server, expected):
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 6, "temperature": 0, "stream": True}
    with server.client() as c:
        with c.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            data = sse_data(r.read())
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert all(c["object"] == "text_completion" and c["model"] == "tiny" for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == expected(PROMPT, 6)[1]
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"


def test_openai_chat_stream(server, fake_log, expected, tiny_tokenizer):
    messages = [{"role": "user", "content": "Hello"}]
    mark = fake_log.mark()
    body = {"model": "tiny", "messages": messages, "max_tokens": 6, "temperature": 0, "stream": True}
    with server.client() as c:
        with c.stream("POST", "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            data = sse_data(r.read())
    [generate] = fake_log.events("generate", mark)
    prompt_ids = generate["prompt_token_ids"]
    assert tiny_tokenizer.decode(prompt_ids) == tiny_tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False
    )
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert deltas[0]["role"] == "assistant"
    assert "".join(d.get("content") or "" for d in deltas) == expected(prompt_ids, 6)[1]
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"


def test_tgi_generate_stream(server, expected):
    body = {"inputs": OTHER, "parameters": {"max_new_tokens": 4, "details": True}}
    with server.client() as c:
        with c.stream("POST", "/generate_stream", json=body) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            data = sse_data(r.read())
    events = [json.loads(d) for d in data]
    ids, text = expected(OTHER, 4)
    assert text == "FGHI"
    assert [e["token"]["id"] for e in events] == ids
    assert "".join(e["token"]["text"] for e in events) == events[-1]["generated_text"] == text
    assert events[-1]["details"]["finish_reason"] == "length" and events[-1]["details"]["generated_tokens"] == 4


def test_sampling_parameters_reach_vllm(server, fake_log, expected):
    mark = fake_log.mark()
    parameters = {"do_sample": True, "temperature": 0.7, "top_p": 0.9, "top_k": 5, "seed": 42, "max_new_tokens": 5}
    r = post(server, "/invocations", {"inputs": PROMPT, "parameters": parameters})
    assert r.status_code == 200 and r.json() == {"generated_text": expected(PROMPT, 5, seed=42)[1]}
    [generate] = fake_log.events("generate", mark)
    params = generate["params"]
    assert {k: params[k] for k in ("temperature", "top_p", "top_k", "seed", "max_tokens", "n")} == {
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 5,
        "seed": 42,
        "max_tokens": 5,
        "n": 1,
    }


def test_each_sequence_is_its_own_vllm_request(server, fake_log, expected):
    mark = fake_log.mark()
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 4, "n": 2, "temperature": 0.8, "seed": 7}
    r = post(server, "/v1/completions", body)
    assert r.status_code == 200
    texts = [c["text"] for c in sorted(r.json()["choices"], key=lambda c: c["index"])]
    assert texts == [expected(PROMPT, 4, seed=7)[1], expected(PROMPT, 4, seed=8)[1]]
    generates = fake_log.events("generate", mark)
    assert len({g["request_id"].split("#")[0] for g in generates}) == 1
    assert sorted((g["request_id"].split("#")[1], g["params"]["seed"], g["params"]["n"]) for g in generates) == [
        ("0", 7, 1),
        ("1", 8, 1),
    ]

    # best_of: every candidate is a vLLM request; lmiserve returns the most likely one
    mark = fake_log.mark()
    r = post(server, "/v1/completions", {**body, "max_tokens": 3, "n": 1, "best_of": 3})
    assert r.status_code == 200
    [choice] = r.json()["choices"]
    generates = fake_log.events("generate", mark)
    assert sorted((g["params"]["seed"], g["params"]["n"]) for g in generates) == [(7, 1), (8, 1), (9, 1)]
    candidates = {seed: expected(PROMPT, 3, seed=seed) for seed in (7, 8, 9)}
    best = max(candidates, key=lambda seed: sum(fake_logprob(t) for t in candidates[seed][0]))
    assert choice["text"] == candidates[best][1]
    assert len({sum(fake_logprob(t) for t in ids) for ids, _ in candidates.values()}) > 1


def test_stop_strings_are_applied_by_lmiserve(server, fake_log):
    mark = fake_log.mark()
    r = post(
        server,
        "/invocations",
        {"inputs": PROMPT, "parameters": {"max_new_tokens": 100, "stop_sequences": ["def"], "details": True}},
    )
    assert r.status_code == 200
    body = r.json()
    assert body["generated_text"] == "`abc" and body["details"]["finish_reason"] == "stop_sequence"
    [generate] = fake_log.events("generate", mark)
    assert generate["params"]["stop"] is None and generate["params"]["max_tokens"] == 100
    fake_log.wait_for("abort", generate["request_id"])  # vLLM stops generating what was cut

    # each sequence is cut, and aborted in vLLM, on its own
    mark = fake_log.mark()
    body = {"model": "tiny", "prompt": OTHER, "max_tokens": 100, "stop": ["JK"], "n": 2, "temperature": 1, "seed": 1}
    r = post(server, "/v1/completions", body)
    assert r.status_code == 200
    choices = sorted(r.json()["choices"], key=lambda c: c["index"])
    assert [(c["text"], c["finish_reason"]) for c in choices] == [("GHI", "stop"), ("HI", "stop")]
    generates = fake_log.events("generate", mark)
    assert [g["params"]["stop"] for g in generates] == [None, None]
    for generate in generates:
        fake_log.wait_for("abort", generate["request_id"])


def test_client_disconnect_aborts_the_vllm_request(server, fake_log):
    mark = fake_log.mark()
    body = {"inputs": PROMPT, "parameters": {"max_new_tokens": 240, "ignore_eos_token": True}, "stream": True}

    def one_running() -> None:
        assert running_gauge(server) == 1
        assert httpx.get(server.url + "/models/tiny").json()[0]["stats"]["running"] == 1

    server.hang_up_stream("/invocations", body, one_running)
    [generate] = fake_log.events("generate", mark)
    fake_log.wait_for("abort", generate["request_id"])
    fake_log.wait_for("closed", generate["request_id"])
    deadline = time.monotonic() + 30
    while running_gauge(server) != 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert running_gauge(server) == 0

    # a client that gives up on a non-streaming request
    mark = fake_log.mark()
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/invocations", json={**body, "stream": False}, timeout=1)
    [generate] = fake_log.events("generate", mark)
    fake_log.wait_for("abort", generate["request_id"])
    assert post(server, "/invocations", {"inputs": OTHER, "parameters": {"max_new_tokens": 2}}).json() == {
        "generated_text": "FG"
    }


def test_requests_vllm_refuses_answer_each_protocols_4xx(server, fake_log):
    mark = fake_log.mark()
    # refused by the vllm backend before vLLM sees it
    typical = {"do_sample": True, "typical_p": 0.5, "max_new_tokens": 4}  # this fake vLLM has no extra_args
    r = post(server, "/invocations", {"inputs": PROMPT, "parameters": typical})
    assert r.status_code == 400  # LMI's documented error response for a request it cannot serve
    assert r.json() == {
        "generated_text": "",
        "details": {"finish_reason": "error", "generated_tokens": None, "inputs": None, "tokens": None},
    }
    assert fake_log.events("generate", mark) == []
    # refused by vLLM's SamplingParams
    r = post(server, "/v1/completions", {"model": "tiny", "prompt": PROMPT, "max_tokens": 4, "min_tokens": 10})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == 400
    assert error["message"] == "min_tokens must be in [0, max_tokens], got 10."
    # refused by vLLM's engine when the request is added, streaming and not
    grammar = {"type": "regex", "value": "(["}
    for path in ("/generate", "/generate_stream"):
        r = post(server, path, {"inputs": PROMPT, "parameters": {"max_new_tokens": 4, "grammar": grammar}})
        assert r.status_code == 422 and r.headers["content-type"] == "application/json"
        body = r.json()
        assert body["error_type"] == "validation"
        assert body["error"].startswith("Failed to transform regex into a grammar")
    assert post(server, "/invocations", {"inputs": OTHER, "parameters": {"max_new_tokens": 3}}).json() == {
        "generated_text": "FGH"
    }


def test_beam_search_runs_above_vllm_one_token_a_step(server, fake_log):
    mark = fake_log.mark()
    r = post(
        server, "/invocations", {"inputs": PROMPT, "parameters": {"num_beams": 2, "max_new_tokens": 3, "details": True}}
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["details"]["generated_tokens"] == 3 and len(body["details"]["best_of_sequences"]) == 1
    steps = fake_log.events("generate", mark)
    assert len(steps) == 1 + 2 + 2  # one beam, then two, for three tokens
    assert all(s["params"]["max_tokens"] == 1 and s["params"]["logprobs"] == 4 for s in steps)
    assert steps[-1]["prompt_token_ids"][:-2] == steps[0]["prompt_token_ids"]
