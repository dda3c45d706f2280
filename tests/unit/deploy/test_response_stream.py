import random

import pytest
from botocore.eventstream import EventStream
from botocore.loaders import Loader
from botocore.model import ServiceModel
from botocore.parsers import EventStreamJSONParser

from lmiserve.deploy.invoke import stream_lines
from lmiserve.deploy.response_stream import ResponseStreamError, payload_parts
from tests.aws.event_stream import encode_message, exception_event, payload_part, split_randomly, stream_body

LINES = [
    '{"token": {"id": 9906, "text": "Bonjour", "log_prob": -0.5}}',
    '{"token": {"id": 12, "text": " à tous 🙂", "log_prob": -1.25}}',
    '{"token": {"id": 2, "text": "—ok"}, "generated_text": "Bonjour à tous 🙂—ok"}',
]
PAYLOAD = ("\n".join(LINES) + "\n").encode()


class _Raw:
    def __init__(self, pieces):
        self._pieces = pieces

    def stream(self, *args, **kwargs):
        yield from self._pieces


def _botocore_events(body: bytes) -> list[dict]:
    """The stream as botocore itself parses InvokeEndpointWithResponseStream's answer."""
    model = ServiceModel(Loader().load_service_model("sagemaker-runtime", "service-2"), "sagemaker-runtime")
    shape = model.operation_model("InvokeEndpointWithResponseStream").output_shape.members["Body"]
    return list(EventStream(_Raw([body]), shape, EventStreamJSONParser(), "InvokeEndpointWithResponseStream"))


def test_the_encoding_is_what_botocore_reads_as_sagemaker_payload_parts():
    body = payload_part(b'{"a": 1}\n') + payload_part("é".encode()[:1])
    assert _botocore_events(body) == [{"PayloadPart": {"Bytes": b'{"a": 1}\n'}}, {"PayloadPart": {"Bytes": b"\xc3"}}]


@pytest.mark.parametrize("seed", range(100))
def test_lines_from_event_bytes_split_at_random_points(seed):
    rng = random.Random(seed)
    body = stream_body(PAYLOAD, rng)
    chunks = split_randomly(body, rng, most=rng.choice([1, 7, 64, 500]))
    emitted: list[str] = []
    assert stream_lines(iter(chunks), emitted.append) == len(LINES)
    assert emitted == LINES
    assert b"".join(payload_parts(iter(chunks))) == PAYLOAD


@pytest.mark.parametrize("seed", range(20))
def test_model_stream_error_ends_the_stream_with_its_code_and_message(seed):
    rng = random.Random(seed)
    error = exception_event(
        "ModelStreamError", {"Message": "the model took too long", "ErrorCode": "ModelInvocationTimeExceeded"}
    )
    body = stream_body(PAYLOAD[:-10], rng, error=error)
    emitted: list[str] = []
    with pytest.raises(ResponseStreamError) as caught:
        stream_lines(iter(split_randomly(body, rng, most=33)), emitted.append)
    assert emitted == LINES[:2]  # the lines before the error were printed as they came
    assert caught.value.kind == "ModelStreamError"
    assert caught.value.error_code == "ModelInvocationTimeExceeded"
    assert caught.value.message == "the model took too long"
    assert str(caught.value) == "ModelStreamError (ModelInvocationTimeExceeded): the model took too long"


def test_internal_stream_failure():
    body = payload_part(b"{}\n") + exception_event("InternalStreamFailure", {"Message": "try again"})
    parts = payload_parts(iter([body]))
    assert next(parts) == b"{}\n"
    with pytest.raises(ResponseStreamError, match="InternalStreamFailure: try again") as caught:
        next(parts)
    assert caught.value.error_code is None


def test_error_message_type_and_unknown_events():
    unknown = encode_message({":message-type": "event", ":event-type": "SomethingNew"}, b"?")
    error = encode_message({":message-type": "error", ":error-code": "Throttled", ":error-message": "slow down"}, b"")
    parts = payload_parts(iter([unknown + payload_part(b"x") + error]))
    assert next(parts) == b"x"
    with pytest.raises(ResponseStreamError, match="Throttled: slow down"):
        next(parts)


def test_a_body_that_stops_inside_an_event_is_an_error():
    body = payload_part(b'{"a": 1}\n') + payload_part(b'{"b": 2}\n')
    with pytest.raises(ResponseStreamError, match="ended inside an event") as caught:
        list(payload_parts(iter([body[:-5]])))
    assert caught.value.kind == "IncompleteStream"


def test_exception_payload_that_is_not_json():
    body = encode_message({":message-type": "exception", ":exception-type": "ModelStreamError"}, b"broken pipe")
    with pytest.raises(ResponseStreamError, match="ModelStreamError: broken pipe"):
        list(payload_parts(iter([body])))


def test_each_line_is_emitted_before_the_next_chunk_is_read():
    emitted: list[str] = []
    first = payload_part(PAYLOAD[: len(LINES[0]) + 5])  # the first line and a little of the second
    body = first + payload_part(PAYLOAD[len(LINES[0]) + 5 :])

    def chunks():
        yield body[: len(first) + 3]
        assert emitted == LINES[:1]  # printed while the rest was still on its way
        yield body[len(first) + 3 :]

    assert stream_lines(chunks(), emitted.append) == 3
