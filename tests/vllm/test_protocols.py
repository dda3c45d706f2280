"""Every protocol over a real vLLM (fp32): greedy tokens equal transformers' generate, each
protocol's bytes on the wire, its error shapes, and a disconnect that aborts in vLLM."""

from __future__ import annotations

import json
import os
import time

import grpc
import httpx
import pytest
import torch

from lmiserve.server.kserve_grpc import grpc_predict_v2_pb2 as pb
from lmiserve.server.kserve_grpc import grpc_predict_v2_pb2_grpc as pb_grpc
from tests.integration.engine_server import Reference

from .real_vllm import NAME, needs_vllm, running, sse_data, sse_json, start

pytestmark = needs_vllm

PROMPT = "The capital of France is"
OTHER = "def fibonacci(n):"
USER = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def reference(smollm2_dir) -> Reference:
    return Reference(smollm2_dir)


@pytest.fixture(scope="module")
def server(smollm2_dir, tmp_path_factory):
    with start(tmp_path_factory.mktemp("vllm") / "m", smollm2_dir, "option.dtype=fp32\n") as s:
        yield s


def post(server, path: str, body: dict, **kw) -> httpx.Response:
    with server.client() as c:
        return c.post(path, json=body, **kw)


def stream(server, path: str, body: dict) -> tuple[httpx.Response, bytes]:
    with server.client() as c:
        with c.stream("POST", path, json=body) as r:
            return r, r.read()


def test_vllm_runs_tuned_for_the_cpu_and_says_so(server):
    [model] = httpx.get(server.url + f"/models/{NAME}").json()
    engine = model["engine"]
    assert (model["backend"], engine["backend"], engine["device"]) == ("vllm", "vllm", "cpu")
    assert (engine["dtype"], engine["max_model_len"], engine["max_num_seqs"]) == ("float32", 1024, 16)
    assert (engine["tensor_parallel_size"], engine["pipeline_parallel_size"]) == (1, 1)
    tuning = engine["cpu_tuning"]
    assert "Intel OpenMP" in tuning and "KV cache" in tuning
    if len(os.sched_getaffinity(0)) < 8:
        assert "VLLM_CPU_NUM_OF_RESERVED_CPU=0" in tuning
    assert f"vLLM on the CPU, tuned as vLLM's CPU guide says: {tuning}" in server.log()


# --- LMI -----------------------------------------------------------------------------------


def test_lmi_json_with_details_equals_transformers(server, reference):
    r = post(server, "/invocations", {"inputs": PROMPT, "parameters": {"max_new_tokens": 12, "details": True}})
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    body = r.json()
    ids = reference.ids(PROMPT, 12)
    assert [t["id"] for t in body["details"]["tokens"]] == ids
    assert body["generated_text"] == reference.text(PROMPT, 12)
    assert (body["details"]["finish_reason"], body["details"]["generated_tokens"]) == ("length", 12)
    assert all(t["log_prob"] < 0 for t in body["details"]["tokens"])
    # the same through /predictions/<model>
    same = post(server, f"/predictions/{NAME}", {"inputs": PROMPT, "parameters": {"max_new_tokens": 12}})
    assert same.json() == {"generated_text": body["generated_text"]}


def test_lmi_jsonlines_stream(server, reference):
    body = {"inputs": OTHER, "parameters": {"max_new_tokens": 8}, "stream": True}
    r, raw = stream(server, "/invocations", body)
    assert r.status_code == 200 and r.headers["content-type"] == "application/jsonlines"
    lines = [json.loads(line) for line in raw.decode().splitlines()]
    assert [line["token"]["id"] for line in lines] == reference.ids(OTHER, 8)
    assert "".join(line["token"]["text"] for line in lines) == lines[-1]["generated_text"] == reference.text(OTHER, 8)


