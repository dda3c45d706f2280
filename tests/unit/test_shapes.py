import pytest

from lmiserve.errors import BadRequest, ValidationFailed
from lmiserve.formatters import databricks
from lmiserve.formatters.shapes import invocation_shape


@pytest.mark.parametrize(
    ("body", "shape"),
    [
        ({"inputs": "hi"}, "lmi"),
        ({"inputs": ["a", "b"]}, "lmi"),
        ({"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": ["hi"]}]}, "kserve"),
        ({"messages": [{"role": "user", "content": "hi"}]}, "chat"),
        ({"prompt": "hi"}, "completions"),
        ({"input": "hi"}, "embeddings"),
        ({"inputs": "hi", "messages": []}, "lmi"),
        ({}, "lmi"),
        ([1, 2], "lmi"),
        (None, "lmi"),
    ],
)
def test_invocation_shape(body, shape):
    assert invocation_shape(body) == shape


def test_databricks_task_of():
    assert databricks.task_of({"messages": []}) == "chat"
    assert databricks.task_of({"prompt": "x"}) == "completions"
    assert databricks.task_of({"input": "x"}) == "embeddings"
    with pytest.raises(BadRequest):
        databricks.task_of({"inputs": "x"})
    with pytest.raises(BadRequest):
        databricks.task_of(["x"])


def test_databricks_completion_limits():
    req = databricks.parse_completion({"prompt": "x"})
    assert req.max_tokens is None and req.error_behavior == "error" and not req.use_raw_prompt
    (gen,) = databricks.completion_requests(req, 100)
    assert gen.params.max_new_tokens == 100 and not gen.fit_context
    (gen,) = databricks.completion_requests(
        databricks.parse_completion({"prompt": "x", "max_tokens": 5}), 100, ["<t>x"]
    )
    assert gen.params.max_new_tokens == 5 and gen.fit_context and gen.prompt == "<t>x" and not gen.add_special_tokens
    truncate = databricks.parse_completion({"prompt": "x", "max_tokens": 5, "error_behavior": "truncate"})
    assert not databricks.completion_requests(truncate, 100)[0].fit_context
    with pytest.raises(ValidationFailed):
        databricks.parse_completion({"prompt": "x", "error_behavior": "drop"})
