"""The rolling-batch engine behind the real server, on a tiny random Llama."""

import concurrent.futures
import json
import time

import pytest
import torch

from tests.server_process import ServerProcess

PROMPTS = ["What is Deep Learning?", "The quick brown fox jumps over the lazy dog.", "Numbers: 1 2 3"]


@pytest.fixture(scope="module")
def reference(tiny_llama_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_llama_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()

    def generate(prompt: str, n: int) -> str:
        ids = tok(prompt, return_tensors="pt")["input_ids"]
        out = model.generate(ids, max_new_tokens=n, do_sample=False)
        return tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True)

    generate.tokenizer = tok
    generate.model = model
    return generate


def serving_dir(root, model_dir, extra=""):
    root.mkdir(exist_ok=True)
    (root / "serving.properties").write_text(
        f"model_name=tiny\noption.model_id={model_dir}\noption.rolling_batch=lmi\noption.dtype=fp32\n"
        "option.max_model_len=256\noption.max_rolling_batch_prefill_tokens=32\n" + extra
    )
    return root


@pytest.fixture(scope="module")
def server(tiny_llama_dir, tmp_path_factory):
    with ServerProcess(serving_dir(tmp_path_factory.mktemp("rolling") / "m", tiny_llama_dir)) as s:
        yield s.wait_ready()


def post(server, body, **kw):
    with server.client() as c:
        return c.post("/invocations", json=body, **kw)


def test_greedy_text_equals_generate(server, reference):
    for prompt in PROMPTS:
        r = post(server, {"inputs": prompt, "parameters": {"max_new_tokens": 20}})
        assert r.status_code == 200 and r.headers["content-type"] == "application/json"
        assert r.json() == {"generated_text": reference(prompt, 20)}


def test_details_and_prefill(server, reference):
    prompt = PROMPTS[0]
    r = post(
        server, {"inputs": prompt, "parameters": {"max_new_tokens": 12, "details": True, "decoder_input_details": True}}
    )
    body = r.json()
    details = body["details"]
    assert details["inputs"] == prompt
    assert details["finish_reason"] in ("length", "eos_token")
    assert details["generated_tokens"] == len(details["tokens"]) <= 12
    assert "".join(t["text"] for t in details["tokens"]) == body["generated_text"] == reference(prompt, 12)
    assert all(t["log_prob"] <= 0 for t in details["tokens"])
    prompt_ids = reference.tokenizer(prompt)["input_ids"]
    assert [t["id"] for t in details["prefill"]] == prompt_ids
    assert details["prefill"][0]["log_prob"] is None and all(t["log_prob"] <= 0 for t in details["prefill"][1:])


def test_streamed_text_equals_final_text(server, reference):
    with server.client() as c:
        with c.stream(
            "POST",
            "/invocations",
            json={"inputs": PROMPTS[1], "parameters": {"max_new_tokens": 16, "details": True}, "stream": True},
        ) as r:
            assert r.headers["content-type"] == "application/jsonlines"
            lines = [json.loads(x) for x in r.iter_lines() if x]
    assert all("token" in line for line in lines)
    final = lines[-1]
    assert final["generated_text"] == "".join(line["token"]["text"] for line in lines) == reference(PROMPTS[1], 16)
    assert final["details"]["generated_tokens"] == len(lines)
    assert all("generated_text" not in line for line in lines[:-1])


def test_sse_per_request(server):
    with server.client() as c:
        r = c.post(
            "/invocations",
            json={"inputs": PROMPTS[2], "parameters": {"max_new_tokens": 4, "output_formatter": "sse"}, "stream": True},
        )
    assert r.headers["content-type"].startswith("text/event-stream")
    events = [e for e in r.text.split("\n\n") if e]
    assert all(e.startswith("data:") for e in events) and "generated_text" in events[-1]


def test_stop_sequences(server, reference):
    full = reference(PROMPTS[0], 20)
    stop = full[4:7]
    r = post(
        server, {"inputs": PROMPTS[0], "parameters": {"max_new_tokens": 20, "stop_sequences": [stop], "details": True}}
    )
    body = r.json()
    assert body["generated_text"] == full[: full.index(stop)]
    assert body["details"]["finish_reason"] == "stop_sequence"


def test_concurrent_requests_each_match_their_own_run(server, reference):
    jobs = [(PROMPTS[i % 3], 5 + 3 * i) for i in range(6)]
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        results = list(
            pool.map(lambda j: post(server, {"inputs": j[0], "parameters": {"max_new_tokens": j[1]}}).json(), jobs)
        )
    assert results == [{"generated_text": reference(p, n)} for p, n in jobs]


def test_seeded_sampling_is_reproducible_in_any_batch(server):
    body = {
        "inputs": PROMPTS[0],
        "parameters": {"max_new_tokens": 12, "do_sample": True, "temperature": 0.9, "top_p": 0.95, "seed": 11},
    }
    alone = post(server, body).json()
    others = [{"inputs": p, "parameters": {"max_new_tokens": 20, "do_sample": True}} for p in PROMPTS]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(post, server, b) for b in others] + [pool.submit(post, server, body)]
        together = futures[-1].result().json()
    assert together == alone
    body["parameters"]["seed"] = 12
    assert post(server, body).json() != alone