def test_lmi_sse_stream(server, reference):
    body = {"inputs": PROMPT, "parameters": {"max_new_tokens": 6, "output_formatter": "sse"}, "stream": True}
    r, raw = stream(server, "/invocations", body)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = [json.loads(d) for d in sse_data(raw)]
    assert [e["token"]["id"] for e in events] == reference.ids(PROMPT, 6)
    assert events[-1]["generated_text"] == reference.text(PROMPT, 6)


# --- TGI and MindIE ------------------------------------------------------------------------


def test_tgi_generate_and_stream(server, reference):
    r = post(server, "/generate", {"inputs": PROMPT, "parameters": {"max_new_tokens": 6, "details": True}})
    assert r.status_code == 200
    body = r.json()
    assert body["generated_text"] == reference.text(PROMPT, 6)
    assert [t["id"] for t in body["details"]["tokens"]] == reference.ids(PROMPT, 6)
    r, raw = stream(server, "/generate_stream", {"inputs": OTHER, "parameters": {"max_new_tokens": 5}})
    events = [json.loads(d) for d in sse_data(raw)]
    assert [e["token"]["id"] for e in events] == reference.ids(OTHER, 5)
    assert events[-1]["generated_text"] == reference.text(OTHER, 5)


def test_mindie_root_route(server, reference):
    r = post(server, "/", {"inputs": PROMPT, "parameters": {"max_new_tokens": 5, "details": True}})
    assert r.status_code == 200
    [body] = r.json()
    assert body["generated_text"] == reference.text(PROMPT, 5)
    assert [t["id"] for t in body["details"]["tokens"]] == reference.ids(PROMPT, 5)
    r, raw = stream(server, "/", {"inputs": PROMPT, "parameters": {"max_new_tokens": 5}, "stream": True})
    events = sse_json(raw, space=True)
    assert [i for e in events for i in e["token"]["id"]] == reference.ids(PROMPT, 5)
    assert events[-1]["generated_text"] == reference.text(PROMPT, 5)


