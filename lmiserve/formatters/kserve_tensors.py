"""Tensors of the Open Inference Protocol: checked construction, and the raw little-endian
layout shared by REST's binary tensor extension and gRPC's ``raw_input_contents`` (BYTES
elements as a 4-byte little-endian length, then the bytes)."""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from typing import Any

from ..errors import BadRequest

BYTES = "BYTES"
MAX_U64 = 2**64 - 1

_STRUCT = dict(zip(("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64"), "?BHIQbhiq"))
_STRUCT.update(FP16="e", FP32="f", FP64="d")
DATATYPES = (*_STRUCT, BYTES)
# The gRPC InferTensorContents field of each datatype (FP16 travels as raw contents only).
CONTENTS_FIELD = {t: ("uint" if t.startswith("UINT") else "int") + "_contents" for t in _STRUCT if "INT" in t}
CONTENTS_FIELD.update(INT64="int64_contents", UINT64="uint64_contents", BOOL="bool_contents", BYTES="bytes_contents")
CONTENTS_FIELD.update(FP32="fp32_contents", FP64="fp64_contents")


@dataclass
class Tensor:
    name: str
    datatype: str
    shape: list[int]
    data: list[Any]
    """The elements, flattened in row-major order; BYTES elements as ``bytes``."""
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass
class RequestedOutput:
    name: str
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass
class InferRequest:
    id: str
    inputs: list[Tensor]
    parameters: dict[str, Any] = field(default_factory=dict)
    outputs: list[RequestedOutput] | None = None


@dataclass
class OutputTensor:
    name: str
    datatype: str
    shape: list[int]
    data: list[Any]
    binary: bool = False
    """Sent in the binary section of a REST body rather than as JSON ``data``."""


@dataclass
class InferResponse:
    model_name: str
    model_version: str
    id: str
    outputs: list[OutputTensor]


# --- tensors -----------------------------------------------------------------------------


def _check_shape(name: str, shape: Any) -> list[int]:
    if not isinstance(shape, list) or any(type(d) is not int or d < 0 or d > MAX_U64 for d in shape):
        raise BadRequest(f"input {name!r}: shape must be a list of non-negative integers (got {shape!r})")
    return shape


def _check_element(name: str, datatype: str, value: Any) -> Any:
    if datatype == BYTES:
        if isinstance(value, str):
            return value.encode()
        if isinstance(value, bytes):
            return value
        raise BadRequest(f"input {name!r}: BYTES elements must be strings (got {value!r})")
    if datatype == "BOOL":
        if isinstance(value, bool):
            return value
    elif datatype.startswith("FP"):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif type(value) is int:
        bits = int(datatype.removeprefix("U").removeprefix("INT"))
        low, high = (0, 2**bits - 1) if datatype.startswith("U") else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
        if low <= value <= high:
            return value
    raise BadRequest(f"input {name!r}: {value!r} is not a valid {datatype} value")


def make_tensor(name: Any, datatype: Any, shape: Any, data: list[Any], parameters: Any = None) -> Tensor:
    """A checked tensor: known datatype, one element per position of ``shape``."""
    if not isinstance(name, str) or not name:
        raise BadRequest("every input needs a 'name'")
    if datatype not in DATATYPES:
        raise BadRequest(f"input {name!r}: datatype {datatype!r} is not one of {', '.join(DATATYPES)}")
    shape = _check_shape(name, shape)
    if len(data) != math.prod(shape):
        raise BadRequest(f"input {name!r}: shape {shape} needs {math.prod(shape)} elements, the data has {len(data)}")
    if parameters is not None and not isinstance(parameters, dict):
        raise BadRequest(f"input {name!r}: parameters must be an object")
    return Tensor(name, datatype, shape, [_check_element(name, datatype, v) for v in data], dict(parameters or {}))


def flatten(data: Any) -> list[Any]:
    if not isinstance(data, list):
        return [data]
    flat: list[Any] = []
    for item in data:
        flat.extend(flatten(item) if isinstance(item, list) else [item])
    return flat


def encode_bytes(elements: list[bytes | str]) -> bytes:
    """BYTES elements as raw tensor data: each one's 4-byte little-endian length, then it."""
    parts = []
    for e in elements:
        b = e.encode() if isinstance(e, str) else e
        parts += [struct.pack("<I", len(b)), b]
    return b"".join(parts)


def decode_bytes(raw: bytes, name: str = "tensor") -> list[bytes]:
    out, pos = [], 0
    while pos < len(raw):
        if pos + 4 > len(raw):
            raise BadRequest(f"input {name!r}: raw BYTES data ends inside a length prefix")
        (size,) = struct.unpack_from("<I", raw, pos)
        pos += 4
        if pos + size > len(raw):
            raise BadRequest(f"input {name!r}: a raw BYTES element of {size} bytes runs past the end of the data")
        out.append(bytes(raw[pos : pos + size]))
        pos += size
    return out


def decode_raw(datatype: str, raw: bytes, name: str = "tensor") -> list[Any]:
    """Raw tensor data (little-endian, row-major) as a flat list of elements."""
    if datatype == BYTES:
        return decode_bytes(raw, name)
    code = _STRUCT.get(datatype)
    if code is None:
        raise BadRequest(f"input {name!r}: datatype {datatype!r} is not one of {', '.join(DATATYPES)}")
    size = struct.calcsize(code)
    if len(raw) % size:
        raise BadRequest(f"input {name!r}: {len(raw)} bytes of raw data is not a whole number of {datatype} values")
    return list(struct.unpack(f"<{len(raw) // size}{code}", raw))


def encode_raw(datatype: str, data: list[Any]) -> bytes:
    if datatype == BYTES:
        return encode_bytes(data)
    return struct.pack(f"<{len(data)}{_STRUCT[datatype]}", *data)
