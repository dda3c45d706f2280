"""A user handler that answers once the file named in the request exists (a request kept in flight)."""

import time
from pathlib import Path

from lmiserve.handlers.inputs import Input
from lmiserve.handlers.outputs import Output


def handle(inputs: Input):
    if inputs.is_empty():
        return None
    out = Output()
    for i, item in enumerate(inputs.get_batches()):
        gate = Path(item.get_as_json()["gate"])
        deadline = time.monotonic() + 120
        while not gate.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        out.add_as_json({"opened": gate.exists()}, batch_index=i)
    return out
