import pytest

from lmiserve.errors import BadRequest, ValidationFailed
from lmiserve.formatters.lmi_dynamic import format_response, format_stream_line, parse_request


def test_string_and_list_inputs():
    req = parse_request(b'{"inputs": "What is Deep Learning?"}')
    assert req.prompts == ["What is Deep Learning?"]
    assert req.parameters.max_new_tokens == 30 and req.parameters.do_sample is False
    req = parse_request(b'{"inputs": ["a", "b"], "parameters": {"max_new_tokens": 5, "stop_sequences": "x"}}')
    assert req.prompts == ["a", "b"]
    assert req.parameters.max_new_tokens == 5 and req.parameters.stop_sequences == ("x",)


def test_nulls_mean_defaults_and_unknown_parameters_are_ignored():
    req = parse_request(b'{"inputs": "a", "parameters": {"seed": null, "temperature": null, "details": true}}')
    assert req.parameters.seed is None and req.parameters.temperature == 1.0


@pytest.mark.parametrize(
    "body",
    [b"not json", b"[1, 2]", b'{"prompt": "x"}', b'{"inputs": "a", "parameters": [1]}'],
)
def test_malformed_bodies_are_bad_requests(body):
    with pytest.raises(BadRequest):
        parse_request(body)


@pytest.mark.parametrize(
    "params,where",
    [
        ('{"temperature": 0}', "parameters.temperature"),
        ('{"top_p": 1.5}', "parameters.top_p"),
        ('{"top_k": -1}', "parameters.top_k"),
        ('{"max_new_tokens": 0}', "parameters.max_new_tokens"),
        ('{"repetition_penalty": 0}', "parameters.repetition_penalty"),
        ('{"seed": -3}', "parameters.seed"),
        ('{"stop_sequences": [1]}', "parameters.stop_sequences.0"),
    ],
)
def test_out_of_range_parameters_are_validation_errors(params, where):
    with pytest.raises(ValidationFailed) as err:
        parse_request(b'{"inputs": "a", "parameters": ' + params.encode() + b"}")
    assert err.value.detail.startswith(where + ": ")


def test_inputs_must_be_strings():
    with pytest.raises(ValidationFailed):
        parse_request(b'{"inputs": 5}')
    with pytest.raises(ValidationFailed):
        parse_request(b'{"inputs": []}')


def test_golden_response_bytes():
    assert (
        format_response(["Deep Learning is", "é"])
        == '[{"generated_text":"Deep Learning is"},{"generated_text":"é"}]'.encode()
    )
    assert format_stream_line(["This", ""]) == b'{"outputs":["This",""]}\n'


@pytest.mark.parametrize("body", [b"nope", b'{"prompt": "x"}', b'{"inputs": "x", "parameters": []}'])
def test_malformed_body_answers_424_invoke_handler_failure(body):
    """LMI's dynamic-batch schema: errors are 424 {"code": 424, "message": "invoke handler failure", ...}."""
    from pathlib import Path

    from lmiserve.handlers.inputs import Input
    from lmiserve.handlers.text_generation import TextGenerationService

    service = TextGenerationService.__new__(TextGenerationService)  # a malformed body never reaches the model
    out = service.handle(Input({}, batch=[Input({}, [("data", body)])]))
    slot = out._slot(0)
    assert slot.code == 424 and slot.message == "invoke handler failure"
    ((key, data),) = slot.parts
    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "protocols" / "lmi" / "dynamic_error.json"
    if body == b'{"prompt": "x"}':
        if not fixture.exists():
            fixture.write_bytes(data)
        assert data == fixture.read_bytes()
    import json

    assert list(json.loads(data)) == ["code", "message", "error"]
