"""schemathesis against the server's own ``/openapi.json`` on a real server with a tiny model.

Every documented operation (except the management calls that load, scale or unload models) gets
generated cases; no response may be 5xx, documented response schemas must hold, and afterwards the
server must still answer ``/ping`` 200 with the same engine process.

The routes read their bodies themselves, so FastAPI documents no request body for them; the test adds
one to every POST operation, in two passes: first any-shaped cases (an object with the route's main
field and any of the field names a protocol reads, each of any type, or any other JSON document) with
random path parameters; then well-typed bodies within the limits for the served model, so that a share
of the cases reaches the engine. Operations without inputs have a single case to draw.

Cases per operation: ``LMISERVE_FUZZ_CASES`` any-shaped plus half as many well-typed (default 40 + 20);
``LMISERVE_FUZZ_FULL=1`` makes it 200 + 100.
"""

from __future__ import annotations

import collections
import copy
import os
import time

import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from tests.integration.engine_server import start

pytestmark = [pytest.mark.fuzz, pytest.mark.serial]

CASES = 200 if os.environ.get("LMISERVE_FUZZ_FULL") == "1" else int(os.environ.get("LMISERVE_FUZZ_CASES", "40"))
EXCLUDED = {("POST", "/models"), ("PUT", "/models/{model_name}"), ("DELETE", "/models/{model_name}")}

