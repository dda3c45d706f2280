"""A user's handler that answers Open Inference Protocol (V2) requests: it doubles an FP32 tensor."""

from lmiserve.handlers.inputs import Input
from lmiserve.handlers.outputs import Output

INIT = {}


def handle(inputs: Input):
    if not INIT:
        INIT.update(inputs.get_properties())
        return None
    out = Output()
    for i, item in enumerate(inputs.get_batches()):
        tensor = item.get_as_json()["inputs"][0]
        doubled = [2 * x for x in tensor["data"]]
        answer = {"outputs": [{"name": "output0", "datatype": "FP32", "shape": tensor["shape"], "data": doubled}]}
        out.add_as_json(answer, batch_index=i)
    return out
