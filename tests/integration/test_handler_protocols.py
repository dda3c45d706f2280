"""Every documented generation API answered by handler models (option.rolling_batch=disable):
the built-in handler on a tiny random Llama, held to transformers' greedy output, and a user's
model.py that gets the request as DJL hands it over."""

import json
import shutil
from pathlib import Path

import httpx
import openai
import pytest
import torch

from tests.server_process import ServerProcess
from tests.unit.test_spec_examples import MINDIE_REQUEST as MINDIE_EXAMPLE  # the document's own

PROMPT = MINDIE_EXAMPLE["inputs"]

HANDLERS = Path(__file__).parent / "handlers"


@pytest.fixture(scope="module")
def hf(tiny_llama_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_llama_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()
    return tok, model


def greedy(hf, prompt: str, n: int) -> tuple[str, list[int]]:
    tok, model = hf
    ids = tok(prompt, return_tensors="pt")["input_ids"]
    out = model.generate(ids, max_new_tokens=n, do_sample=False, pad_token_id=tok.pad_token_id)
    new = out[0, ids.shape[1] :].tolist()
    return tok.decode(new, skip_special_tokens=True), new


@pytest.fixture(scope="module")
def server(tiny_llama_dir, tmp_path_factory):
    d = tmp_path_factory.mktemp("handler-apis")
    (d / "serving.properties").write_text(
        f"option.model_id={tiny_llama_dir}\noption.rolling_batch=disable\noption.dtype=fp32\n"
        "batch_size=4\nmax_batch_delay=20\n"
    )
    with ServerProcess(d) as s:
        s.wait_ready()
        s.name = httpx.get(s.url + "/v1/models").json()["data"][0]["id"]
        yield s


def test_mindie_document_example(server, hf):
    tok, model = hf
    with server.client() as c:
        r = c.post("/", json=MINDIE_EXAMPLE)
    assert r.status_code == 200, r.text
    [answer] = r.json()
    details = answer["details"]
    assert details["finish_reason"] in ("length", "eos_token")
    assert details["generated_tokens"] == len(details["tokens"]) <= 20
    assert answer["generated_text"] == "".join(t["text"] for t in details["tokens"])
    ids = tok(PROMPT)["input_ids"]
    assert [t["id"] for t in details["prefill"]] == ids
    with torch.inference_mode():
        logprobs = torch.log_softmax(model(torch.tensor([ids])).logits[0, :-1], dim=-1)
    expected = logprobs.gather(1, torch.tensor(ids[1:]).unsqueeze(1)).squeeze(1).tolist()
    assert details["prefill"][0]["logprob"] is None
    assert [t["logprob"] for t in details["prefill"][1:]] == pytest.approx(expected, abs=1e-4)


def test_mindie_completions_document_example(server):
    body = {"model": server.name, "prompt": "who are you", "temperature": 1, "max_tokens": 5, "ignore_eos": True}
    with server.client() as c:
        r = c.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 5 and r.json()["choices"][0]["finish_reason"] == "length"


def test_greedy_text_on_every_api_equals_transformers(server, hf):
    text, ids = greedy(hf, PROMPT, 7)
    greedy_lmi = {"max_new_tokens": 7, "do_sample": False}
    with server.client() as c:
        mindie = c.post("/", json={"inputs": PROMPT, "parameters": {**greedy_lmi, "details": True}}).json()
        completions = c.post(
            "/v1/completions", json={"model": server.name, "prompt": PROMPT, "max_tokens": 7, "temperature": 0}
        ).json()
        databricks = c.post(
            f"/serving-endpoints/{server.name}/invocations",
            json={"prompt": PROMPT, "max_tokens": 7, "temperature": 0, "use_raw_prompt": True},
        ).json()
        v2_tensor = {"name": "text_input", "datatype": "BYTES", "shape": [1], "data": [PROMPT]}
        infer = c.post(
            f"/v2/models/{server.name}/infer",
            json={"inputs": [v2_tensor], "parameters": {"max_tokens": 7}},
        ).json()
        generate = c.post(
            f"/v2/models/{server.name}/generate", json={"text_input": PROMPT, "parameters": {"max_tokens": 7}}
        ).json()
        tgi = c.post("/generate", json={"inputs": PROMPT, "parameters": {**greedy_lmi, "details": True}}).json()
    assert mindie[0]["generated_text"] == text
    assert [t["id"] for t in mindie[0]["details"]["tokens"]] == ids
    assert completions["choices"][0]["text"] == text
    prompt_tokens = len(hf[0](PROMPT)["input_ids"])
    assert completions["usage"] == {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": 7,
        "total_tokens": prompt_tokens + 7,
    }
    assert databricks["choices"][0]["text"] == text
    assert infer["outputs"][0]["data"] == [text]
    assert generate["text_output"] == text
    assert tgi["generated_text"] == text and tgi["details"]["finish_reason"] == "length"
    tokens = tgi["details"]["tokens"]
    assert [t["id"] for t in tokens] == ids and all(t["logprob"] < 0 for t in tokens)


def test_streams_join_to_the_answer(server, hf):
    text, _ = greedy(hf, PROMPT, 6)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
    stream = client.completions.create(model=server.name, prompt=PROMPT, max_tokens=6, temperature=0, stream=True)
    pieces = [chunk.choices[0].text for chunk in stream if chunk.choices]
    assert len(pieces) >= 2 and "".join(pieces) == text
    with server.client() as c:
        with c.stream("POST", "/", json={"inputs": PROMPT, "stream": True, "parameters": {"max_new_tokens": 6}}) as r:
            events = [json.loads(line[5:]) for line in r.iter_lines() if line.startswith("data:")]
    assert r.status_code == 200 and len(events) == 6
    assert events[-1]["generated_text"] == text


def test_chat_on_openai_and_databricks(server, hf):
    tok, _ = hf
    messages = [{"role": "user", "content": "hi"}]
    prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    text, _ = greedy(hf, prompt, 5)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
    reply = client.chat.completions.create(model=server.name, messages=messages, max_tokens=5, temperature=0)
    assert reply.choices[0].message.content == text
    with server.client() as c:
        databricks = c.post(
            "/serving-endpoints/chat/completions", json={"messages": messages, "max_tokens": 5, "temperature": 0}
        ).json()
    assert databricks["choices"][0]["message"]["content"] == text


def test_top_alternatives_of_each_token(server, hf):
    tok, model = hf
    text, ids = greedy(hf, PROMPT, 4)
    body = {"model": server.name, "prompt": PROMPT, "max_tokens": 4, "temperature": 0, "logprobs": 2}
    params = {"max_new_tokens": 4, "top_n_tokens": 3, "details": True}
    with server.client() as c:
        choice = c.post("/v1/completions", json=body).json()["choices"][0]
        tgi = c.post("/generate", json={"inputs": PROMPT, "parameters": params}).json()
    assert choice["text"] == text and len(choice["logprobs"]["top_logprobs"]) == 4
    prompt = tok(PROMPT, return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        logits = model(torch.cat([prompt, torch.tensor([ids[:-1]])], dim=1)).logits[0, prompt.shape[1] - 1 :]
    values, indices = torch.log_softmax(logits, dim=-1).topk(3, dim=-1)
    tops = tgi["details"]["top_tokens"]
    assert [[t["id"] for t in top] for top in tops] == indices.tolist()
    assert [t["logprob"] for top in tops for t in top] == pytest.approx(values.flatten().tolist(), abs=1e-4)


def test_n_choices_and_seeded_sampling(server):
    body = {"prompt": PROMPT, "max_tokens": 5, "temperature": 0, "n": 2}
    with server.client() as c:
        greedy_two = c.post(f"/serving-endpoints/{server.name}/invocations", json=body).json()
        sampled = [
            c.post(
                "/v1/completions",
                json={"model": server.name, "prompt": PROMPT, "max_tokens": 5, "n": 3, "seed": 7, "temperature": 1},
            ).json()
            for _ in range(2)
        ]
    assert [c["text"] for c in greedy_two["choices"]] == [greedy_two["choices"][0]["text"]] * 2
    texts = [[c["text"] for c in s["choices"]] for s in sampled]
    assert texts[0] == texts[1] and len(texts[0]) == 3


@pytest.mark.parametrize(
    ("path", "body", "status", "fragment"),
    [
        ("/generate", {"inputs": "x", "parameters": {"best_of": 2, "do_sample": True}}, 422, "best_of above n"),
        ("/v1/completions", {"prompt": "x", "best_of": 2, "temperature": 1, "model": "{name}"}, 400, "best_of"),
        (
            "/v1/chat/completions",
            {
                "messages": [
                    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://a/b.png"}}]}
                ]
            },
            400,
            "reads text only",
        ),
    ],
)
def test_what_a_handler_cannot_do_is_refused_in_the_protocols_shape(server, path, body, status, fragment):
    body = {k: (v.format(name=server.name) if isinstance(v, str) else v) for k, v in body.items()}
    with server.client() as c:
        r = c.post(path, json=body)
        after = c.post("/", json={"inputs": PROMPT, "parameters": {"max_new_tokens": 2}})
    assert r.status_code == status and fragment in r.text
    assert after.status_code == 200


def test_a_users_model_py_gets_lmis_schema(tiny_llama_dir, tmp_path):
    d = tmp_path / "model"
    d.mkdir()
    shutil.copy(HANDLERS / "lmi_text_model.py", d / "model.py")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(Path(tiny_llama_dir) / name, d / name)
    with ServerProcess(d) as s, s.wait_ready().client() as c:
        mindie = c.post("/", json={"inputs": PROMPT, "parameters": {"max_new_tokens": 9, "top_k": 3}})
        chat = c.post(
            "/serving-endpoints/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 9},
        )
        v2 = c.post("/v2/models/model/generate", json={"text_input": "abc", "parameters": {"max_tokens": 4}})
    assert mindie.status_code == 200, mindie.text
    seen = mindie.json()[0]["generated_text"].split()
    assert seen[:5] == ["seen", str(len(PROMPT)), "characters", "with", "details"]
    assert {"max_new_tokens", "top_k"} <= set(seen[5:])
    assert chat.status_code == 200, chat.text
    assert chat.json()["choices"][0]["message"]["content"].startswith("seen ")
    assert chat.json()["usage"]["completion_tokens"] > 0
    assert v2.status_code == 200, v2.text
    assert v2.json()["text_output"] == "seen 3 characters with details max_new_tokens"
