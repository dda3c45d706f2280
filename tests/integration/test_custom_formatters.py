"""Custom output and input formatters and djl_python handlers, served by the real server."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import pytest

from tests.integration.engine_server import Reference, start
from tests.server_process import ServerProcess

FIXTURES = Path(__file__).parent / "formatters"
PROMPT = "Deep learning is"


def serve(tmp_path_factory, tiny_llama_dir: Path, fixture: str, extra: str = "") -> ServerProcess:
    root = tmp_path_factory.mktemp(fixture.removesuffix(".py")) / "m"
    root.mkdir()
    shutil.copy(FIXTURES / fixture, root / "model.py")
    return start(root, tiny_llama_dir, extra)


def lines(body: bytes) -> list[dict]:
    return [json.loads(line) for line in body.decode().splitlines() if line.strip()]


def lmi(c: httpx.Client, prompt: str, n: int, stream: bool = False) -> httpx.Response:
    return c.post("/invocations", json={"inputs": prompt, "parameters": {"max_new_tokens": n}, "stream": stream})


@pytest.fixture(scope="module")
def reference(tiny_llama_dir):
    return Reference(tiny_llama_dir)


# --- an output formatter that sends only the final text, as plain text ------------------


@pytest.fixture(scope="module")
def final_text_server(tiny_llama_dir, tmp_path_factory):
    with serve(tmp_path_factory, tiny_llama_dir, "final_text_model.py") as s:
        yield s.wait_ready()


def test_final_text_only_as_plain_text(final_text_server, reference):
    with final_text_server.client() as c:
        whole = lmi(c, PROMPT, 8)
        streamed = lmi(c, PROMPT, 8, stream=True)
    assert whole.status_code == 200 and streamed.status_code == 200
    assert whole.headers["content-type"].startswith("text/plain")
    assert streamed.headers["content-type"].startswith("text/plain")
    assert whole.text == reference.text(PROMPT, 8)
    assert streamed.text == whole.text


def test_model_py_with_only_formatters_keeps_the_engine(final_text_server):
    with final_text_server.client() as c:
        desc = c.get("/models/tiny").json()
        chat = c.post("/invocations", json={"prompt": PROMPT, "max_tokens": 3})
    assert desc[0]["backend"] == "lmi"
    assert chat.status_code == 200 and chat.json()["object"] == "text_completion"  # OpenAI bodies keep their shape


# --- an output formatter named by option.output_formatter, adding fields to jsonlines -----


@pytest.fixture(scope="module")
def extra_fields_server(tiny_llama_dir, tmp_path_factory):
    with serve(tmp_path_factory, tiny_llama_dir, "extra_fields_model.py", "option.output_formatter=token_lines\n") as s:
        yield s.wait_ready()


def test_jsonlines_with_extra_fields_streaming(extra_fields_server, reference):
    with extra_fields_server.client() as c:
        r = lmi(c, PROMPT, 6, stream=True)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("application/jsonlines")
    got = lines(r.content)
    ids = reference.ids(PROMPT, 6)
    assert [g["token"]["id"] for g in got] == ids
    assert all(g["source"] == "custom" and g["request_id"] == got[0]["request_id"] for g in got)
    assert [g["first"] for g in got] == [True] + [False] * (len(ids) - 1)
    last = got[-1]
    assert last["generated_text"] == reference.text(PROMPT, 6)
    assert last["finish_reason"] == "length"
    assert last["prompt_tokens"] == len(reference.tokenizer(PROMPT)["input_ids"])
    assert last["max_new_tokens"] == 6
    assert all("generated_text" not in g for g in got[:-1])


def test_jsonlines_with_extra_fields_whole_body(extra_fields_server, reference):
    with extra_fields_server.client() as c:
        r = lmi(c, PROMPT, 4)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("application/json")
    got = lines(r.content)  # every step's lines, joined
    assert [g["token"]["id"] for g in got] == reference.ids(PROMPT, 4)
    assert got[-1]["generated_text"] == reference.text(PROMPT, 4)


# --- an output formatter that raises ------------------------------------------------------


@pytest.fixture(scope="module")
def raising_server(tiny_llama_dir, tmp_path_factory):
    with serve(tmp_path_factory, tiny_llama_dir, "raising_formatter_model.py") as s:
        yield s.wait_ready()


@pytest.mark.parametrize("stream", [False, True])
def test_a_raising_formatter_answers_424_and_the_server_goes_on(raising_server, reference, stream):
    with raising_server.client() as c:
        bad = lmi(c, "please fail now", 5, stream=stream)
        good = lmi(c, PROMPT, 5, stream=stream)
        ping = c.get("/ping")
    assert bad.status_code == 424
    body = bad.json()
    assert body["code"] == 424
    assert "cannot format this one" in body["error"] and "ValueError" in body["error"]
    assert good.status_code == 200
    assert [int(x) for x in good.text.split()] == reference.ids(PROMPT, 5)
    assert ping.status_code == 200


def test_a_formatter_failing_mid_stream_ends_with_the_error_line(raising_server):
    with raising_server.client() as c:
        r = lmi(c, "please fail later", 10, stream=True)
        after = lmi(c, PROMPT, 3, stream=True)
    assert r.status_code == 200  # the first pieces were already sent
    *sent, tail = r.text.splitlines()
    assert len(sent) == 2 and all(x.isdigit() for x in sent)
    assert json.loads(tail) == {"error": json.loads(tail)["error"], "code": 424}
    assert "gave up after three tokens" in tail
    assert after.status_code == 200 and len(after.text.split()) == 3


# --- an input formatter accepting {"question": ...} ---------------------------------------


@pytest.fixture(scope="module")
def question_server(tiny_llama_dir, tmp_path_factory):
    with serve(tmp_path_factory, tiny_llama_dir, "question_input_model.py") as s:
        yield s.wait_ready()


def test_input_formatter_accepts_its_own_schema(question_server, reference):
    prompt = "Question: what is deep learning?\nAnswer:"
    with question_server.client() as c:
        r = c.post("/invocations", json={"question": "what is deep learning?", "length": 4})
    assert r.status_code == 200
    body = r.json()
    assert body["generated_text"] == reference.text(prompt, 4)
    assert body["details"]["inputs"] == prompt
    assert body["details"]["generated_tokens"] == len(reference.ids(prompt, 4))


def test_input_formatter_streams_when_asked(question_server, reference):
    prompt = "Question: why?\nAnswer:"
    with question_server.client() as c:
        r = c.post("/invocations", json={"question": "why?", "length": 5, "stream": True})
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("application/jsonlines")
    got = lines(r.content)
    assert [g["token"]["id"] for g in got] == reference.ids(prompt, 5)
    assert got[-1]["generated_text"] == reference.text(prompt, 5)


def test_input_formatter_refusing_a_body_is_a_client_error(question_server):
    with question_server.client() as c:
        r = c.post("/invocations", json={"inputs": "not my schema"})
        ok = c.post("/invocations", json={"question": "x", "length": 2})
    assert r.status_code == 400
    assert r.json()["error"] == 'input formatter question_schema failed: ValueError: send {"question": ...}'
    assert ok.status_code == 200


# --- a handle(inputs) handler importing only from djl_python ------------------------------


@pytest.fixture(scope="module")
def djl_handler_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("djl-handler") / "m"
    root.mkdir()
    shutil.copy(FIXTURES / "djl_only_handler.py", root / "model.py")
    (root / "serving.properties").write_text("")
    with ServerProcess(root) as s:
        yield s.wait_ready()


def test_djl_python_handler_answers(djl_handler_server):
    with djl_handler_server.client() as c:
        r = c.post("/invocations", json={"text": "one two three"})
        s = c.post("/invocations", json={"text": "one two", "stream": True})
    assert r.status_code == 200 and r.json() == {"words": ["one", "two", "three"], "count": 3}
    assert s.status_code == 200 and lines(s.content) == [{"word": "one"}, {"word": "two"}]
