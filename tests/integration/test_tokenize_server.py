"""vLLM's ``POST /tokenize`` and ``POST /detokenize`` on a real server with the tiny Llama, and
TGI's ``/tokenize`` body on the same route still answered TGI's way."""

import httpx
import pytest

from .engine_server import Reference

PROMPT = "What is Deep Learning?"
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": PROMPT}]


@pytest.fixture(scope="module")
def reference(tiny_llama_dir):
    return Reference(tiny_llama_dir)


@pytest.fixture(scope="module")
def post(engine_server):
    def call(route: str, body) -> httpx.Response:
        return httpx.post(engine_server.url + route, json=body, timeout=60)

    return call


def test_prompt_tokens_with_and_without_special_tokens(post, reference):
    ids = reference.tokenizer(PROMPT)["input_ids"]
    r = post("/tokenize", {"model": "tiny", "prompt": PROMPT})
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    assert r.json() == {"count": len(ids), "max_model_len": 256, "tokens": ids, "token_strs": None}
    bare = reference.tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
    r = post("/tokenize", {"prompt": PROMPT, "add_special_tokens": False, "return_token_strs": True})
    assert r.json()["tokens"] == bare and r.json()["count"] == len(bare)
    assert r.json()["token_strs"] == reference.tokenizer.convert_ids_to_tokens(bare)


def test_chat_messages_go_through_the_chat_template(post, reference):
    text = reference.tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    ids = reference.tokenizer(text, add_special_tokens=False)["input_ids"]
    r = post("/tokenize", {"model": "tiny", "messages": MESSAGES})
    assert r.status_code == 200, r.text
    assert r.json()["tokens"] == ids and r.json()["count"] == len(ids)
    assert r.json()["max_model_len"] == 256
    bare = reference.tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=False, tokenize=False)
    r = post("/tokenize", {"messages": MESSAGES, "add_generation_prompt": False, "add_special_tokens": True})
    assert r.json()["tokens"] == reference.tokenizer(bare)["input_ids"]
    # the chat route counts the same prompt
    chat = post("/v1/chat/completions", {"model": "tiny", "messages": MESSAGES, "max_tokens": 1})
    assert chat.json()["usage"]["prompt_tokens"] == len(ids)


def test_round_trip(post, reference):
    tokens = post("/tokenize", {"prompt": PROMPT, "add_special_tokens": False}).json()["tokens"]
    r = post("/detokenize", {"model": "tiny", "tokens": tokens})
    assert r.status_code == 200 and r.json() == {"prompt": PROMPT}
    with_bos = post("/tokenize", {"prompt": PROMPT}).json()["tokens"]
    assert post("/detokenize", {"tokens": with_bos}).json()["prompt"] == reference.tokenizer.decode(with_bos)
    assert post("/detokenize", {"tokens": []}).json() == {"prompt": ""}


def openai_error(r: httpx.Response, status: int = 400) -> dict:
    assert r.status_code == status, r.text
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    return r.json()["error"]


def test_errors_are_openai_shaped(post, reference):
    vocab = len(reference.tokenizer)
    error = openai_error(post("/detokenize", {"tokens": [1, vocab + 5]}))
    assert error["message"] == f"Token id {vocab + 5} is out of vocabulary" and error["param"] == "tokens"
    assert "tokens.0" in openai_error(post("/detokenize", {"tokens": [-1]}))["message"]
    assert "tokens" in openai_error(post("/detokenize", {"prompt": "x"}))["message"]
    assert "tokens" in openai_error(post("/detokenize", {"tokens": ["a"]}))["message"]
    openai_error(post("/detokenize", [1, 2]))
    assert "prompt" in openai_error(post("/tokenize", {"prompt": 5}))["message"]
    both = {"messages": MESSAGES, "continue_final_message": True, "add_generation_prompt": True}
    assert "continue_final_message" in openai_error(post("/tokenize", both))["message"]
    openai_error(post("/tokenize", {"messages": [{"role": "wizard", "content": "x"}]}))
    openai_error(post("/tokenize", {"prompt": "x", "model": "no-such-model"}), 404)


def test_tgi_body_still_gets_tgi_answer(post, reference):
    r = post("/tokenize", {"inputs": PROMPT})
    assert r.status_code == 200
    tokens = r.json()
    assert [t["id"] for t in tokens] == reference.tokenizer(PROMPT)["input_ids"]
    assert {"id", "text", "start", "stop"} == set(tokens[-1])
    # TGI's body wins when a body has both; a body with neither gets TGI's error
    assert post("/tokenize", {"inputs": PROMPT, "prompt": "x"}).json() == tokens
    r = post("/tokenize", {"model": "tiny"})
    assert r.status_code == 422 and set(r.json()) == {"error", "error_type"}
