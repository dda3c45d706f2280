"""Reading a few metadata values from a GGUF file's header, without loading the file."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import BinaryIO

_SCALARS = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9


def _u32(f: BinaryIO) -> int:
    return struct.unpack("<I", f.read(4))[0]


def _u64(f: BinaryIO) -> int:
    return struct.unpack("<Q", f.read(8))[0]


def _string(f: BinaryIO) -> str:
    return f.read(_u64(f)).decode("utf-8", errors="replace")


def _skip(f: BinaryIO, kind: int) -> None:
    if kind in _SCALARS:
        f.seek(_SCALARS[kind], 1)
    elif kind == _STRING:
        f.seek(_u64(f), 1)
    elif kind == _ARRAY:
        inner, count = _u32(f), _u64(f)
        if inner in _SCALARS:
            f.seek(_SCALARS[inner] * count, 1)
        else:
            for _ in range(count):
                _skip(f, inner)
    else:
        raise ValueError(f"unknown GGUF value type {kind}")


def read_string_field(path: Path, key: str) -> str | None:
    """The string value of ``key`` in the GGUF header, or None."""
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        _u32(f)  # version
        _u64(f)  # tensor count
        for _ in range(_u64(f)):
            name = _string(f)
            kind = _u32(f)
            if name == key and kind == _STRING:
                return _string(f)
            _skip(f, kind)
    return None
