import tarfile

import pytest

from lmiserve.deploy.model_data import model_files, package, parse_s3_uri


def test_package_holds_the_files_at_its_root_and_follows_links(tmp_path):
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    (blobs / "abc123").write_bytes(b"weights")
    model = tmp_path / "snapshot"
    (model / "tokenizer").mkdir(parents=True)
    (model / "model.safetensors").symlink_to(blobs / "abc123")
    (model / "tokenizer" / "tokenizer.json").write_text("{}")
    (model / "__pycache__").mkdir()
    (model / "__pycache__" / "x.pyc").write_bytes(b"")
    assert [p.as_posix() for p in model_files(model)] == ["model.safetensors", "tokenizer/tokenizer.json"]
    with tarfile.open(package(model, tmp_path / "model.tar.gz"), "r:gz") as archive:
        member = archive.getmember("model.safetensors")
        assert member.isfile() and archive.extractfile(member).read() == b"weights"
        assert archive.getnames() == ["model.safetensors", "tokenizer/tokenizer.json"]


def test_empty_directory_is_refused(tmp_path):
    with pytest.raises(ValueError, match="holds no files"):
        model_files(tmp_path)


def test_parse_s3_uri():
    assert parse_s3_uri("s3://bucket/a/b/model.tar.gz") == ("bucket", "a/b/model.tar.gz")
    assert parse_s3_uri("s3://bucket/prefix/") == ("bucket", "prefix/")
    for bad in ("https://bucket/key", "s3:///key", "bucket/key"):
        with pytest.raises(ValueError, match="not an S3 URI"):
            parse_s3_uri(bad)
