"""The built-in text-generation handler (dynamic batching) on a tiny random Llama."""

import concurrent.futures
import json

import pytest
import torch

from tests.server_process import ServerProcess

PROMPTS = ["What is Deep Learning?", "The quick brown fox", "Numbers: 1 2 3"]


@pytest.fixture(scope="module")
def reference(tiny_llama_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_llama_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()

    def generate(prompt: str, n: int) -> str:
        ids = tok(prompt, return_tensors="pt")["input_ids"]
        out = model.generate(ids, max_new_tokens=n, do_sample=False, pad_token_id=tok.pad_token_id)
        return tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True)

    return generate


@pytest.fixture(scope="module")
def server(tiny_llama_dir, tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny-serve")
    (d / "serving.properties").write_text(
        f"option.model_id={tiny_llama_dir}\noption.rolling_batch=disable\noption.dtype=fp32\n"
        "batch_size=4\nmax_batch_delay=200\n"
    )
    with ServerProcess(d) as s:
        yield s.wait_ready()


def test_string_input_answers_a_one_element_list(server, reference):
    with server.client() as c:
        r = c.post("/invocations", json={"inputs": PROMPTS[0], "parameters": {"max_new_tokens": 12}})
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    assert r.json() == [{"generated_text": reference(PROMPTS[0], 12)}]


def test_list_input_answers_in_order(server, reference):
    with server.client() as c:
        r = c.post("/invocations", json={"inputs": PROMPTS, "parameters": {"max_new_tokens": 8}})
    assert r.json() == [{"generated_text": reference(p, 8)} for p in PROMPTS]


def test_return_full_text_and_stop_sequences(server, reference):
    full = reference(PROMPTS[1], 10)
    with server.client() as c:
        r = c.post(
            "/invocations", json={"inputs": PROMPTS[1], "parameters": {"max_new_tokens": 10, "return_full_text": True}}
        )
        assert r.json() == [{"generated_text": PROMPTS[1] + full}]
        stop = full[2:4]
        r = c.post(
            "/invocations", json={"inputs": PROMPTS[1], "parameters": {"max_new_tokens": 10, "stop_sequences": [stop]}}
        )
    assert r.json() == [{"generated_text": full[: full.index(stop)]}]


def test_streaming_jsonlines_per_step(server, reference):
    with server.client() as c:
        with c.stream(
            "POST", "/invocations", json={"inputs": PROMPTS[:2], "parameters": {"max_new_tokens": 6}, "stream": True}
        ) as r:
            assert r.status_code == 200
            assert r.headers["content-type"] == "application/jsonlines"
            lines = [json.loads(line) for line in r.iter_lines() if line]
    assert all(list(line) == ["outputs"] and len(line["outputs"]) == 2 for line in lines)
    for i, prompt in enumerate(PROMPTS[:2]):
        assert "".join(line["outputs"][i] for line in lines) == reference(prompt, 6)


def test_concurrent_requests_are_batched_and_split_back(server, reference):
    jobs = [(PROMPTS[i % 3], 4 + i) for i in range(6)]

    def call(job):
        prompt, n = job
        with server.client() as c:
            return c.post("/invocations", json={"inputs": prompt, "parameters": {"max_new_tokens": n}}).json()

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        results = list(pool.map(call, jobs))
    assert results == [[{"generated_text": reference(p, n)}] for p, n in jobs]


def test_seeded_sampling_is_reproducible(server):
    body = {"inputs": PROMPTS[0], "parameters": {"max_new_tokens": 8, "do_sample": True, "temperature": 0.8, "seed": 7}}
    with server.client() as c:
        first = c.post("/invocations", json=body).json()
        again = c.post("/invocations", json=body).json()
    assert first == again


@pytest.mark.parametrize(
    "body,code,fragment",
    [
        ({"inputs": "x", "parameters": {"temperature": -1}}, 424, "parameters.temperature"),
        ({"inputs": "x", "parameters": {"max_new_tokens": 100000}}, 424, "max_model_len"),
        ({"inputs": ""}, 424, "must not be empty"),
        ({"prompt": "x"}, 424, "no 'inputs'"),
    ],
)
def test_bad_requests_answer_the_dynamic_batch_error_shape(server, body, code, fragment):
    with server.client() as c:
        r = c.post("/invocations", json=body)
    assert r.status_code == code
    payload = r.json()
    assert payload["code"] == code and fragment in payload["error"]
    assert set(payload) == {"code", "message", "error"}


def test_body_without_json_content_type_is_still_parsed_or_refused(server, reference):
    with server.client() as c:
        r = c.post("/invocations", content=json.dumps({"inputs": PROMPTS[2], "parameters": {"max_new_tokens": 3}}))
        assert r.json() == [{"generated_text": reference(PROMPTS[2], 3)}]
        r = c.post(
            "/invocations", content=b"inputs=hello", headers={"Content-Type": "application/x-www-form-urlencoded"}
        )
    assert r.status_code == 424 and r.json()["error"].startswith("request body is not valid JSON")
    assert r.json()["message"] == "invoke handler failure"


def test_enable_streaming_option_streams_by_default(tiny_llama_dir, tmp_path, reference):
    (tmp_path / "serving.properties").write_text(
        f"option.model_id={tiny_llama_dir}\noption.rolling_batch=disable\noption.dtype=fp32\noption.enable_streaming=true\n"
    )
    with ServerProcess(tmp_path) as s:
        s.wait_ready()
        with s.client() as c:
            r = c.post("/invocations", json={"inputs": PROMPTS[0], "parameters": {"max_new_tokens": 5}})
    assert r.headers["content-type"] == "application/jsonlines"
    lines = [json.loads(x) for x in r.text.splitlines()]
    assert "".join(x["outputs"][0] for x in lines) == reference(PROMPTS[0], 5)
