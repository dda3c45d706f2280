"""option.bedrock_compat: Amazon Bedrock's Meta Llama schema on /invocations, over the real server."""

import json
import shutil

import pytest

from tests.integration.engine_server import Reference, start

PROMPT = "The quick brown fox"
STREAM = {"X-Amzn-SageMaker-Forwarded-Api": "InvokeEndpointWithResponseStream"}


@pytest.fixture(scope="module")
def model(tiny_llama_dir, tmp_path_factory):
    """The tiny model with an extra end-of-sequence token: the third token greedy decoding of
    PROMPT produces (so that generation ends with "stop" there)."""
    d = tmp_path_factory.mktemp("bedrock-model") / "model"
    shutil.copytree(tiny_llama_dir, d)
    ids = Reference(d).ids(PROMPT, 8)
    k = next(i for i in range(1, len(ids)) if ids[i] not in ids[:i])
    config = json.loads((d / "generation_config.json").read_text())
    eos = config.get("eos_token_id")
    config["eos_token_id"] = [*(eos if isinstance(eos, list) else [eos]), ids[k]]
    (d / "generation_config.json").write_text(json.dumps(config))
    return d, k


@pytest.fixture(scope="module")
def reference(model):
    return Reference(model[0])


@pytest.fixture(scope="module")
def server(model, tmp_path_factory):
    with start(tmp_path_factory.mktemp("bedrock") / "m", model[0], "option.bedrock_compat=true\n") as s:
        yield s.wait_ready()


def post(server, body, **kw):
    with server.client() as c:
        return c.post("/invocations", json=body, **kw)


def test_length_limited_generation(server, reference, model):
    n = model[1]  # the tokens before the end-of-sequence one
    r = post(server, {"prompt": PROMPT, "temperature": 0, "max_gen_len": n})
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    expected_ids = reference.ids(PROMPT, n)
    assert r.json() == {
        "generation": reference.tokenizer.decode(expected_ids, skip_special_tokens=True),
        "prompt_token_count": len(reference.tokenizer(PROMPT)["input_ids"]),
        "generation_token_count": n,
        "stop_reason": "length",
    }


def test_generation_ending_at_end_of_sequence(server, reference, model):
    r = post(server, {"prompt": PROMPT, "temperature": 0, "max_gen_len": 50})
    body = r.json()
    expected_ids = reference.ids(PROMPT, 50)  # ends with the end-of-sequence token
    assert len(expected_ids) == model[1] + 1
    assert body["stop_reason"] == "stop"
    assert body["generation_token_count"] == len(expected_ids)
    assert body["generation"] == reference.tokenizer.decode(expected_ids, skip_special_tokens=True)


def test_streaming_chosen_by_the_forwarded_api_header(server, reference):
    body = {"prompt": PROMPT, "temperature": 0, "max_gen_len": 50}
    with server.client() as c, c.stream("POST", "/invocations", json=body, headers=STREAM) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("application/jsonlines")
        lines = [json.loads(line) for line in r.iter_lines() if line]
    whole = post(server, body).json()
    assert all(
        set(line) == {"generation", "prompt_token_count", "generation_token_count", "stop_reason"} for line in lines
    )
    assert lines[0]["prompt_token_count"] == whole["prompt_token_count"]
    assert all(line["prompt_token_count"] is None for line in lines[1:])
    assert all(line["stop_reason"] is None for line in lines[:-1])
    assert lines[-1]["stop_reason"] == "stop"
    counts = [line["generation_token_count"] for line in lines]
    assert counts == sorted(counts) and counts[-1] == whole["generation_token_count"]
    assert "".join(line["generation"] for line in lines) == whole["generation"]


def test_without_the_header_the_answer_is_one_body(server):
    r = post(server, {"prompt": PROMPT, "max_gen_len": 3}, headers={"X-Amzn-SageMaker-Forwarded-Api": "InvokeEndpoint"})
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    assert r.json()["generation_token_count"] <= 3


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"prompt": PROMPT, "temperature": 3}, "#/temperature"),
        ({"prompt": PROMPT, "max_gen_len": "many"}, "#/max_gen_len"),
        ({"prompt": PROMPT, "stream": True}, "extraneous key [stream]"),
        ({"temperature": 0.1}, "required key [prompt]"),
    ],
)
def test_bad_input_gets_bedrocks_validation_error(server, body, words):
    r = post(server, body)
    assert r.status_code == 400
    assert r.headers["x-amzn-errortype"] == "ValidationException"
    assert list(r.json()) == ["message"] and words in r.json()["message"]


def test_malformed_json_gets_bedrocks_validation_error(server):
    with server.client() as c:
        r = c.post("/invocations", content=b"{not json", headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and "Malformed input request" in r.json()["message"]


def test_other_schemas_still_answer(server):
    r = post(server, {"inputs": PROMPT, "parameters": {"max_new_tokens": 2}})
    assert r.status_code == 200 and "generated_text" in r.json()
