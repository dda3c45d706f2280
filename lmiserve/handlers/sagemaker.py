"""SageMaker-style handlers: ``model_fn``, ``input_fn``, ``predict_fn``, ``output_fn``.

A ``model.py`` (or ``inference.py``) written for the SageMaker inference toolkit defines
``model_fn(model_dir)`` and any of ``input_fn(request_body, request_content_type)``,
``predict_fn(data, model)`` and ``output_fn(prediction, accept)`` (or ``transform_fn(model,
request_body, content_type, accept)`` instead of the last three). This module turns such a
module into a ``handle(inputs)`` function for the handler workers, so it runs through the
dynamic batcher like any other handler.

The missing functions get the toolkit's defaults: ``input_fn`` decodes JSON, CSV and NPY
bodies into a numpy array by content type, ``predict_fn`` calls the model with the data
(``model(data)``) and ``output_fn`` encodes the prediction as JSON, CSV or NPY by accept
type. An unsupported content or accept type answers 415; any other failure answers 500 for
that request only. ``output_fn`` may return ``(body, content_type)``; otherwise the response's
content type is the accept type.
"""

from __future__ import annotations

import io
import json
import logging
import traceback
from collections.abc import Callable
from types import ModuleType
from typing import Any

from .inputs import Input
from .outputs import Output

log = logging.getLogger("lmiserve.handler")

JSON = "application/json"
CSV = "text/csv"
NPY = "application/x-npy"
ANY = "*/*"
DEFAULT_ACCEPT = JSON

HOOKS = ("model_fn", "input_fn", "predict_fn", "output_fn", "transform_fn")


