"""Video and audio parts: the container checked from the first bytes (MindIE: MP4, AVI, WMV
videos; MP3, WAV, FLAC audio), by data URL and by local file."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path

import pytest

from lmiserve.media import MediaError, MediaPolicy, MediaRef, check_container, load_media

MP4 = b"\x00\x00\x00\x20ftypisom\x00\x00\x02\x00isomiso2mp41" + b"\0" * 64
MOV = b"\x00\x00\x00\x14ftypqt  \x00\x00\x00\x00qt  " + b"\0" * 64
AVI = b"RIFF\x24\x00\x00\x00AVI LIST" + b"\0" * 64
WMV = bytes.fromhex("3026B2758E66CF11A6D900AA0062CE6C") + b"\0" * 64
MP3_TAGGED = b"ID3\x04\x00\x00\x00\x00\x00\x00" + b"\0" * 64
MP3_FRAME = bytes([0xFF, 0xFB, 0x90, 0x64]) + b"\0" * 64  # MPEG-1 layer III, 128 kbit/s, 44.1 kHz
WAV = b"RIFF\x24\x00\x00\x00WAVEfmt " + b"\0" * 64
FLAC = b"fLaC\x00\x00\x00\x22" + b"\0" * 64
ADTS = bytes([0xFF, 0xF1, 0x50, 0x80]) + b"\0" * 64  # AAC, not MP3


@pytest.mark.parametrize(
    ("data", "kind", "name"),
    [
        (MP4, "video", "MP4"),
        (MOV, "video", "MOV"),
        (AVI, "video", "AVI"),
        (WMV, "video", "WMV"),
        (MP3_TAGGED, "audio", "MP3"),
        (MP3_FRAME, "audio", "MP3"),
        (WAV, "audio", "WAV"),
        (FLAC, "audio", "FLAC"),
    ],
)
def test_each_accepted_container_is_named(data, kind, name):
    assert check_container(data, kind, "p") == name


@pytest.mark.parametrize(
    ("data", "kind", "message"),
    [
        (WAV, "video", "v: not an MP4, AVI or WMV video (unknown container)"),
        (b"\x1a\x45\xdf\xa3matroska", "video", "v: not an MP4, AVI or WMV video (unknown container)"),
        (b"", "video", "v: not an MP4, AVI or WMV video (empty)"),
        (AVI, "audio", "v: not an MP3, WAV or FLAC audio file (unknown container)"),
        (ADTS, "audio", "v: not an MP3, WAV or FLAC audio file (unknown container)"),
        (b"OggS\x00\x02", "audio", "v: not an MP3, WAV or FLAC audio file (unknown container)"),
    ],
)
def test_other_bytes_are_refused_naming_what_is_accepted(data, kind, message):
    with pytest.raises(MediaError) as caught:
        check_container(data, kind, "v")
    assert str(caught.value) == message and caught.value.status == 400


def _data_url(kind: str, subtype: str, data: bytes) -> str:
    return f"data:{kind}/{subtype};base64,{base64.b64encode(data).decode()}"


def test_video_and_audio_load_by_data_url_and_local_file(tmp_path: Path):
    policy = MediaPolicy(allowed_local_path=str(tmp_path))
    (tmp_path / "clip.avi").write_bytes(AVI)
    assert asyncio.run(load_media(MediaRef("video", _data_url("video", "mp4", MP4), "v"), policy)) == MP4
    assert asyncio.run(load_media(MediaRef("video", str(tmp_path / "clip.avi"), "v"), policy)) == AVI
    assert asyncio.run(load_media(MediaRef("audio", _data_url("audio", "flac", FLAC), "a"), policy)) == FLAC
    with pytest.raises(MediaError, match=r"^a: not an MP3, WAV or FLAC audio file"):
        asyncio.run(load_media(MediaRef("audio", _data_url("audio", "mpeg", MP4), "a"), policy))


def test_a_data_url_of_another_kind_and_a_video_past_its_limit_are_refused():
    with pytest.raises(MediaError, match=r"^v: data URL type 'image/png' is not video/\*$"):
        asyncio.run(load_media(MediaRef("video", _data_url("image", "png", MP4), "v"), MediaPolicy()))
    with pytest.raises(MediaError, match=r"^v: video larger than 64 bytes$"):
        asyncio.run(load_media(MediaRef("video", _data_url("video", "mp4", MP4), "v"), MediaPolicy(max_video_bytes=64)))


def test_load_media_is_for_video_and_audio_only():
    with pytest.raises(ValueError, match="resolve_media"):
        asyncio.run(load_media(MediaRef("image", "x", "i"), MediaPolicy()))
