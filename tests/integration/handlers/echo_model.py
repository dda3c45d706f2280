"""A user handler that echoes what it received: batch size, pid, properties."""

import os
import time

from lmiserve.handlers.inputs import Input
from lmiserve.handlers.outputs import Output

INIT = {}


def handle(inputs: Input):
    if not INIT:
        INIT.update(inputs.get_properties())
        return None
    out = Output()
    for i, item in enumerate(inputs.get_batches()):
        body = item.get_as_json() if item.get_as_bytes() else {}
        if body.get("sleep"):
            time.sleep(body["sleep"])
        if body.get("raise"):
            raise ValueError(body["raise"])
        if body.get("stream"):
            out.add_stream_content(({"n": n} for n in range(body["stream"])), batch_index=i)
            continue
        out.add_as_json(
            {
                "batch_size": inputs.get_batch_size(),
                "is_batch": inputs.is_batch(),
                "pid": os.getpid(),
                "body": body,
                "greeting": item.get_property("greeting"),
                "content_type": item.get_property("content-type"),
                "custom_option": INIT.get("custom_option"),
            },
            batch_index=i,
        )
    return out
