"""Embeddings with the packaged all-MiniLM-L6-v2: OpenAI /v1/embeddings and LMI /invocations."""

import base64

import httpx
import numpy as np
import openai
import pytest
import torch

from lmiserve.model_store import DEFAULT_EMBEDDING_MODEL_ID, package_file
from tests.server_process import ServerProcess

TEXTS = ["The cat sits on the mat.", "A dog runs in the park", "Deep learning is a branch of machine learning."]


@pytest.fixture(scope="module")
def model_path():
    return package_file(DEFAULT_EMBEDDING_MODEL_ID)


@pytest.fixture(scope="module")
def expected(model_path):
    """Mean pooling over the attention mask, then L2 normalization (the model's modules.json)."""
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_path)
    model = AutoModel.from_pretrained(model_path, dtype=torch.float32).eval()

    def embed(texts):
        out = []
        for text in texts:  # one at a time: no padding in the reference
            enc = tok([text], return_tensors="pt")
            with torch.inference_mode():
                hidden = model(**enc).last_hidden_state[0]
            v = hidden.mean(dim=0)
            out.append((v / v.norm()).numpy())
        return np.stack(out), [len(tok(t)["input_ids"]) for t in texts]

    return embed


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("emb") / "m"
    root.mkdir()
    (root / "serving.properties").write_text(f"model_name=minilm\noption.model_id={DEFAULT_EMBEDDING_MODEL_ID}\n")
    with ServerProcess(root) as s:
        yield s.wait_ready()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", timeout=60)


def test_openai_client_base64_default(client, expected):
    r = client.embeddings.create(model="minilm", input=TEXTS)  # the client asks for base64
    want, counts = expected(TEXTS)
    got = np.stack([np.asarray(d.embedding, dtype=np.float32) for d in r.data])
    assert [d.index for d in r.data] == [0, 1, 2]
    assert got.shape == (3, 384)
    np.testing.assert_allclose(got, want, atol=1e-4)
    assert r.usage.prompt_tokens == r.usage.total_tokens == sum(counts)
    assert r.model == "minilm"


def test_float_format_and_single_string(server, expected):
    r = httpx.post(server.url + "/v1/embeddings", json={"input": TEXTS[0], "encoding_format": "float"}, timeout=60)
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "list" and body["data"][0]["object"] == "embedding"
    np.testing.assert_allclose(body["data"][0]["embedding"], expected(TEXTS[:1])[0][0], atol=1e-4)


def test_base64_bytes_are_little_endian_float32(server, expected):
    r = httpx.post(server.url + "/v1/embeddings", json={"input": [TEXTS[1]], "encoding_format": "base64"}, timeout=60)
    vec = np.frombuffer(base64.b64decode(r.json()["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_allclose(vec, expected(TEXTS[1:2])[0][0], atol=1e-4)


def test_token_id_input(server, model_path, expected):
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(model_path)(TEXTS[2])["input_ids"]
    r = httpx.post(server.url + "/v1/embeddings", json={"input": ids, "encoding_format": "float"}, timeout=60)
    assert r.status_code == 200
    np.testing.assert_allclose(r.json()["data"][0]["embedding"], expected(TEXTS[2:])[0][0], atol=1e-4)
    assert r.json()["usage"]["prompt_tokens"] == len(ids)


def test_lmi_inputs_on_invocations(server, expected):
    r = httpx.post(server.url + "/invocations", json={"inputs": TEXTS[:2]}, timeout=60)
    assert r.status_code == 200
    np.testing.assert_allclose(np.asarray(r.json()), expected(TEXTS[:2])[0], atol=1e-4)


def test_concurrent_requests_batched_independently(server, expected):
    import concurrent.futures

    want, _ = expected(TEXTS)

    def one(i):
        r = httpx.post(
            server.url + "/v1/embeddings", json={"input": TEXTS[i % 3], "encoding_format": "float"}, timeout=60
        )
        return i, r.json()["data"][0]["embedding"]

    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        for i, vec in pool.map(one, range(24)):
            np.testing.assert_allclose(vec, want[i % 3], atol=1e-4)


@pytest.mark.parametrize(
    "body",
    [{"input": []}, {"input": [1, "a"]}, {"input": "x", "encoding_format": "hex"}, {"input": "x", "dimensions": 12}],
)
def test_bad_input_openai_error_shape(server, body):
    r = httpx.post(server.url + "/v1/embeddings", json=body, timeout=60)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["message"] and err["type"] == "invalid_request_error"
    # the worker survives
    assert httpx.post(server.url + "/v1/embeddings", json={"input": "ok"}, timeout=60).status_code == 200


def test_generation_routes_refuse_embedding_model(server):
    r = httpx.post(server.url + "/v1/completions", json={"model": "minilm", "prompt": "hi"}, timeout=60)
    assert r.status_code == 404 and "error" in r.json()


def test_databricks_embeddings(server, expected):
    r = httpx.post(server.url + "/serving-endpoints/minilm/invocations", json={"input": TEXTS}, timeout=60)
    assert r.status_code == 200
    body = r.json()
    assert body["id"] and body["object"] == "list" and body["model"] == "minilm"
    assert [d["object"] for d in body["data"]] == ["embedding"] * 3
    want, counts = expected(TEXTS)
    np.testing.assert_allclose([d["embedding"] for d in body["data"]], want, atol=1e-4)
    assert body["usage"] == {"prompt_tokens": sum(counts), "total_tokens": sum(counts)}


def test_databricks_instruction_prefixes_each_text(server, expected):
    instruction = "Represent this sentence for searching relevant passages:"
    r = httpx.post(
        server.url + "/serving-endpoints/minilm/invocations",
        json={"input": [TEXTS[0]], "instruction": instruction},
        timeout=60,
    )
    want, _ = expected([instruction + " " + TEXTS[0]])
    np.testing.assert_allclose(r.json()["data"][0]["embedding"], want[0], atol=1e-4)


def test_databricks_chat_on_an_embedding_model_is_refused(server):
    r = httpx.post(server.url + "/serving-endpoints/minilm/invocations", json={"messages": []}, timeout=60)
    assert r.status_code == 404 and set(r.json()) == {"error_code", "message"}


def test_invocations_input_answers_openai_embeddings(server, expected):
    r = httpx.post(server.url + "/invocations", json={"input": TEXTS[0]}, timeout=60)
    assert r.json()["object"] == "list"
    np.testing.assert_allclose(r.json()["data"][0]["embedding"], expected(TEXTS[:1])[0][0], atol=1e-4)