def test_best_of_sequences(server):
    r = post(
        server,
        {
            "inputs": PROMPTS[0],
            "parameters": {"max_new_tokens": 6, "do_sample": True, "n": 3, "details": True, "seed": 1},
        },
    )
    details = r.json()["details"]
    assert len(details["best_of_sequences"]) == 2
    assert all(
        set(s) >= {"finish_reason", "generated_tokens", "tokens", "generated_text"}
        for s in details["best_of_sequences"]
    )


@pytest.mark.parametrize(
    "body,fragment",
    [
        ({"inputs": "x", "parameters": {"top_p": 2}}, "top_p"),
        ({"inputs": "word " * 400}, "max_model_len"),
        ({"inputs": "x", "parameters": {"n": 2}, "stream": True}, "without streaming"),
    ],
)
def test_bad_values_answer_the_documents_error_response_before_inference(server, body, fragment):
    r = post(server, body)
    assert r.status_code == 400
    if body.get("stream"):
        assert r.headers["content-type"].startswith("application/jsonlines")
        line = json.loads(r.text)
        assert line["token"]["id"] == -1 and line["details"]["finish_reason"] == "error"
    else:
        assert r.json() == {
            "generated_text": "",
            "details": {"finish_reason": "error", "generated_tokens": None, "inputs": None, "tokens": None},
        }


@pytest.mark.parametrize("content", [b"not json", b'{"prompt_x": "x"}', b'{"inputs": 7}'])
def test_payload_validation_is_424(server, content):
    with server.client() as c:
        r = c.post("/invocations", content=content, headers={"Content-Type": "application/json"})
    assert r.status_code == 424
    payload = r.json()
    assert set(payload) == {"error", "code"} and payload["code"] == 424


def test_client_disconnect_frees_its_blocks(server):
    with server.client() as c:
        with c.stream(
            "POST",
            "/invocations",
            json={
                "inputs": PROMPTS[1],
                "parameters": {"max_new_tokens": 200, "ignore_eos_token": True},
                "stream": True,
            },
        ) as r:
            lines = r.iter_lines()
            next(lines)
            next(lines)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            stats = c.get("/models/tiny").json()[0]["stats"]
            if stats and stats["running"] == 0 and stats["kv_blocks_used"] == 0:
                break
            time.sleep(0.1)
    assert stats["running"] == 0 and stats["waiting"] == 0
    assert stats["kv_blocks_used"] == 0
    assert stats["eager_steps"] > 0 and stats["graph_steps"] == 0  # the CPU runs no graphs


def test_tgi_compat(tiny_llama_dir, tmp_path, reference):
    with ServerProcess(serving_dir(tmp_path / "m", tiny_llama_dir, "option.tgi_compat=true\n")) as s:
        s.wait_ready()
        with s.client() as c:
            body = c.post(
                "/invocations", json={"inputs": PROMPTS[0], "parameters": {"max_new_tokens": 5, "details": True}}
            ).json()
            r = c.post("/invocations", json={"inputs": PROMPTS[0], "parameters": {"max_new_tokens": 5}, "stream": True})
    assert isinstance(body, list) and body[0]["generated_text"] == reference(PROMPTS[0], 5)
    assert set(body[0]["details"]["tokens"][0]) == {"id", "text", "logprob", "special"}
    assert r.headers["content-type"].startswith("text/event-stream")
    assert all(e.startswith("data: {") for e in r.text.split("\n\n") if e)  # the document's tgi_compat example
    events = [json.loads(e[len("data: ") :]) for e in r.text.split("\n\n") if e]
    assert events[-1]["generated_text"] == body[0]["generated_text"]
    assert events[-1]["details"]["finish_reason"]  # details are on by default under tgi_compat


def test_tensorrt_llm_parameters_on_the_engine(server, reference):
    tok = reference.tokenizer
    ids = tok(PROMPTS[1], return_tensors="pt")["input_ids"]
    plain = post(server, {"inputs": PROMPTS[1], "parameters": {"max_new_tokens": 8, "details": True}}).json()
    tokens = [t["id"] for t in plain["details"]["tokens"]]
    pairs = [tokens[i : i + 2] for i in range(1, len(tokens) - 1)]
    pair = next(p for p in pairs if tok(tok.decode(p), add_special_tokens=False)["input_ids"] == p)
    word = tok.decode(pair)
    banned = post(
        server, {"inputs": PROMPTS[1], "parameters": {"max_new_tokens": 8, "details": True, "bad_sequences": [word]}}
    ).json()
    out = [t["id"] for t in banned["details"]["tokens"]]
    assert all(out[i : i + 2] != pair for i in range(len(out) - 1)) and out != tokens
    bad = tok(word, add_special_tokens=False)["input_ids"]
    hf = reference.model.generate(ids, max_new_tokens=8, do_sample=False, bad_words_ids=[bad])
    assert banned["generated_text"] == tok.decode(hf[0, ids.shape[1] :], skip_special_tokens=True)
    refused = post(server, {"inputs": "x", "parameters": {"stop": True}})
    assert refused.status_code == 400 and refused.json()["details"]["finish_reason"] == "error"
    logprobs = post(
        server,
        {
            "inputs": PROMPTS[0],
            "parameters": {"max_new_tokens": 3, "details": True, "logprobs": 2, "prompt_logprobs": 1},
        },
    ).json()["details"]
    assert len(logprobs["top_tokens"]) == 3 and all(len(top) == 2 for top in logprobs["top_tokens"])
    assert len(logprobs["prefill"]) == len(tok(PROMPTS[0])["input_ids"]) and logprobs["prefill"][0]["log_prob"] is None