class InferenceError(Exception):
    """A failure answered with its own status code (the toolkit's inference errors)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class UnsupportedFormatError(InferenceError):
    """A content or accept type the default functions cannot handle (415)."""

    def __init__(self, content_type: str, kind: str = "content type"):
        super().__init__(415, f"{kind} {content_type!r} is not supported; use {JSON}, {CSV} or {NPY}")


def is_sagemaker_module(module: ModuleType) -> bool:
    """A module written for the inference toolkit: it defines ``model_fn`` or ``transform_fn``
    (and no ``handle``)."""
    return not callable(getattr(module, "handle", None)) and any(
        callable(getattr(module, name, None)) for name in ("model_fn", "transform_fn")
    )


def _media(content_type: str | None) -> str:
    return (content_type or "").split(";", 1)[0].strip().lower()


# --- the toolkit's default functions -----------------------------------------------------


def default_input_fn(request_body: bytes, content_type: str) -> Any:
    """JSON, CSV and NPY bodies as a numpy array (CSV: one row per line, always 2-D)."""
    import numpy as np

    media = _media(content_type) or JSON
    if isinstance(request_body, str):
        request_body = request_body.encode("utf-8")
    if media == JSON:
        return np.array(json.loads(request_body))
    if media == CSV:
        text = request_body.decode("utf-8")
        return np.genfromtxt(io.StringIO(text), delimiter=",", dtype=np.float32, ndmin=2)
    if media == NPY:
        return np.load(io.BytesIO(request_body), allow_pickle=False)
    raise UnsupportedFormatError(content_type)


def default_predict_fn(data: Any, model: Any) -> Any:
    """Call the model on the data; a torch module gets a tensor and runs without gradients."""
    if not callable(model):
        raise InferenceError(500, "the model returned by model_fn is not callable; define predict_fn")
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return model(data)
    if isinstance(model, torch.nn.Module):
        tensor = data if isinstance(data, torch.Tensor) else torch.as_tensor(data)
        param = next(model.parameters(), None)
        if param is not None and param.is_floating_point():  # JSON and CSV numbers decode as float64
            tensor = tensor.to(device=param.device, dtype=param.dtype)
        with torch.no_grad():
            return model(tensor)
    return model(data)


def _plain(prediction: Any) -> Any:
    """Tensors and arrays as nested lists; everything else as it is."""
    if hasattr(prediction, "detach"):  # a torch tensor
        prediction = prediction.detach().cpu().numpy()
    if hasattr(prediction, "tolist"):
        return prediction.tolist()
    return prediction


def default_output_fn(prediction: Any, accept: str) -> tuple[bytes, str]:
    """The prediction as JSON, CSV (a 1-D prediction is one row) or NPY, by accept type."""
    import numpy as np

    media = _media(accept) or DEFAULT_ACCEPT
    if media == ANY:
        media = DEFAULT_ACCEPT
    if media == JSON:
        return json.dumps(_plain(prediction)).encode("utf-8"), JSON
    if media == CSV:
        out = io.StringIO()
        np.savetxt(out, np.atleast_2d(np.asarray(_plain(prediction))), delimiter=",", fmt="%s")
        return out.getvalue().encode("utf-8"), CSV
    if media == NPY:
        out_bytes = io.BytesIO()
        np.save(out_bytes, np.asarray(_plain(prediction)), allow_pickle=False)
        return out_bytes.getvalue(), NPY
    raise UnsupportedFormatError(accept, "accept type")


# --- the handler ---------------------------------------------------------------------------


def _to_bytes(value: Any) -> bytes:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (bytes, str)):  # toolkit style
        return _to_bytes(value[0])
    return json.dumps(_plain(value)).encode("utf-8")


class SageMakerHandler:
    """``handle(inputs)`` over a toolkit-style module. The first call (the model's
    properties) loads the model with ``model_fn``; each later call answers every request of
    the batch on its own: one request's failure is that request's error response only."""

    def __init__(self, module: ModuleType):
        self.module = module
        fns = {name: getattr(module, name, None) for name in HOOKS}
        self.transform_fn: Callable[..., Any] | None = fns["transform_fn"]
        if self.transform_fn is not None and any(fns[n] for n in ("input_fn", "predict_fn", "output_fn")):
            raise ValueError("define transform_fn, or input_fn/predict_fn/output_fn, not both")
        self.model_fn: Callable[[str], Any] | None = fns["model_fn"]
        self.input_fn: Callable[..., Any] = fns["input_fn"] or default_input_fn
        self.predict_fn: Callable[..., Any] = fns["predict_fn"] or default_predict_fn
        self.output_fn: Callable[..., Any] = fns["output_fn"] or default_output_fn
        self.model: Any = None
        self.loaded = False

    def __call__(self, inputs: Input) -> Output | None:
        if not self.loaded:
            model_dir = inputs.get_property("model_dir") or "."
            self.model = self.model_fn(model_dir) if self.model_fn is not None else None
            self.loaded = True
            return None
        out = Output()
        for index, item in enumerate(inputs.get_batches()):
            self._one(item, out, index)
        return out

    def _one(self, item: Input, out: Output, index: int) -> None:
        content_type = item.get_property("Content-Type") or JSON
        accept = item.get_property("Accept") or DEFAULT_ACCEPT
        if _media(accept) == ANY:
            accept = DEFAULT_ACCEPT
        body = item.get_as_bytes()
        try:
            if self.transform_fn is not None:
                result = self.transform_fn(self.model, body, content_type, accept)
            else:
                data = self.input_fn(body, content_type)
                prediction = self.predict_fn(data, self.model)
                result = self.output_fn(prediction, accept)
        except InferenceError as exc:
            out.error(str(exc), code=exc.status, message=type(exc).__name__, batch_index=index)
            return
        except Exception as exc:  # noqa: BLE001 - any failure ends this request only
            log.error("request %d of the batch failed:\n%s", index, traceback.format_exc())
            error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            out.error(error, code=_status_of(exc), message="inference failure", batch_index=index)
            return
        if isinstance(result, tuple) and len(result) == 2:
            body_out, response_type = result
        else:
            body_out, response_type = result, accept
        out.add(_to_bytes(body_out), batch_index=index)
        out.add_property("Content-Type", str(response_type), batch_index=index)


def _status_of(exc: BaseException) -> int:
    """A user's own error class may carry a status code, as the toolkit's errors do."""
    status = getattr(exc, "status_code", None) or getattr(exc, "status", None)
    return status if isinstance(status, int) and 400 <= status < 600 else 500


def handler_for(module: ModuleType) -> Callable[[Input], Output | None]:
    return SageMakerHandler(module)
