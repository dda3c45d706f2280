"""Request deadlines: the X-Request-Timeout header capped by predict_timeout, and the error of an expired request."""

import pytest
from starlette.requests import Request

from lmiserve.errors import BadRequest, Overloaded, PredictTimeout
from lmiserve.generation.request import RequestOutput, SequenceOutput
from lmiserve.server import deadline
from lmiserve.serving.respond import expired, output_error


def request(value: str | None) -> Request:
    headers = [] if value is None else [(b"x-request-timeout", value.encode())]
    return Request({"type": "http", "headers": headers})


@pytest.mark.parametrize(("value", "expected"), [(None, 30.0), ("5", 5.0), ("0.25", 0.25), ("1000", 30.0)])
def test_budget_is_the_header_capped_by_predict_timeout(value, expected):
    assert deadline.budget(request(value), 30.0) == expected


@pytest.mark.parametrize("value", ["", "soon", "0", "-3", "nan", "inf"])
def test_budget_refuses_a_bad_header(value):
    with pytest.raises(BadRequest, match="X-Request-Timeout"):
        deadline.budget(request(value), 30.0)


def test_a_request_that_never_produced_a_token_was_shed():
    out = RequestOutput(request_id="r", prompt="p", prompt_token_ids=[1], sequences=[SequenceOutput(index=0)])
    err = expired([out], 2.0)
    assert isinstance(err, Overloaded) and err.status == 503 and err.headers["Retry-After"]


def test_a_request_that_started_timed_out():
    seq = SequenceOutput(index=0)
    seq.tokens.append(object())
    out = RequestOutput(request_id="r", prompt="p", prompt_token_ids=[1], sequences=[seq])
    err = expired([out], 2.0)
    assert isinstance(err, PredictTimeout) and err.status == 504


def test_a_request_the_engine_shed_at_its_deadline_is_a_503():
    """The engine's scheduler may pass the deadline before the API process's timer: the same 503."""
    out = RequestOutput(request_id="r", prompt="p", prompt_token_ids=[1], sequences=[SequenceOutput(index=0)])
    out.error, out.error_kind = "the request's deadline passed before it was started", "deadline"
    err = output_error(out)
    assert isinstance(err, Overloaded) and err.status == 503 and err.headers["Retry-After"]
    assert "deadline passed" in err.detail
    out.error_kind = "oom"
    assert output_error(out).status == 500
