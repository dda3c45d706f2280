"""The GGUF tensor index agrees with gguf-py's reader: names, shapes, types, bytes and scalar metadata."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as GT
from gguf import GGUFReader, GGUFWriter
from gguf.quants import quantize

from lmiserve.rolling_batch.quant.gguf_index import read_index


@pytest.fixture()
def gguf_file(tmp_path):
    path = tmp_path / "t.gguf"
    writer = GGUFWriter(str(path), "llama")
    writer.add_uint32("llama.attention.head_count", 4)
    writer.add_string("general.name", "tiny")
    writer.add_token_list([f"tok{i}" for i in range(300)])  # an array of strings, skipped
    writer.add_array("llama.some_ints", [1, 2, 3])
    rng = np.random.default_rng(0)
    writer.add_tensor("f32", rng.standard_normal((3, 5)).astype(np.float32))
    writer.add_tensor("f16", rng.standard_normal((2, 4, 8)).astype(np.float16))
    bf16 = rng.integers(0, 2**16, (4, 6), dtype=np.uint16)
    writer.add_tensor("bf16", bf16.view(np.uint8), raw_shape=(4, 12), raw_dtype=GT.BF16)  # bytes
    for kind in (GT.Q4_0, GT.Q4_1, GT.Q8_0):
        q = quantize(rng.standard_normal((6, 64)).astype(np.float32), kind)
        writer.add_tensor(kind.name.lower(), q, raw_shape=q.shape, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_index_matches_gguf_py(gguf_file) -> None:
    meta, tensors = read_index(gguf_file)
    reader = GGUFReader(str(gguf_file))
    assert [t.name for t in tensors] == [t.name for t in reader.tensors]
    for ours, theirs in zip(tensors, reader.tensors):
        assert ours.shape == tuple(int(d) for d in theirs.shape), ours.name
        assert ours.tensor_type == theirs.tensor_type, ours.name
        assert ours.data.view(np.uint8).tobytes() == np.asarray(theirs.data).view(np.uint8).tobytes(), ours.name
    assert tensors[0].data.shape == (3, 5) and tensors[0].data.dtype == np.float32
    assert tensors[1].data.shape == (2, 4, 8) and tensors[1].data.dtype == np.float16
    assert tensors[2].data.shape == (4, 6) and tensors[2].data.dtype == np.uint16
    assert tensors[3].data.shape[0] == 6 and tensors[3].data.dtype == np.uint8
    assert meta["general.architecture"] == "llama" and meta["general.name"] == "tiny"
    assert meta["llama.attention.head_count"] == 4
    assert "tokenizer.ggml.tokens" not in meta and "llama.some_ints" not in meta


def test_not_gguf(tmp_path) -> None:
    (tmp_path / "x").write_bytes(b"nope" + bytes(32))
    with pytest.raises(ValueError, match="not a GGUF file"):
        read_index(tmp_path / "x")
