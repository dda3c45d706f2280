"""``lmiserve invoke``: InvokeEndpoint on moto; the response stream and model errors on a loopback stub.

moto does not emulate InvokeEndpointWithResponseStream, so the SageMaker runtime's endpoint is pointed
(AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME) at a local server answering real event-stream bytes.
"""

import json
import random

import pytest

from lmiserve.cli import main
from tests.aws.event_stream import exception_event, stream_body
from tests.aws.stream_stub import RuntimeStub

from .conftest import REGION

TOKENS = ["Deep", " learning", " – ", "深度学习", " 🤖", "!"]
JSONLINES = [json.dumps({"token": {"id": i, "text": t}}, ensure_ascii=False) for i, t in enumerate(TOKENS)] + [
    json.dumps({"token": {"id": 6, "text": ""}, "generated_text": "".join(TOKENS)}, ensure_ascii=False)
]


@pytest.fixture
def runtime(aws, monkeypatch):
    with RuntimeStub() as stub:
        monkeypatch.setenv("AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME", stub.url)
        yield stub


def test_invoke_on_the_emulator(aws, emulator, capsys):
    answer = {"generated_text": "Deep learning is a subfield of machine learning."}
    emulator.set_invoke_results(
        [
            {
                "Body": json.dumps(answer),
                "ContentType": "application/json",
                "InvokedProductionVariant": "AllTraffic",
                "CustomAttributes": "x-request-id=7",
            }
        ],
        REGION,
    )
    body = json.dumps({"inputs": "What is Deep Learning?", "parameters": {"max_new_tokens": 32}})
    assert main(["invoke", "--endpoint", "llm", "--body", body, "--custom-attributes", "trace=1", "-v"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out) == answer
    assert "InvokedProductionVariant: AllTraffic" in captured.err
    assert "CustomAttributes: x-request-id=7" in captured.err
    assert emulator.actions("rest") == ["rest.POST /endpoints/llm/invocations"]


@pytest.mark.parametrize("seed", range(5))
def test_stream_prints_whole_lines(runtime, capsys, tmp_path, seed):
    rng = random.Random(seed)
    runtime.stream_body = stream_body(("\n".join(JSONLINES) + "\n").encode(), rng, most_per_part=rng.randint(1, 12))
    runtime.seed = seed
    request = tmp_path / "request.json"
    request.write_text(json.dumps({"inputs": "What is Deep Learning?", "stream": True}))
    args = ["invoke", "--endpoint", "llm", "--stream", "--file", str(request), "--custom-attributes", "trace=2"]
    assert main(args) == 0
    assert capsys.readouterr().out.splitlines() == JSONLINES
    [sent] = runtime.requests
    assert sent["path"] == "/endpoints/llm/invocations-response-stream"
    assert sent["headers"]["Content-Type"] == "application/json"
    assert sent["headers"]["X-Amzn-SageMaker-Custom-Attributes"] == "trace=2"
    assert json.loads(sent["body"]) == {"inputs": "What is Deep Learning?", "stream": True}
    assert sent["headers"]["Authorization"].startswith("AWS4-HMAC-SHA256 Credential=testing/")


def test_stream_of_server_sent_events(runtime, capsys):
    events = "".join(f"data: {line}\n\n" for line in JSONLINES)
    runtime.stream_body = stream_body(events.encode(), random.Random(7), most_per_part=3)
    runtime.content_type = "text/event-stream"
    assert main(["invoke", "--endpoint", "llm", "--stream", "--body", '{"inputs": "hi", "stream": true}', "-v"]) == 0
    captured = capsys.readouterr()
    assert captured.out == events
    assert "ContentType: text/event-stream" in captured.err


def test_model_stream_error_is_reported_after_the_lines_before_it(runtime, capsys):
    error = exception_event(
        "ModelStreamError",
        {
            "Message": "Your model did not finish sending the response in time",
            "ErrorCode": "ModelInvocationTimeExceeded",
        },
    )
    payload = ("\n".join(JSONLINES[:3]) + "\n" + JSONLINES[3][:9]).encode()
    runtime.stream_body = stream_body(payload, random.Random(3), error=error)
    assert main(["invoke", "--endpoint", "llm", "--stream", "--body", "{}"]) == 1
    captured = capsys.readouterr()
    assert captured.out.splitlines() == JSONLINES[:3]
    assert captured.err == (
        "lmiserve: the response stream failed: ModelStreamError (ModelInvocationTimeExceeded): "
        "Your model did not finish sending the response in time\n"
    )


def test_internal_stream_failure(runtime, capsys):
    runtime.stream_body = stream_body(
        b'{"token": {}}\n',
        random.Random(1),
        error=exception_event("InternalStreamFailure", {"Message": "The stream processing failed. Try again."}),
    )
    assert main(["invoke", "--endpoint", "llm", "--stream", "--body", "{}"]) == 1
    captured = capsys.readouterr()
    assert captured.out == '{"token": {}}\n'
    assert "InternalStreamFailure: The stream processing failed. Try again." in captured.err


@pytest.mark.parametrize("stream", [False, True])
def test_model_error_shows_the_container_answer(runtime, capsys, stream):
    runtime.model_error = {
        "ErrorCode": "CLIENT_ERROR_FROM_MODEL",
        "Message": 'Received client error (424) from primary with message "{"code":424}".',
        "OriginalStatusCode": 424,
        "OriginalMessage": '{"error": "prompt too long", "code": 424}',
        "LogStreamArn": "arn:aws:logs:us-west-2:123456789012:log-group:/aws/sagemaker/Endpoints/llm",
    }
    assert main(["invoke", "--endpoint", "llm", "--body", '{"inputs": "x"}'] + (["--stream"] if stream else [])) == 1
    err = capsys.readouterr().err
    assert 'ModelError: the model answered 424: {"error": "prompt too long", "code": 424}' in err
    assert "logs: arn:aws:logs:us-west-2:123456789012:log-group:/aws/sagemaker/Endpoints/llm" in err
