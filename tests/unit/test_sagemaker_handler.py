"""SageMaker-style handler modules as handle(inputs) functions: defaults and per-request errors."""

import io
import json
import types

import numpy as np
import pytest

from lmiserve.handlers import sagemaker
from lmiserve.handlers.inputs import Input
from lmiserve.handlers.outputs import split_output


def module(**fns):
    m = types.ModuleType("user_module")
    for name, fn in fns.items():
        setattr(m, name, fn)
    return m


def request(body: bytes, content_type="application/json", accept="*/*"):
    return Input({"Content-Type": content_type, "Accept": accept}, [("data", body)])


def call(handler, *requests):
    batch = requests[0] if len(requests) == 1 else Input({}, batch=list(requests))
    return split_output(handler(batch), len(requests))


def test_recognised_modules():
    assert sagemaker.is_sagemaker_module(module(model_fn=lambda d: None))
    assert sagemaker.is_sagemaker_module(module(transform_fn=lambda *a: b""))
    assert not sagemaker.is_sagemaker_module(module(model_fn=lambda d: None, handle=lambda i: None))
    assert not sagemaker.is_sagemaker_module(module(input_fn=lambda b, c: None))


def test_model_fn_gets_the_model_dir_and_defaults_do_the_rest():
    seen = []
    handler = sagemaker.handler_for(module(model_fn=lambda d: seen.append(d) or (lambda x: x * 2)))
    assert handler(Input({"model_dir": "/models/m"})) is None
    assert seen == ["/models/m"]
    (r,) = call(handler, request(b"[1, 2]"))
    assert (r.code, json.loads(r.body), r.headers["Content-Type"]) == (200, [2, 4], "application/json")


def test_default_decoders_and_encoders():
    assert sagemaker.default_input_fn(b"[[1, 2]]", "application/json").tolist() == [[1, 2]]
    assert sagemaker.default_input_fn(b"1,2\n3,4\n", "text/csv; charset=utf-8").tolist() == [[1, 2], [3, 4]]
    buf = io.BytesIO()
    np.save(buf, np.arange(3))
    assert sagemaker.default_input_fn(buf.getvalue(), "application/x-npy").tolist() == [0, 1, 2]
    assert sagemaker.default_output_fn(np.array([1, 2]), "*/*") == (b"[1, 2]", "application/json")
    assert sagemaker.default_output_fn([[1, 2], [3, 4]], "text/csv") == (b"1,2\n3,4\n", "text/csv")
    data, ctype = sagemaker.default_output_fn(np.array([1.5]), "application/x-npy")
    assert ctype == "application/x-npy" and np.load(io.BytesIO(data)).tolist() == [1.5]
    with pytest.raises(sagemaker.UnsupportedFormatError):
        sagemaker.default_input_fn(b"x", "image/png")
    with pytest.raises(sagemaker.UnsupportedFormatError):
        sagemaker.default_output_fn([1], "application/xml")


def test_default_predict_fn_runs_a_torch_module_on_a_float_tensor():
    import torch

    model = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(1.0)
    assert sagemaker.default_predict_fn(np.array([[1, 2]]), model).tolist() == [[3.0]]


def test_each_request_of_a_batch_is_answered_on_its_own():
    def predict_fn(data, model):
        if data.get("fail"):
            raise RuntimeError("no")
        return {"y": data["x"] + model}

    def output_fn(prediction, accept):
        if accept == "text/plain":
            return str(prediction["y"])  # no content type: the accept type
        return json.dumps(prediction), "application/vnd.custom+json"

    handler = sagemaker.handler_for(
        module(model_fn=lambda d: 10, input_fn=lambda b, ct: json.loads(b), predict_fn=predict_fn, output_fn=output_fn)
    )
    handler(Input({"model_dir": "."}))
    ok, failed, plain, bad_type = call(
        handler,
        request(b'{"x": 1}'),
        request(b'{"fail": true}'),
        request(b'{"x": 2}', accept="text/plain"),
        request(b"x", content_type="image/png"),
    )
    assert (ok.code, ok.body, ok.headers["Content-Type"]) == (200, b'{"y": 11}', "application/vnd.custom+json")
    assert failed.code == 500 and "RuntimeError: no" in json.loads(failed.body)["error"]
    assert (plain.code, plain.body, plain.headers["Content-Type"]) == (200, b"12", "text/plain")
    assert bad_type.code == 500  # the user's input_fn raised (invalid JSON)


def test_errors_with_a_status_code_keep_it():
    class Refused(Exception):
        status_code = 422

    def predict_fn(data, model):
        raise Refused("nope")

    handler = sagemaker.handler_for(module(model_fn=lambda d: None, predict_fn=predict_fn))
    handler(Input({}))
    (r,) = call(handler, request(b"[1]"))
    assert r.code == 422


def test_transform_fn_alone_or_not_at_all():
    handler = sagemaker.handler_for(module(model_fn=lambda d: 3, transform_fn=lambda m, b, ct, acc: (b * m, acc)))
    handler(Input({}))
    (r,) = call(handler, request(b"ab", accept="text/plain"))
    assert (r.body, r.headers["Content-Type"]) == (b"ababab", "text/plain")
    with pytest.raises(ValueError):
        sagemaker.handler_for(module(transform_fn=lambda *a: b"", predict_fn=lambda d, m: d))


def test_inference_py_is_found_like_model_py(tmp_path):
    from lmiserve.handlers.loader import load_handler, resolve_entry_point

    assert resolve_entry_point(tmp_path, None, "builtin") == "builtin"
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "inference.py").write_text("def model_fn(model_dir):\n    return model_dir\n")
    assert resolve_entry_point(tmp_path, None, "builtin") == "code/inference.py"
    (tmp_path / "inference.py").write_text("def model_fn(model_dir):\n    return model_dir\n")
    assert resolve_entry_point(tmp_path, None, "builtin") == "inference.py"
    handler = load_handler(tmp_path, "inference.py")
    assert isinstance(handler, sagemaker.SageMakerHandler)
    (tmp_path / "model.py").write_text("def handle(inputs):\n    return None\n")
    assert resolve_entry_point(tmp_path, None, "builtin") == "model.py"
