"""Media from the server's own files: refused unless option.allowed_local_media_path is set, and
then only inside it, however the path is written."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from lmiserve.media import MediaError, MediaPolicy, MediaRef, load_bytes

WHERE = "messages[0].content[0]"


def _load(source: str, policy: MediaPolicy, kind: str = "image") -> bytes:
    return asyncio.run(load_bytes(MediaRef(kind, source, WHERE), policy))


def _refused(source: str, policy: MediaPolicy) -> str:
    with pytest.raises(MediaError) as caught:
        _load(source, policy)
    assert caught.value.status == 400
    return str(caught.value)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "media").mkdir()
    (tmp_path / "media" / "pic.png").write_bytes(b"inside")
    (tmp_path / "media" / "sub").mkdir()
    (tmp_path / "media" / "sub" / "deep.png").write_bytes(b"deep")
    (tmp_path / "secret.png").write_bytes(b"outside")
    return tmp_path / "media"


def test_a_local_path_is_refused_when_no_directory_is_allowed(root: Path):
    message = _refused(str(root / "pic.png"), MediaPolicy())
    assert message == (
        f"{WHERE}: local file {str(root / 'pic.png')!r} refused: local files are not allowed "
        "(option.allowed_local_media_path)"
    )


def test_a_file_inside_the_allowed_directory_is_read_by_absolute_relative_and_file_url(root: Path):
    policy = MediaPolicy(allowed_local_path=str(root))
    assert _load(str(root / "pic.png"), policy) == b"inside"
    assert _load("sub/deep.png", policy) == b"deep"
    assert _load(f"file://{root}/sub/deep.png", policy) == b"deep"
    assert _load(f"file://localhost{root}/pic.png", policy) == b"inside"
    (root / "with space.png").write_bytes(b"space")
    assert _load(f"file://{root}/with%20space.png", policy) == b"space"


def test_paths_leading_out_of_the_allowed_directory_are_refused(root: Path):
    policy = MediaPolicy(allowed_local_path=str(root))
    (root / "escape.png").symlink_to(root.parent / "secret.png")
    (root / "inner.png").symlink_to(root / "sub" / "deep.png")
    for path in (str(root.parent / "secret.png"), "../secret.png", f"{root}/sub/../../secret.png", "escape.png"):
        assert "refused: outside option.allowed_local_media_path" in _refused(path, policy), path
    assert "refused: outside" in _refused(f"file://{root.parent}/secret.png", policy)
    assert _load("inner.png", policy) == b"deep"  # a link that stays inside is fine


def test_the_allowed_directory_may_itself_be_a_link(root: Path):
    link = root.parent / "media-link"
    link.symlink_to(root)
    assert _load(f"{link}/pic.png", MediaPolicy(allowed_local_path=str(link))) == b"inside"


def test_a_missing_file_a_directory_and_a_fifo_are_refused_without_blocking(root: Path):
    policy = MediaPolicy(allowed_local_path=str(root))
    assert _refused("nope.png", policy) == f"{WHERE}: local file 'nope.png' not found"
    assert _refused("sub", policy) == f"{WHERE}: local file 'sub' is not a regular file"
    os.mkfifo(root / "pipe.png")
    assert _refused("pipe.png", policy) == f"{WHERE}: local file 'pipe.png' is not a regular file"


def test_a_file_past_the_kinds_limit_is_refused(root: Path):
    (root / "big.png").write_bytes(b"\0" * 2048)
    policy = MediaPolicy(allowed_local_path=str(root), max_image_bytes=1024)
    assert _refused("big.png", policy) == f"{WHERE}: image larger than 1 KiB"
    assert _load("big.png", MediaPolicy(allowed_local_path=str(root), max_image_bytes=2048)) == b"\0" * 2048


def test_a_path_with_a_nul_byte_is_refused(root: Path):
    message = _refused("pic.png\0.txt", MediaPolicy(allowed_local_path=str(root)))
    assert message.endswith("refused: not a valid path")


def test_a_file_url_naming_another_machine_is_refused(root: Path):
    message = _refused("file://fileserver/share/pic.png", MediaPolicy(allowed_local_path=str(root)))
    assert "a file URL must name this machine" in message
