"""A handler in the SageMaker inference toolkit's style: model_fn, input_fn, predict_fn, output_fn."""

import csv
import io
import json
import os
from pathlib import Path


class Scaler:
    """Multiplies every number by a factor read from the model directory."""

    def __init__(self, factor: float):
        self.factor = factor

    def __call__(self, rows):
        return [[x * self.factor for x in row] for row in rows]


def model_fn(model_dir):
    factor = float((Path(model_dir) / "factor.txt").read_text())
    return Scaler(factor)


def input_fn(request_body, request_content_type):
    if request_content_type.startswith("application/json"):
        data = json.loads(request_body)
        if data.get("fail"):
            return "fail"
        return data["instances"]
    if request_content_type.startswith("text/csv"):
        text = request_body.decode("utf-8") if isinstance(request_body, bytes) else request_body
        return [[float(x) for x in row] for row in csv.reader(io.StringIO(text)) if row]
    raise ValueError(f"unsupported content type {request_content_type}")


def predict_fn(data, model):
    if data == "fail":
        raise RuntimeError("asked to fail")
    return {"outputs": model(data), "pid": os.getpid()}


def output_fn(prediction, accept):
    if accept.startswith("text/csv"):
        out = io.StringIO()
        csv.writer(out, lineterminator="\n").writerows(prediction["outputs"])
        return out.getvalue(), "text/csv"
    return json.dumps(prediction), "application/json"
