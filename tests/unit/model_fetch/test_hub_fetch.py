"""Models fetched by Hub id from a Hub on 127.0.0.1: the files, the cache layout, and each error."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from lmiserve.model_fetch import FetchError, FetchOptions, fetch_model
from lmiserve.model_fetch import hub as hub_module

CONFIG = b'{"architectures": ["LlamaForCausalLM"]}'
WEIGHTS = os.urandom(3 * 1024 * 1024 + 17)


def _files(**extra: bytes) -> dict[str, bytes]:
    return {"config.json": CONFIG, "tokenizer.json": b"{}", "model.safetensors": WEIGHTS, "README.md": b"#", **extra}


def test_a_repository_by_id_and_revision_lands_in_the_hugging_face_cache_layout(hub_env, tmp_path: Path):
    hub_env.add("org/llama", _files(), revision="main")
    commit = hub_env.add("org/llama", _files(**{"generation_config.json": b"{}"}), revision="v2")
    path = fetch_model("org/llama", None, FetchOptions(download_dir=tmp_path, revision="v2"))
    repo = tmp_path / "models--org--llama"
    assert path == repo / "snapshots" / commit
    assert sorted(p.name for p in path.iterdir()) == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
    ]
    assert (path / "model.safetensors").read_bytes() == WEIGHTS
    assert (path / "model.safetensors").resolve() == repo / "blobs" / hashlib.sha256(WEIGHTS).hexdigest()
    assert (repo / "refs" / "v2").read_text() == commit
    assert not list(repo.rglob("*.part*"))
    # huggingface_hub finds it in its cache as its own, offline
    from huggingface_hub import snapshot_download

    assert Path(snapshot_download("org/llama", revision="v2", cache_dir=tmp_path, local_files_only=True)) == path


def test_a_second_fetch_downloads_nothing_and_offline_reads_the_cache(hub_env, tmp_path: Path):
    hub_env.add("org/again", _files())
    first = fetch_model("org/again", None, FetchOptions(download_dir=tmp_path))
    sent = sum(hub_env.sent.values())
    assert fetch_model("org/again", None, FetchOptions(download_dir=tmp_path)) == first
    assert sum(hub_env.sent.values()) == sent
    assert fetch_model("org/again", None, FetchOptions(download_dir=tmp_path, offline=True)) == first
    with pytest.raises(FetchError, match=r"org/never@main is not in the Hugging Face cache .* HF_HUB_OFFLINE=1"):
        fetch_model("org/never", None, FetchOptions(download_dir=tmp_path, offline=True))


def test_only_safetensors_are_fetched_when_the_repository_has_bin_weights_too(hub_env, tmp_path: Path):
    hub_env.add("org/both", _files(**{"pytorch_model.bin": b"b" * 5000, "model.onnx": b"o"}))
    path = fetch_model("org/both", None, FetchOptions(download_dir=tmp_path))
    assert "pytorch_model.bin" not in {p.name for p in path.iterdir()}
    assert {name for name in hub_env.sent if name.startswith("org/both/")} == {
        "org/both/config.json",
        "org/both/tokenizer.json",
        "org/both/model.safetensors",
    }


def test_one_gguf_file_is_chosen_from_several(hub_env, tmp_path: Path):
    hub_env.add("org/m-GGUF", {"m-Q8_0.gguf": b"8" * 800, "m-Q4_K_M.gguf": b"4" * 400, "mmproj-m.gguf": b"p"})
    options = FetchOptions(download_dir=tmp_path)
    assert fetch_model("org/m-GGUF", None, options).read_bytes() == b"4" * 400  # llama.cpp's default
    assert fetch_model("org/m-GGUF:Q8_0", None, options).read_bytes() == b"8" * 800
    assert {n for n in hub_env.sent if n.startswith("org/m-GGUF/")} == {
        "org/m-GGUF/m-Q4_K_M.gguf",
        "org/m-GGUF/m-Q8_0.gguf",
    }


def test_a_private_repository_needs_the_token_and_no_message_shows_it(hub_env, tmp_path: Path, monkeypatch):
    hub_env.add("org/private", _files(), token="hf_secret_value")
    options = FetchOptions(download_dir=tmp_path)
    with pytest.raises(FetchError) as missing:
        fetch_model("org/private", None, options)
    assert str(missing.value) == (
        "org/private: the Hub answered 401: the repository is private or gated; set HF_TOKEN to a token with read access"
    )
    monkeypatch.setenv("HUGGING_FACE_HUB_TOKEN", "hf_wrong_value")
    with pytest.raises(FetchError) as wrong:
        fetch_model("org/private", None, options)
    assert "the HF_TOKEN given is not valid, or has no access" in str(wrong.value)
    assert "hf_wrong_value" not in str(wrong.value)
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value")
    assert (fetch_model("org/private", None, options) / "config.json").read_bytes() == CONFIG


def test_a_gated_repository_says_to_accept_its_terms(hub_env, tmp_path: Path, monkeypatch):
    hub_env.add("org/gated", _files(), token="hf_granted")
    hub_env.repos["org/gated"].gated = True
    options = FetchOptions(download_dir=tmp_path)
    with pytest.raises(FetchError) as missing:
        fetch_model("org/gated", None, options)
    assert str(missing.value) == (
        "org/gated is a gated repository: set HF_TOKEN to a token of an account that accepted its terms on the Hub"
    )
    monkeypatch.setenv("HF_TOKEN", "hf_not_granted")
    with pytest.raises(FetchError, match="the HF_TOKEN given has no access to it; accept its terms"):
        fetch_model("org/gated", None, options)


def test_an_unknown_repository_or_revision_is_a_404_said_so(hub_env, tmp_path: Path):
    options = FetchOptions(download_dir=tmp_path)
    with pytest.raises(FetchError, match=r"^org/missing: no such repository on http://127.0.0.1:\d+ \(HTTP 404\)"):
        fetch_model("org/missing", None, options)
    hub_env.add("org/rev", _files())
    with pytest.raises(FetchError, match=r"org/rev: no revision 'nope' \(option.revision or HF_REVISION"):
        fetch_model("org/rev", None, FetchOptions(download_dir=tmp_path, revision="nope"))


def test_an_unreachable_hub_fails_after_its_retries_unless_the_revision_is_cached(hub_env, tmp_path: Path, monkeypatch):
    from huggingface_hub import constants

    from tests.server_process import free_port

    hub_env.add("org/cached", _files())
    cached = fetch_model("org/cached", None, FetchOptions(download_dir=tmp_path))
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{free_port()}")
    waits: list[float] = []
    monkeypatch.setattr(hub_module.time, "sleep", waits.append)
    with pytest.raises(FetchError, match=r"org/x: cannot reach http://127.0.0.1:\d+ after 4 attempts .*HF_ENDPOINT"):
        fetch_model("org/x", None, FetchOptions(download_dir=tmp_path))
    assert waits == [1, 2, 4]  # backoff between the attempts
    assert fetch_model("org/cached", None, FetchOptions(download_dir=tmp_path)) == cached


def test_bytes_that_do_not_match_the_sha256_never_get_the_files_name(hub_env, tmp_path: Path, monkeypatch):
    hub_env.add("org/corrupt", _files())
    real = hub_env.repos["org/corrupt"].files["model.safetensors"]
    info = hub_module._model_info

    def served_then_corrupted(ref, revision):  # the listing is right; the bytes that come are not
        listing = info(ref, revision)
        hub_env.repos["org/corrupt"].files["model.safetensors"] = bytes([real[0] ^ 0xFF]) + real[1:]  # one byte flipped
        return listing

    monkeypatch.setattr(hub_module, "_model_info", served_then_corrupted)
    with pytest.raises(
        FetchError, match=r"org/corrupt/model.safetensors: the downloaded bytes do not match the source's sha256"
    ):
        fetch_model("org/corrupt", None, FetchOptions(download_dir=tmp_path))
    blobs = tmp_path / "models--org--corrupt" / "blobs"
    digest = hashlib.sha256(real).hexdigest()
    assert digest not in {p.name for p in blobs.iterdir()}
    # the corrupt file's partial bytes are gone; another file still in flight when the fetch
    # stopped may keep its own, to be resumed
    assert not list(blobs.glob(f"{digest}.part*"))
