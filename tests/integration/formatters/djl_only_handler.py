"""A handle(inputs) handler that imports only from djl_python, as LMI handlers do."""

from djl_python import Input, Output
from djl_python.inputs import Input as InputAgain
from djl_python.outputs import Output as OutputAgain

assert Input is InputAgain and Output is OutputAgain


def handle(inputs: Input) -> Output:
    if inputs.is_empty():
        return None
    body = inputs.get_as_json()
    words = str(body.get("text", "")).split()
    if body.get("stream"):
        return Output().add_stream_content({"word": w} for w in words)
    return Output().add_as_json({"words": words, "count": len(words)})
