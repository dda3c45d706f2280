"""A user's text-generation handler in DJL's style: it reads LMI's dynamic-batch schema and
answers ``[{"generated_text": ...}]``, a text that says what it was given."""

from lmiserve.handlers.inputs import Input
from lmiserve.handlers.outputs import Output

INIT = {}


def handle(inputs: Input):
    if not INIT:
        INIT.update(inputs.get_properties())
        return None
    out = Output()
    for i, item in enumerate(inputs.get_batches()):
        body = item.get_as_json()
        names = " ".join(sorted(body.get("parameters") or {}))
        text = f"seen {len(body['inputs'])} characters with {names}"
        out.add_as_json([{"generated_text": text}], batch_index=i)
    return out
