"""Models fetched from ``s3://`` on a loopback S3: the files, reuse of unchanged ones, and each error."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from lmiserve.model_fetch import FetchError, FetchOptions, fetch_model, transfer
from lmiserve.model_fetch import fetch as fetch_module

WEIGHTS = os.urandom(5 * 1024 * 1024 + 3)


def test_a_prefix_lands_in_the_download_directory_and_unchanged_files_are_not_fetched_again(s3, tmp_path: Path):
    files = {"config.json": b"{}", "model.safetensors": WEIGHTS, "sub/tokenizer.json": b'{"a": 1}', "empty.txt": b""}
    s3.put("models", "llama", files)
    s3.put("models", "llama-v2/x", {"config.json": b"other"})  # a sibling prefix is not taken
    path = fetch_model("s3://models/llama/", None, FetchOptions(download_dir=tmp_path))
    assert path == tmp_path / "s3" / "models" / "llama"
    assert {
        str(p.relative_to(path)): p.read_bytes() for p in path.rglob("*") if p.is_file() and p.name[0] != "."
    } == files
    first = s3.sent_from("models")
    assert first == sum(map(len, files.values()))
    assert fetch_model("s3://models/llama", None, FetchOptions(download_dir=tmp_path)) == path
    assert s3.sent_from("models") == first  # size and ETag unchanged: nothing fetched
    s3.put("models", "llama", {"config.json": b"[]"})  # same size, new ETag
    fetch_model("s3://models/llama", None, FetchOptions(download_dir=tmp_path))
    assert (path / "config.json").read_bytes() == b"[]"
    assert s3.sent_from("models") == first + 2


def test_one_object_named_by_its_key(s3, tmp_path: Path):
    s3.put("files", "gguf", {"m.Q4_0.gguf": b"g" * 1000})
    path = fetch_model("s3://files/gguf/m.Q4_0.gguf", None, FetchOptions(download_dir=tmp_path))
    assert path == tmp_path / "s3" / "files" / "gguf" / "m.Q4_0.gguf" and path.read_bytes() == b"g" * 1000


def test_a_missing_prefix_or_bucket_and_a_denied_bucket_say_so(s3, tmp_path: Path):
    s3.put("models", "here", {"config.json": b"{}"})
    options = FetchOptions(download_dir=tmp_path)
    with pytest.raises(FetchError, match=r"^s3://models/gone/: no objects under this prefix in bucket 'models'"):
        fetch_model("s3://models/gone/", None, options)
    with pytest.raises(FetchError, match=r"^s3://no-such-bucket/m: the bucket 'no-such-bucket' does not exist$"):
        fetch_model("s3://no-such-bucket/m", None, options)
    s3.denied.add("models")
    with pytest.raises(FetchError, match=r"^s3://models/here: access denied \(AccessDenied\): the credentials need"):
        fetch_model("s3://models/here", None, options)


def test_no_credentials_says_what_to_set(s3, tmp_path: Path, monkeypatch):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    with pytest.raises(FetchError, match=r"^s3://models/x: no AWS credentials were found: set AWS_ACCESS_KEY_ID"):
        fetch_model("s3://models/x", None, FetchOptions(download_dir=tmp_path))


def test_an_unreachable_endpoint_fails_after_boto3s_retries(s3, tmp_path: Path, monkeypatch):
    from tests.server_process import free_port

    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")
    monkeypatch.setenv("AWS_RETRY_MODE", "standard")
    with pytest.raises(FetchError, match=r"^s3://models/m: cannot reach S3 after retries \(.*\); check the network"):
        fetch_model("s3://models/m", None, FetchOptions(download_dir=tmp_path))


def test_too_little_disk_stops_before_downloading_and_names_the_directory(s3, tmp_path: Path, monkeypatch):
    s3.put("disk", "m", {"model.safetensors": WEIGHTS})
    monkeypatch.setattr(fetch_module.shutil, "disk_usage", lambda path: _Usage(1000))
    with pytest.raises(FetchError) as error:
        fetch_model("s3://disk/m", None, FetchOptions(download_dir=tmp_path))
    where = tmp_path / "s3" / "disk" / "m"
    assert str(error.value).startswith(
        f"s3://disk/m: not enough disk space in {where}: 5.2 MB ({len(WEIGHTS)} bytes) more are needed and 1.0 KB are free"
    )
    assert s3.sent_from("disk") == 0


def test_a_disk_that_fills_during_the_download_removes_the_partial_files(s3, tmp_path: Path, monkeypatch):
    s3.put("full", "m", {"model.safetensors": WEIGHTS})
    real = os.pwrite
    written = [0]

    def pwrite(fd, data, offset):
        written[0] += len(data)
        if written[0] > 2 * 1024 * 1024:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data, offset)

    monkeypatch.setattr(transfer.os, "pwrite", pwrite)
    with pytest.raises(FetchError, match=r"not enough disk space in .*/s3/full/m: .* the partial files were removed"):
        fetch_model("s3://full/m", None, FetchOptions(download_dir=tmp_path))
    assert [p.name for p in (tmp_path / "s3" / "full" / "m").iterdir()] == [".lmiserve-s3.json"]


class _Usage:
    def __init__(self, free: int) -> None:
        self.free = free
