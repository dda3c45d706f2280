"""Our own request schema: {"question": ..., "length": ..., "stream": ...}."""

from djl_python import Input
from djl_python.input_parser import input_formatter
from djl_python.request_io import TextInput


@input_formatter
def question_schema(inputs: Input) -> TextInput:
    body = inputs.get_as_json()
    if "question" not in body:
        raise ValueError('send {"question": ...}')
    return TextInput(
        input_text=f"Question: {body['question']}\nAnswer:",
        parameters={"max_new_tokens": body.get("length", 5), "details": True},
        stream=body.get("stream", False),
    )
