"""A GGUF file's tensors as views of the mapped file, and its scalar metadata, read in one pass.

gguf-py's reader builds an object for every part of every metadata value, the tokenizer's tens of
thousands of strings included, which takes seconds; the weights need only the scalars and the
tensor table, so arrays are skipped here and each tensor is a slice of one memory map.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

_SCALAR_FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_DEFAULT_ALIGNMENT = 32
_DTYPES = {
    GGMLQuantizationType.F32: np.float32,
    GGMLQuantizationType.F16: np.float16,
    GGMLQuantizationType.BF16: np.uint16,
    GGMLQuantizationType.F64: np.float64,
    GGMLQuantizationType.I8: np.int8,
    GGMLQuantizationType.I16: np.int16,
    GGMLQuantizationType.I32: np.int32,
    GGMLQuantizationType.I64: np.int64,
}
"""Element types stored unquantized; every other type is read as bytes, one row per row."""


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    shape: tuple[int, ...]
    """In GGUF's order: the innermost (row) dimension first."""
    tensor_type: GGMLQuantizationType
    data: np.ndarray
    """Unquantized types: the elements, outermost dimension first (BF16 as uint16). Quantized:
    the bytes of each row, ``(rows..., row bytes)``."""


def _read(f: BinaryIO, fmt: str) -> int | float | bool:
    return struct.unpack(fmt, f.read(struct.calcsize(fmt)))[0]


def _string(f: BinaryIO) -> str:
    return f.read(int(_read(f, "<Q"))).decode("utf-8", errors="replace")


def _skip_array(f: BinaryIO) -> None:
    inner, count = int(_read(f, "<I")), int(_read(f, "<Q"))
    if inner in _SCALAR_FORMATS:
        f.seek(struct.calcsize(_SCALAR_FORMATS[inner]) * count, 1)
    elif inner == _STRING:
        for _ in range(count):
            f.seek(int(_read(f, "<Q")), 1)
    elif inner == _ARRAY:
        for _ in range(count):
            _skip_array(f)
    else:
        raise ValueError(f"unknown GGUF value type {inner}")


def _data_shape(shape: tuple[int, ...], kind: GGMLQuantizationType) -> tuple[tuple[int, ...], type]:
    outer = tuple(reversed(shape))
    if kind in _DTYPES:
        return outer, _DTYPES[kind]
    block, size = GGML_QUANT_SIZES[kind]
    if shape[0] % block:
        raise ValueError(f"a {kind.name} row of {shape[0]} values is not whole blocks of {block}")
    return (*outer[:-1], shape[0] // block * size), np.uint8


def read_index(path: Path) -> tuple[dict[str, str | int | float | bool], list[GGUFTensor]]:
    """The file's scalar and string metadata (arrays left out) and its tensors, in file order."""
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        version = _read(f, "<I")
        if version < 2:
            raise ValueError(f"{path}: GGUF version {version} is not supported")
        tensor_count, kv_count = int(_read(f, "<Q")), int(_read(f, "<Q"))
        meta: dict[str, str | int | float | bool] = {}
        for _ in range(kv_count):
            key, kind = _string(f), int(_read(f, "<I"))
            if kind in _SCALAR_FORMATS:
                meta[key] = _read(f, _SCALAR_FORMATS[kind])
            elif kind == _STRING:
                meta[key] = _string(f)
            elif kind == _ARRAY:
                _skip_array(f)
            else:
                raise ValueError(f"{path}: unknown GGUF value type {kind} for {key}")
        infos = []
        for _ in range(tensor_count):
            name = _string(f)
            n_dims = int(_read(f, "<I"))
            shape = struct.unpack(f"<{n_dims}Q", f.read(8 * n_dims))
            kind = GGMLQuantizationType(int(_read(f, "<I")))
            infos.append((name, shape, kind, int(_read(f, "<Q"))))
        alignment = int(meta.get("general.alignment", _DEFAULT_ALIGNMENT))
        start = -(-f.tell() // alignment) * alignment
    mapped = np.memmap(path, dtype=np.uint8, mode="r")
    tensors = []
    for name, shape, kind, offset in infos:
        data_shape, dtype = _data_shape(shape, kind)
        count = int(np.prod(data_shape))
        begin = start + offset
        raw = mapped[begin : begin + count * np.dtype(dtype).itemsize]
        tensors.append(GGUFTensor(name, shape, kind, raw.view(dtype).reshape(data_shape)))
    return meta, tensors