def test_typical_p_is_applied_in_vllms_engine(server, reference):
    """MindIE's example sets typical_p. With a tiny mass the typical set is one token (the one whose
    information content is nearest the entropy, often not the most likely), so two seeds sample the
    same text, and it is transformers' own typical sampling's."""
    params = {"max_new_tokens": 6, "do_sample": True, "typical_p": 0.001, "temperature": 0.7}
    texts = [
        post(server, "/", {"inputs": PROMPT, "parameters": {**params, "seed": seed}}).json()[0]["generated_text"]
        for seed in (1, 2)
    ]
    ids = reference.tokenizer(PROMPT, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = reference.model.generate(
            ids, max_new_tokens=6, do_sample=True, typical_p=0.001, temperature=0.7, top_k=0, top_p=1.0
        )
    expected = reference.tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    assert texts == [expected, expected] and expected != reference.text(PROMPT, 6)


def test_beam_search_equals_transformers(server, reference):
    """Beam search above vLLM, as vLLM's server runs it, with transformers' scoring rules."""
    ids = reference.tokenizer(PROMPT, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = reference.model.generate(ids, max_new_tokens=6, num_beams=3, num_return_sequences=3, do_sample=False)
    expected = [reference.tokenizer.decode(row[ids.shape[1] :], skip_special_tokens=True) for row in out]
    body = {"inputs": PROMPT, "parameters": {"num_beams": 3, "max_new_tokens": 6, "details": True}}
    answer = post(server, "/invocations", body).json()
    others = [s["generated_text"] for s in answer["details"]["best_of_sequences"]]
    assert [answer["generated_text"], *others] == expected
    mindie = {"model": NAME, "prompt": PROMPT, "max_tokens": 6, "use_beam_search": True, "best_of": 3, "n": 3}
    choices = post(server, "/v1/completions", mindie).json()["choices"]
    assert [c["text"] for c in choices] == expected


def test_mindie_step_lists_are_filled(server):
    """A token each: the sequences vLLM holds as it arrives, and the first token's wait in vLLM's queue."""
    r = post(server, "/v1/completions", {"model": NAME, "prompt": PROMPT, "max_tokens": 4, "temperature": 0})
    usage = r.json()["usage"]
    assert usage["completion_tokens"] == 4
    assert len(usage["batch_size"]) == len(usage["queue_wait_time"]) == 4
    assert all(b >= 1 for b in usage["batch_size"]) and usage["queue_wait_time"][1:] == [0, 0, 0]
    assert isinstance(usage["queue_wait_time"][0], int) and usage["queue_wait_time"][0] >= 0


# --- OpenAI --------------------------------------------------------------------------------


def test_openai_completions_logprobs_n_and_stop(server, reference):
    body = {"model": NAME, "prompt": PROMPT, "max_tokens": 10, "temperature": 0, "logprobs": 2}
    r = post(server, "/v1/completions", body)
    assert r.status_code == 200
    [choice] = r.json()["choices"]
    assert choice["text"] == reference.text(PROMPT, 10) and choice["finish_reason"] == "length"
    assert len(choice["logprobs"]["tokens"]) == 10
    assert all(len(top) == 2 for top in choice["logprobs"]["top_logprobs"])
    for token, lp, top in zip(
        choice["logprobs"]["tokens"], choice["logprobs"]["token_logprobs"], choice["logprobs"]["top_logprobs"]
    ):
        assert top[token] == pytest.approx(lp) and lp == pytest.approx(max(top.values()))

    sampled = post(server, "/v1/completions", {**body, "n": 3, "temperature": 1.0, "seed": 5, "logprobs": None})
    choices = sorted(sampled.json()["choices"], key=lambda c: c["index"])
    assert [c["index"] for c in choices] == [0, 1, 2] and all(c["finish_reason"] == "length" for c in choices)
    again = post(server, "/v1/completions", {**body, "n": 3, "temperature": 1.0, "seed": 5, "logprobs": None})
    assert [c["text"] for c in sorted(again.json()["choices"], key=lambda c: c["index"])] == [
        c["text"] for c in choices
    ]

    full = reference.text(PROMPT, 10)
    cut = full.split()[1]
    stopped = post(server, "/v1/completions", {**body, "stop": [cut], "logprobs": None}).json()["choices"][0]
    assert stopped["finish_reason"] == "stop" and stopped["text"] == full[: full.index(cut)]


def test_openai_completions_stream(server, reference):
    body = {"model": NAME, "prompt": OTHER, "max_tokens": 7, "temperature": 0, "stream": True}
    r, raw = stream(server, "/v1/completions", body)
    assert r.headers["content-type"].startswith("text/event-stream")
    data = sse_data(raw)
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == reference.text(OTHER, 7)


def test_a_strict_function_reaches_vllm_as_a_structural_tag(server):
    """vLLM takes the structural tag lmiserve builds for strict functions under tool_choice auto."""
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    tool = {"type": "function", "function": {"name": "get_weather", "strict": True, "parameters": schema}}
    body = {"model": NAME, "messages": USER, "tools": [tool], "tool_choice": "auto", "max_tokens": 8, "temperature": 0}
    r = post(server, "/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    message = r.json()["choices"][0]["message"]
    for call in message.get("tool_calls") or []:
        assert "city" in json.loads(call["function"]["arguments"])


def test_openai_chat_equals_the_chat_template(server, reference):
    r = post(server, "/v1/chat/completions", {"model": NAME, "messages": USER, "max_tokens": 12, "temperature": 0})
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["content"] == reference.chat_text(USER, 12)
    prompt = reference.tokenizer(reference.chat_prompt(USER), add_special_tokens=False)["input_ids"]
    assert body["usage"]["prompt_tokens"] == len(prompt)

    body = {"model": NAME, "messages": USER, "max_tokens": 8, "temperature": 0, "stream": True, "logprobs": True}
    r, raw = stream(server, "/v1/chat/completions", {**body, "top_logprobs": 2})
    chunks = sse_json(raw)
    deltas = [c["choices"][0] for c in chunks if c["choices"]]
    assert deltas[0]["delta"]["role"] == "assistant"
    assert "".join(d["delta"].get("content") or "" for d in deltas) == reference.chat_text(USER, 8)
    tops = [entry["top_logprobs"] for d in deltas if d.get("logprobs") for entry in d["logprobs"]["content"]]
    assert len(tops) == 8 and all(len(top) == 2 for top in tops)


# --- Databricks and KServe V2 -------------------------------------------------------------


def test_databricks_chat(server, reference):
    r = post(server, f"/serving-endpoints/{NAME}/invocations", {"messages": USER, "max_tokens": 8, "temperature": 0})
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "chat.completions"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": reference.chat_text(USER, 8)}


def test_kserve_v2_generate_and_grpc(server, reference):
    body = {"text_input": PROMPT, "parameters": {"max_tokens": 6, "temperature": 0}}
    r = post(server, f"/v2/models/{NAME}/generate", body)
    assert r.json() == {"model_name": NAME, "model_version": "1", "text_output": reference.text(PROMPT, 6)}
    r, raw = stream(server, f"/v2/models/{NAME}/generate_stream", body)
    assert "".join(e["text_output"] for e in sse_json(raw)) == reference.text(PROMPT, 6)

    # gRPC, with the generated code on vLLM's protobuf
    address = "127.0.0.1:" + grpc_port(server)
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        assert stub.ModelReady(pb.ModelReadyRequest(name=NAME), timeout=30).ready
        request = pb.ModelInferRequest(model_name=NAME, id="g")
        tensor = request.inputs.add(name="text_input", datatype="BYTES", shape=[1])
        tensor.contents.bytes_contents.append(PROMPT.encode())
        request.parameters["max_new_tokens"].int64_param = 6
        response = stub.ModelInfer(request, timeout=120)
    assert [b.decode() for b in response.outputs[0].contents.bytes_contents] == [reference.text(PROMPT, 6)]


def grpc_port(server) -> str:
    for line in server.log().splitlines():
        if "KServe V2 gRPC" in line:
            return line.rsplit(":", 1)[-1].strip()
    raise AssertionError("the server did not say its gRPC port")


# --- refusals and disconnects --------------------------------------------------------------


def test_refusals_in_each_protocols_shape(server, reference):
    too_long = " ".join(["word"] * 1100)
    r = post(server, "/v1/completions", {"model": NAME, "prompt": too_long, "max_tokens": 4})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == 400 and error["message"]
    r = post(server, "/invocations", {"inputs": PROMPT, "parameters": {"stop": True, "max_new_tokens": 4}})
    assert r.status_code == 400 and r.json()["details"]["finish_reason"] == "error"
    r = post(server, "/generate", {"inputs": too_long, "parameters": {"max_new_tokens": 4}})
    assert r.status_code == 422 and r.json()["error_type"] == "validation"
    r = post(server, f"/v2/models/{NAME}/generate", {"text_input": PROMPT, "parameters": {"max_tokens": -1}})
    assert r.status_code == 400 and "error" in r.json()
    # the server goes on serving
    assert post(server, "/generate", {"inputs": PROMPT, "parameters": {"max_new_tokens": 3}}).json() == {
        "generated_text": reference.text(PROMPT, 3)
    }


def wait_until_idle(server, timeout: float = 60) -> int:
    deadline = time.monotonic() + timeout
    while (count := running(server)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return count


def test_client_disconnect_aborts_in_vllm(server):
    body = {"inputs": PROMPT, "parameters": {"max_new_tokens": 900, "ignore_eos_token": True}, "stream": True}

    def one_running() -> None:
        assert running(server) == 1

    server.hang_up_stream("/invocations", body, one_running)
    assert wait_until_idle(server) == 0  # vLLM itself no longer holds the request

    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/invocations", json={**body, "stream": False}, timeout=2)
    assert wait_until_idle(server) == 0