# hypothesis-jsonschema folds an ``anyOf`` branch into a wider one, so the alternatives below never
# overlap: a plausible value of one type, or a value of any other type.
ANY: dict = {}
OTHER = {"type": ["null", "boolean", "array", "object"]}
SMALL_INT = {"anyOf": [{"type": "integer", "minimum": -3, "maximum": 40}, {"type": ["string", *OTHER["type"]]}]}
NUMBER = {"anyOf": [{"type": "number"}, {"type": ["string", *OTHER["type"]]}]}
TEXT = {"type": "string", "maxLength": 40}
PROMPT = {"anyOf": [TEXT, {"type": ["number", *OTHER["type"]]}]}
STOPS = {"anyOf": [{"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 4}, {"type": "string"}]}
BOOL = {"anyOf": [{"type": "boolean"}, {"type": ["string", "number", "null"]}]}
MESSAGE = {
    "type": "object",
    "properties": {"role": {"enum": ["user", "assistant", "system", "tool", "x"]}, "content": PROMPT},
    "required": ["role", "content"],
}
MESSAGES = {"anyOf": [{"type": "array", "maxItems": 3, "items": MESSAGE}, {"type": ["string", "object", "null"]}]}
PARAMS = {
    name: schema
    for names, schema in [
        (["max_new_tokens", "max_tokens", "max_completion_tokens", "n", "best_of", "top_k", "logprobs"], SMALL_INT),
        (["top_logprobs", "truncate"], SMALL_INT),
        (["temperature", "top_p", "repetition_penalty", "presence_penalty", "frequency_penalty", "seed"], NUMBER),
        (["stop", "stop_sequences"], STOPS),
        (["do_sample", "stream", "return_full_text", "echo", "details", "decoder_input_details"], BOOL),
    ]
    for name in names
}
TENSOR = {
    "type": "object",
    "properties": {
        "name": {"enum": ["text_input", "max_tokens", "stream", "x"]},
        "shape": {"type": "array", "items": {"type": "integer", "minimum": -1, "maximum": 3}, "maxItems": 2},
        "datatype": {"enum": ["BYTES", "INT32", "FP32", "BOOL", "x"]},
        "data": {"type": "array", "items": PROMPT, "maxItems": 3},
    },
    "required": ["name", "shape", "datatype", "data"],
}
FIELDS = {
    "inputs": {"anyOf": [TEXT, {"type": "array", "maxItems": 3, "items": {"anyOf": [TEXT, TENSOR]}}]},
    "prompt": {"anyOf": [TEXT, {"type": "array", "maxItems": 3, "items": TEXT}]},
    "text_input": PROMPT,
    "input": PROMPT,
    "messages": MESSAGES,
    "model": {"enum": ["tiny", "", "other"]},
    "parameters": {"anyOf": [{"type": "object", "properties": PARAMS}, {"type": ["string", "array", "null"]}]},
    "dataframe_records": ANY,
    "instances": ANY,
    **PARAMS,
}


def main_field(path: str) -> str:
    """The field a route cannot do without, so that most cases get past the first check."""
    if "chat" in path:
        return "messages"
    if "embeddings" in path:
        return "input"
    if path.endswith(("/generate", "/generate_stream")) and path.startswith("/v2/"):
        return "text_input"
    if "completions" in path or path.startswith("/serving-endpoints/"):
        return "prompt"
    return "inputs"


def body(path: str) -> dict:
    shaped = {"type": "object", "properties": FIELDS, "required": [main_field(path)]}
    return {"anyOf": [shaped, {"type": ["array", "string", "number", "boolean", "null"]}]}


MODEL_PARAMS = {"model_name", "name"}


GOOD_PARAMS = {
    "max_new_tokens": {"type": "integer", "minimum": 1, "maximum": 8},
    "max_tokens": {"type": "integer", "minimum": 1, "maximum": 8},
    "n": {"type": "integer", "minimum": 1, "maximum": 3},
    "temperature": {"type": "number", "minimum": 0, "maximum": 2},
    "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
    "top_k": {"type": "integer", "minimum": -1, "maximum": 50},
    "seed": {"type": "integer", "minimum": 0, "maximum": 2**31},
    "stop": {"type": "array", "items": {"type": "string", "minLength": 1, "maxLength": 4}, "maxItems": 2},
    "do_sample": {"type": "boolean"},
    "stream": {"type": "boolean"},
}
GOOD_MESSAGES = {
    "type": "array",
    "minItems": 1,
    "maxItems": 3,
    "items": {
        "type": "object",
        "properties": {"role": {"enum": ["user", "assistant", "system"]}, "content": {"type": "string"}},
        "required": ["role", "content"],
        "additionalProperties": False,
    },
}


def plausible_body(path: str) -> dict:
    """Well-typed bodies within the limits, so that a share of the cases reaches the engine."""
    main = main_field(path)
    tensors = {
        "type": "array",
        "minItems": 1,
        "maxItems": 1,
        "items": {
            "type": "object",
            "properties": {
                "name": {"const": "text_input"},
                "shape": {"const": [1]},
                "datatype": {"const": "BYTES"},
                "data": {"type": "array", "items": TEXT, "minItems": 1, "maxItems": 1},
            },
            "required": ["name", "shape", "datatype", "data"],
        },
    }
    value = GOOD_MESSAGES if main == "messages" else tensors if path.endswith("/infer") else {**TEXT, "minLength": 1}
    if main in ("prompt", "messages", "input"):  # OpenAI-style: parameters at the top level
        props = {**GOOD_PARAMS, main: value}
        required = [main, "max_tokens"] if main != "input" else [main]
    else:  # LMI, TGI and KServe: a "parameters" object, with the token limit the default would exceed
        key = "max_tokens" if main == "text_input" else "max_new_tokens"
        params = {"type": "object", "properties": GOOD_PARAMS, "required": [key], "additionalProperties": False}
        props = {main: value, "parameters": params}
        required = [main, "parameters"] if not path.endswith("/infer") else [main]
    return {"type": "object", "properties": props, "required": required, "additionalProperties": False}


def fuzz_schema(raw: dict, plausible: bool = False) -> dict:
    """The server's document with request bodies added to POST operations and the management calls
    that change the model set left out; ``plausible`` draws well-formed cases for the served model."""
    doc = copy.deepcopy(raw)
    for path, ops in doc["paths"].items():
        for method in list(ops):
            if (method.upper(), path) in EXCLUDED:
                del ops[method]
                continue
            op = ops[method]
            for param in op.get("parameters", []):
                if param["in"] == "path" and param["name"] in MODEL_PARAMS:
                    param["schema"] = {"const": "tiny"} if plausible else {"type": "string", "minLength": 1}
                elif param["in"] == "path" and param["name"] == "version":
                    param["schema"] = {"const": "1"} if plausible else {"type": "string", "minLength": 1}
            if method == "post" and "requestBody" not in op:
                schema = plausible_body(path) if plausible else body(path)
                op["requestBody"] = {"required": True, "content": {"application/json": {"schema": schema}}}
    return doc


@pytest.fixture(scope="module")
def server(tiny_llama_dir, tmp_path_factory):
    extra = (
        "max_request_size=1048576\noption.max_new_tokens_limit=32\noption.max_n=4\noption.max_best_of=4\n"
        "option.max_input_token_len=64\n"
    )
    with start(tmp_path_factory.mktemp("openapi-fuzz") / "m", tiny_llama_dir, extra) as s:
        yield s.wait_ready()


def engine_pid(url: str) -> int:
    return httpx.get(url + "/models/tiny", timeout=30).json()[0]["enginePid"]


def test_every_operation_survives_generated_cases(server):
    raw = httpx.get(server.url + "/openapi.json", timeout=30).json()
    pid = engine_pid(server.url)
    session = requests.Session()
    failures: list[str] = []
    counts: collections.Counter[str] = collections.Counter()
    statuses: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    started = time.monotonic()

    def fuzz(op, label: str, examples: int) -> None:
        @settings(
            max_examples=examples,
            deadline=None,
            database=None,
            derandomize=True,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(case=op.as_strategy())
        def run(case):
            counts[label] += 1
            try:
                response = case.call(base_url=server.url, session=session, timeout=60)
                statuses[label][f"{response.status_code // 100}xx"] += 1
                case.validate_response(
                    response,
                    checks=[not_a_server_error, response_schema_conformance],
                    transport_kwargs={"base_url": server.url, "session": session},
                )
            except (Exception, BaseExceptionGroup) as exc:  # noqa: BLE001 - collected and reported below
                failures.append(f"{label}: {exc}")

        run()

    # any-shaped cases, then well-formed ones for the served model (operations without inputs have
    # only one case to draw, so hypothesis stops after it)
    for plausible, examples in ((False, CASES), (True, max(1, CASES // 2))):
        schema = schemathesis.openapi.from_dict(fuzz_schema(raw, plausible))
        schema.config.update(base_url=server.url, request_timeout=60)
        for result in schema.get_all_operations():
            op = result.ok()
            fuzz(op, f"{op.method.upper()} {op.path}", examples)

    elapsed = time.monotonic() - started
    print(
        f"\nopenapi fuzz: {len(counts)} operations, {sum(counts.values())} cases, {elapsed:.1f} s, "
        f"{len(failures)} failures"
    )
    for label, n in counts.items():
        print(f"  {n:4d}  {label}  {dict(sorted(statuses[label].items()))}")
    assert not failures, f"{len(failures)} failures:\n\n" + "\n\n".join(failures[:20])
    assert httpx.get(server.url + "/ping", timeout=30).status_code == 200
    assert engine_pid(server.url) == pid, "the engine process was restarted during fuzzing"
    assert server.proc.poll() is None
    assert "Traceback" not in server.log(), server.log()[-5000:]
